package etcdlock

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/etcdlock/etcdlock/internal/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A Mutex is a distributed lock, and a sync.Locker. Its key is name/<lease ID
// in hex>, as for concurrency.Mutex and etcdctl lock, which it excludes.
type Mutex struct {
	s    *Session
	name string
	rule *queue.Rule // any older key of the lock blocks ours

	st atomic.Pointer[lockState] // the lock's record, as last looked up
}

// NewMutex returns a handle on the lock called name, on the lease of s.
func NewMutex(s *Session, name string) *Mutex {
	pfx := name + "/"
	return &Mutex{s: s, name: name, rule: queue.Lock(pfx, pfx)}
}

// Name returns the lock's name, as given to NewMutex.
func (m *Mutex) Name() string {
	if m == nil {
		return ""
	}
	return m.name
}

// check returns the error that makes a call on m impossible, if any.
func (m *Mutex) check(ctx context.Context) error {
	if m == nil {
		return validate(false, "", ctx)
	}
	return validate(m.s != nil, m.name, ctx)
}

// Lock takes the lock, blocking until held; it panics where it never can be.
func (m *Mutex) Lock() { lockBlocking("Lock", m.Name(), m.session(), m.LockContext) }

// Unlock ends one hold, as UnlockContext does; it panics if none is held.
func (m *Mutex) Unlock() { unlockOrPanic("Unlock", m.Name(), m.UnlockContext) }

// TryLock takes the lock if no other goroutine or process holds or waits.
func (m *Mutex) TryLock() bool { return tryOnce(m.acquire) }

// LockContext takes the lock, waiting until it is held or ctx ends.
func (m *Mutex) LockContext(ctx context.Context) error {
	_, err := m.acquire(ctx, waitForever)
	return err
}

// TryLockFor takes the lock, waiting at most wait for others.
func (m *Mutex) TryLockFor(ctx context.Context, wait time.Duration) (bool, error) {
	return m.acquire(ctx, max(wait, tryOnly))
}

// acquire takes one hold for the calling goroutine, waiting as wait says:
// waitForever, tryOnly, or at most that long. It returns (false, nil) when
// the wait ran out.
func (m *Mutex) acquire(ctx context.Context, wait time.Duration) (bool, error) {
	if err := m.check(ctx); err != nil {
		return false, err
	}
	tm, err := m.s.begin(ctx, wait)
	if err != nil {
		return false, err
	}
	st, how, w := m.enter(ctx, wait == tryOnly)
	switch how {
	case reentered:
		return true, nil
	case wouldDeadlock:
		return false, ErrWouldDeadlock
	case holdLost:
		return false, errRelockLost
	}
	// Our process's turn first: one key per process, taken by one
	// goroutine at a time.
	turn := func(ctx context.Context) (*keyHold, bool, error) { return st.await(ctx, how, w) }
	t := m.ticket(tm)
	t.turn = st
	_, err = m.s.acquire(ctx, claim{t: t, wait: wait, turn: turn, then: st.passTurn, grant: st.grant})
	if errors.Is(err, errBusy) {
		return false, nil
	}
	return err == nil, err
}

// enter starts an acquisition on the live record of the lock.
func (m *Mutex) enter(ctx context.Context, try bool) (*lockState, entry, *waiter) {
	for {
		st := m.state(true)
		if how, w, ok := st.enter(ctx, try); ok {
			return st, how, w
		}
	}
}

// ticket returns our key in the lock's queue, for a new acquisition with
// the lease of tm: name/<lease ID in hex>.
func (m *Mutex) ticket(tm *leaseTerm) *ticket {
	return m.s.newTicket(tm, m.name, KindMutex, m.rule, mutexKey(m.name, tm.id), m.s.identity)
}

// UnlockContext ends one hold of the calling goroutine (or of ctx's Do scope).
func (m *Mutex) UnlockContext(ctx context.Context) error {
	if err := m.check(ctx); err != nil {
		return err
	}
	st := m.state(false)
	if st == nil {
		return ErrNotHeld
	}
	how, h := st.leave(ctx)
	switch how {
	case notHolder:
		return ErrNotHeld
	case stillHeld, handedOn:
		return nil
	}
	return h.unlock(ctx, st.passTurn)
}

// HoldCount returns the number of holds of the calling goroutine.
func (m *Mutex) HoldCount() int {
	if st := m.lookup(); st != nil {
		return st.holdCount()
	}
	return 0
}

// Held returns the calling goroutine's hold, and false if it holds none.
func (m *Mutex) Held() (Hold, bool) {
	if st := m.lookup(); st != nil {
		if h := st.mine(); h != nil {
			return h.snapshot(m.name), true
		}
	}
	return Hold{}, false
}

// Key returns the key of the Session's hold, or "" (package doc, Holds).
func (m *Mutex) Key() string {
	if h := m.current(); h != nil {
		return h.keyOf(m.name)
	}
	return ""
}

// Token returns the fencing token of the Session's hold, or 0.
func (m *Mutex) Token() int64 {
	if h := m.current(); h != nil {
		return h.token()
	}
	return 0
}

// IsOwner returns a Txn comparison true only while the Session's hold lasts.
func (m *Mutex) IsOwner() clientv3.Cmp {
	if h := m.current(); h != nil {
		return ownerCmp(h.keyOf(m.name), h.token())
	}
	return ownerCmp("", 0)
}

// Done returns the loss signal of the Session's hold (package doc).
func (m *Mutex) Done() <-chan struct{} {
	if h := m.current(); h != nil {
		return h.lost()
	}
	return closedDone
}

// state returns the live record of the handle's lock, creating it if create
// is set; nil if there is none, which means that nothing in this process
// holds or awaits the lock. The handle keeps the last one it found.
func (m *Mutex) state(create bool) *lockState {
	if st := m.st.Load(); st != nil && !st.retired.Load() {
		return st
	}
	st := mutexState(m.s, m.name, create)
	if st != nil {
		m.st.Store(st)
	}
	return st
}

func (m *Mutex) session() *Session {
	if m == nil {
		return nil
	}
	return m.s
}

// lookup returns the lock's record, nil if this process neither holds nor
// awaits the lock.
func (m *Mutex) lookup() *lockState {
	if m == nil || m.s == nil {
		return nil
	}
	return m.state(false)
}

// current returns this process's current hold of the lock, nil if none.
func (m *Mutex) current() *keyHold {
	if st := m.lookup(); st != nil {
		return st.current()
	}
	return nil
}
