package etcdlock

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/etcdlock/etcdlock/internal/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// An RWMutex is a distributed reader/writer lock on etcd: many readers or
// one writer at a time, in FIFO order.
//
// It uses the keys of etcd's recipe RWMutex
// (go.etcd.io/etcd/client/v3/experimental/recipes): name/read/<id> for a
// reader and name/write/<id> for a writer, each with the Session's lease,
// ordered by create revision. A reader waits only for the newest writer
// queued before it; a writer waits for every key queued before it. So a
// reader that arrives after a queued writer waits behind it: writers are
// never starved by a stream of readers. A recipe RWMutex on the same name
// excludes and is excluded as it would be by another recipe RWMutex. An
// RWMutex and a Mutex of the same name are two different locks.
//
// Holds belong to goroutines and are reentrant, as for Mutex: the goroutine
// that holds the write lock may lock again, and may RLock (a local hold, no
// key); a goroutine that holds a read lock may RLock again, but asking for
// the write lock gets ErrWouldDeadlock (there is no upgrade). Every other
// goroutine, of this process or another, queues in etcd with a key of its
// own.
//
// Key, Token, IsOwner and Done describe the calling goroutine's hold: its
// write hold (with the reads it took while writing), or else its read hold;
// never another goroutine's, so a reader's Done does not close, and its
// IsOwner guard does not fail, because another reader unlocked. A goroutine
// that holds nothing gets "", 0, a guard that always fails and a closed
// channel. Readers hold together, so a read hold's token fences writes only
// against later writers.
//
// The zero RWMutex is not usable; make one with NewRWMutex. Its methods are
// safe for use by many goroutines.
type RWMutex struct {
	s      *Session
	name   string
	reader *queue.Rule // older writers block a reader
	writer *queue.Rule // any older key blocks a writer
}

// NewRWMutex returns a handle on the reader/writer lock called name, taken
// with the lease of s. Handles with the same Session and name are the same
// lock. NewRWMutex writes nothing and never fails: a nil Session or the
// empty name makes every context method return an error, the tries return
// false, and Lock and RLock panic.
func NewRWMutex(s *Session, name string) *RWMutex {
	pfx := name + "/"
	readers, writers := pfx+"read/", pfx+"write/"
	return &RWMutex{
		s:      s,
		name:   name,
		reader: queue.Lock(writers, writers),
		writer: queue.Lock(pfx, readers, writers),
	}
}

// Name returns the lock's name, as given to NewRWMutex.
func (rw *RWMutex) Name() string {
	if rw == nil {
		return ""
	}
	return rw.name
}

// Lock takes the write lock, blocking until it is held, retrying what can be
// retried for as long as the Session lives. It panics where the lock can
// never be taken (an ended Session, the empty name, a nil Session) and when
// the goroutine holds a read lock (ErrWouldDeadlock); use LockContext to get
// those as errors.
func (rw *RWMutex) Lock() { lockBlocking("Lock", rw.Name(), rw.session(), rw.LockContext) }

// RLock takes a read lock, blocking until it is held, as Lock does.
func (rw *RWMutex) RLock() { lockBlocking("RLock", rw.Name(), rw.session(), rw.RLockContext) }

// Unlock ends one write hold of the calling goroutine. Like
// sync.RWMutex.Unlock, it panics if the goroutine holds no write lock; use
// UnlockContext to get ErrNotHeld instead.
func (rw *RWMutex) Unlock() { unlockOrPanic("Unlock", rw.Name(), rw.UnlockContext) }

// RUnlock ends one read hold of the calling goroutine, and panics if it
// holds none; use RUnlockContext to get ErrNotHeld instead.
func (rw *RWMutex) RUnlock() { unlockOrPanic("RUnlock", rw.Name(), rw.RUnlockContext) }

// RLocker returns a sync.Locker whose Lock and Unlock are rw's RLock and
// RUnlock.
func (rw *RWMutex) RLocker() sync.Locker { return rlocker{rw} }

