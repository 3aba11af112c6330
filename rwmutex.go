package etcdlock

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/etcdlock/etcdlock/internal/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// An RWMutex is many readers or one writer; later readers never starve a
// writer. It excludes etcd's recipe RWMutex (same keys), not a Mutex. A writer
// may lock again and RLock; a reader may RLock again, not Lock
// (ErrWouldDeadlock). Readers' tokens fence only against later writers.
type RWMutex struct {
	s      *Session
	name   string
	reader *queue.Rule // older writers block a reader
	writer *queue.Rule // any older key blocks a writer
}

// NewRWMutex returns a handle on the lock called name, as NewMutex does.
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

// Lock takes the write lock, as Mutex.Lock does.
func (rw *RWMutex) Lock() { lockBlocking("Lock", rw.Name(), rw.session(), rw.LockContext) }

// RLock takes a read lock, as Mutex.Lock does.
func (rw *RWMutex) RLock() { lockBlocking("RLock", rw.Name(), rw.session(), rw.RLockContext) }

// Unlock ends one write hold of the calling goroutine, as Mutex.Unlock does.
func (rw *RWMutex) Unlock() { unlockOrPanic("Unlock", rw.Name(), rw.UnlockContext) }

// RUnlock ends one read hold of the calling goroutine, as Mutex.Unlock does.
func (rw *RWMutex) RUnlock() { unlockOrPanic("RUnlock", rw.Name(), rw.RUnlockContext) }

// RLocker returns a sync.Locker of rw's RLock and RUnlock.
func (rw *RWMutex) RLocker() sync.Locker { return rlocker{rw} }

type rlocker struct{ rw *RWMutex }

func (r rlocker) Lock()   { r.rw.RLock() }
func (r rlocker) Unlock() { r.rw.RUnlock() }

// TryLock takes the write lock if nobody holds or waits, as Mutex.TryLock.
func (rw *RWMutex) TryLock() bool { return rw.tryNow(true) }

// TryRLock takes a read lock if no writer holds or waits, as Mutex.TryLock.
func (rw *RWMutex) TryRLock() bool { return rw.tryNow(false) }

func (rw *RWMutex) tryNow(write bool) bool {
	return tryOnce(func(ctx context.Context, wait time.Duration) (bool, error) { return rw.acquire(ctx, write, wait) })
}

// LockContext takes the write lock, as Mutex.LockContext does.
func (rw *RWMutex) LockContext(ctx context.Context) error {
	_, err := rw.acquire(ctx, true, waitForever)
	return err
}

// RLockContext takes a read lock, as Mutex.LockContext does.
func (rw *RWMutex) RLockContext(ctx context.Context) error {
	_, err := rw.acquire(ctx, false, waitForever)
	return err
}

// TryLockFor takes the write lock, as Mutex.TryLockFor does.
func (rw *RWMutex) TryLockFor(ctx context.Context, wait time.Duration) (bool, error) {
	return rw.acquire(ctx, true, max(wait, tryOnly))
}

// TryRLockFor takes a read lock, as Mutex.TryLockFor does.
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
	_, err = rw.s.acquire(ctx, claim{t: t, wait: wait, grant: func(h *keyHold) { rw.grant(write, h) }})
	if errors.Is(err, errBusy) {
		return false, nil
	}
	return err == nil, err
}

// grant records the calling goroutine's new hold, on the live record.
func (rw *RWMutex) grant(write bool, h *keyHold) {
	for !rw.state(true).grant(write, h) {
		// Retired as we looked: the next look creates a new record.
	}
}

// UnlockContext ends one write hold; reads taken while writing keep the key.
func (rw *RWMutex) UnlockContext(ctx context.Context) error { return rw.release(ctx, true) }

// RUnlockContext ends one read hold, as Mutex.UnlockContext does.
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

// HoldCount returns the calling goroutine's holds, write and read together.
func (rw *RWMutex) HoldCount() int {
	if rw == nil || rw.s == nil {
		return 0
	}
	if st := rw.state(false); st != nil {
		return st.holdCount()
	}
	return 0
}

// Key returns the key of the calling goroutine's hold, or "".
func (rw *RWMutex) Key() string {
	if r := rw.mine(); r != nil {
		return r.h.t.Key()
	}
	return ""
}

// Held returns the calling goroutine's hold, and false if it holds none.
func (rw *RWMutex) Held() (Hold, bool) {
	if r := rw.mine(); r != nil {
		return r.h.snapshot(rw.name), true
	}
	return Hold{}, false
}

// Token returns the fencing token of the calling goroutine's hold, or 0.
func (rw *RWMutex) Token() int64 {
	if r := rw.mine(); r != nil {
		return r.h.token()
	}
	return 0
}

// IsOwner returns a Txn comparison true only while the goroutine's hold lasts.
func (rw *RWMutex) IsOwner() clientv3.Cmp {
	if r := rw.mine(); r != nil {
		return ownerCmp(r.h.t.Key(), r.h.token())
	}
	return ownerCmp("", 0)
}

// Done returns the loss signal of the calling goroutine's hold.
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