type rlocker struct{ rw *RWMutex }

func (r rlocker) Lock()   { r.rw.RLock() }
func (r rlocker) Unlock() { r.rw.RUnlock() }

// TryLock takes the write lock if no other holder or waiter is there, and
// reports whether it did. It writes nothing to etcd when it returns false
// because of another holder, and never panics. Where etcd does not answer,
// it returns false within about 3 s, as Mutex.TryLock does; TryLockFor(ctx,
// 0) with a deadline on ctx gives a bound of your own.
func (rw *RWMutex) TryLock() bool { return rw.tryNow(true) }

// TryRLock takes a read lock if no writer holds or waits, and reports
// whether it did: a reader never passes a queued writer. It writes nothing
// when it returns false because of a writer, and never panics.
func (rw *RWMutex) TryRLock() bool { return rw.tryNow(false) }

func (rw *RWMutex) tryNow(write bool) bool {
	return tryOnce(func(ctx context.Context, wait time.Duration) (bool, error) { return rw.acquire(ctx, write, wait) })
}

// LockContext takes the write lock, waiting until it is held or ctx ends.
// It returns ErrWouldDeadlock, and changes nothing, if the calling goroutine
// holds a read lock. On failure it returns ctx.Err() if ctx ended,
// ErrSessionExpired if the Session ended, or etcd's error, and leaves no key
// of its own in etcd, as Mutex.LockContext does.
func (rw *RWMutex) LockContext(ctx context.Context) error {
	_, err := rw.acquire(ctx, true, waitForever)
	return err
}

// RLockContext takes a read lock, waiting until it is held or ctx ends, as
// LockContext does.
func (rw *RWMutex) RLockContext(ctx context.Context) error {
	_, err := rw.acquire(ctx, false, waitForever)
	return err
}

// TryLockFor takes the write lock, waiting at most wait for the others to
// leave (wait <= 0: only try). It returns (true, nil) when held, (false,
// nil) when the wait ran out while others held or waited ahead, and (false,
// err) on failure, as Mutex.TryLockFor does.
func (rw *RWMutex) TryLockFor(ctx context.Context, wait time.Duration) (bool, error) {
	return rw.acquire(ctx, true, max(wait, tryOnly))
}

// TryRLockFor takes a read lock, waiting at most wait (wait <= 0: only
// try), as TryLockFor does.
func (rw *RWMutex) TryRLockFor(ctx context.Context, wait time.Duration) (bool, error) {
	return rw.acquire(ctx, false, max(wait, tryOnly))
}

// acquire takes one write or read hold for the calling goroutine.
func (rw *RWMutex) acquire(ctx context.Context, write bool, wait time.Duration) (bool, error) {
	if err := rw.check(ctx); err != nil {
		return false, err
	}
	tm, err := rw.s.begin(ctx, wait)
	if err != nil {
		return false, err
	}
	if st := rw.state(false); st != nil {
		if again, err := st.enter(write); again || err != nil {
			return again, err
		}
	}

	kind, r, sub := KindRead, rw.reader, "/read/"
	if write {
		kind, r, sub = KindWrite, rw.writer, "/write/"
	}
	t := rw.s.newTicket(tm, rw.name, kind, r, rw.s.uniqueKey(tm, rw.name+sub), rw.s.identity)
	_, err = rw.s.acquire(ctx, claim{t: t, wait: wait, grant: func(h *hold) { rw.grant(write, h) }})
	if errors.Is(err, errBusy) {
		return false, nil
	}
	return err == nil, err
}

// grant records the calling goroutine's new hold, on the live record.
func (rw *RWMutex) grant(write bool, h *hold) {
	for !rw.state(true).grant(write, h) {
		// Retired as we looked: the next look creates a new record.
	}
}

// UnlockContext ends one write hold of the calling goroutine. It returns
// ErrNotHeld, and changes nothing, if the goroutine holds no write lock.
// When the goroutine's last hold ends it deletes its key, fenced on the
// key's create revision, as Mutex.UnlockContext does, with the same errors.
// If the goroutine still holds reads it took while writing, the key stays
// (and still excludes everyone) until the last of them ends.
func (rw *RWMutex) UnlockContext(ctx context.Context) error { return rw.release(ctx, true) }

// RUnlockContext ends one read hold of the calling goroutine, as
// UnlockContext does for a write hold.
func (rw *RWMutex) RUnlockContext(ctx context.Context) error { return rw.release(ctx, false) }

func (rw *RWMutex) release(ctx context.Context, write bool) error {
	if err := rw.check(ctx); err != nil {
		return err
	}
	st := rw.state(false)
	if st == nil {
		return ErrNotHeld
	}
	how, r := st.leave(write)
	switch how {
	case notHolder:
		return ErrNotHeld
	case stillHeld:
		return nil
	}
	return r.h.unlock(ctx, nil)
}

// HoldCount returns the number of holds of the calling goroutine, write and
// read together: 0 when it holds nothing.
func (rw *RWMutex) HoldCount() int {
	if rw == nil || rw.s == nil {
		return 0
	}
	if st := rw.state(false); st != nil {
		return st.holdCount()
	}
	return 0
}

// Key returns the etcd key of the calling goroutine's hold (name/write/<id>
// or name/read/<id>), and "" when the goroutine holds nothing.
func (rw *RWMutex) Key() string {
	if r := rw.mine(); r != nil {
		return r.h.t.Key()
	}
	return ""
}

// Held returns the calling goroutine's hold (its write hold, else its read
// hold) as one snapshot, read at one moment, and false when it holds
// nothing.
func (rw *RWMutex) Held() (Hold, bool) {
	if r := rw.mine(); r != nil {
		return r.h.snapshot(rw.name), true
	}
	return Hold{}, false
}

// Token returns the fencing token of the calling goroutine's hold (its
// write hold, else its read hold), and 0 when the goroutine holds nothing,
// whatever other goroutines of this process hold. It is the create revision
// of the hold's key.
func (rw *RWMutex) Token() int64 {
	if r := rw.mine(); r != nil {
		return r.h.token()
	}
	return 0
}

// IsOwner returns a comparison for a clientv3 Txn that is true only while
// the calling goroutine's hold (see Token) lasts: another reader's unlock
// does not make it fail. When the goroutine holds nothing it returns a
// comparison that is always false.
func (rw *RWMutex) IsOwner() clientv3.Cmp {
	if r := rw.mine(); r != nil {
		return ownerCmp(r.h.t.Key(), r.h.token())
	}
	return ownerCmp("", 0)
}

// Done returns a channel that is closed when the calling goroutine's hold
// (see Token) ends or is lost, as Mutex.Done does for its hold; another
// reader's unlock does not close it. It is already closed when the
// goroutine holds nothing.
func (rw *RWMutex) Done() <-chan struct{} {
	if r := rw.mine(); r != nil {
		return r.h.lost()
	}
	return closedDone
}

// mine returns the calling goroutine's hold, nil if none.
func (rw *RWMutex) mine() *rwHold {
	if rw == nil || rw.s == nil {
		return nil
	}
	if st := rw.state(false); st != nil {
		return st.mine()
	}
	return nil
}

// state returns the live record of the handle's lock, creating it if create
// is set; nil if there is none: nothing in this process holds the lock.
func (rw *RWMutex) state(create bool) *rwState { return rwMutexState(rw.s, rw.name, create) }

func (rw *RWMutex) check(ctx context.Context) error {
	if rw == nil {
		return validate(false, "", ctx)
	}
	return validate(rw.s != nil, rw.name, ctx)
}

func (rw *RWMutex) session() *Session {
	if rw == nil {
		return nil
	}
	return rw.s
}
