package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/etcdlock/etcdlock/internal/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A Mutex is a distributed lock on etcd, and a sync.Locker.
//
// The holder is a goroutine. The holding goroutine may lock again, through
// this handle or any other handle with the same Session and name; each lock
// adds one hold and needs one unlock, and only the first lock and the last
// unlock talk to etcd. Every other goroutine, of this process or another,
// waits its turn in FIFO order.
//
// It uses the key scheme of etcd's concurrency.Mutex and etcdctl lock: the
// key name/<lease ID in hex> with the Session's lease (at the acquisition,
// for a Session made WithRenewal), the owner being the
// key with the smallest create revision. A lock taken by any of the three
// excludes the other two, as long as they use different leases.
//
// A Mutex cannot promise mutual exclusion to a resource outside etcd: a
// holder may be paused, or cut off, past its lease's TTL while another
// process takes the lock. Guard such resources with Token or IsOwner.
//
// The zero Mutex is not usable; make one with NewMutex. Its methods are safe
// for use by many goroutines.
type Mutex struct {
	s    *Session
	name string
	rule *queue.Rule // any older key of the lock blocks ours

	st atomic.Pointer[lockState] // the lock's record, as last looked up
}

// NewMutex returns a handle on the lock called name, taken with the lease of
// s. Handles with the same Session and name are the same lock. NewMutex
// writes nothing to etcd and never fails: a nil Session or the empty name
// makes every context method return an error (ErrInvalidArgument,
// ErrInvalidName), TryLock return false, and Lock panic.
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

// Lock takes the lock, blocking until it is held. It retries what can be
// retried (etcd unreachable, a malformed reply) for as long as the Session
// lives (WithRenewal, also across a lost lease: it waits for the next). It
// panics only where the lock can never be taken: a closed Session, or one
// without WithRenewal whose lease is gone, the empty name, a nil Session; or
// where the calling goroutine holds the lock already and that hold is known
// lost (ErrLockLost: unlock it first). It never returns as if it held a
// lost hold. Use LockContext to get those as errors, or to bound the wait.
func (m *Mutex) Lock() { lockBlocking("Lock", m.Name(), m.session(), m.LockContext) }

// Unlock ends one hold of the calling goroutine. Like sync.Mutex.Unlock, it
// panics if the goroutine holds nothing; use UnlockContext to get
// ErrNotHeld instead. Other failures are not reported: the hold ends all the
// same, and the key is deleted in the background or expires with the lease.
func (m *Mutex) Unlock() { unlockOrPanic("Unlock", m.Name(), m.UnlockContext) }

// TryLock takes the lock if it can without waiting for another holder, and
// reports whether it did. It returns false at once when another goroutine or
// process holds the lock, and writes nothing to etcd then. It also returns
// false when it cannot succeed for any other reason (invalid name, closed
// Session, no lease WithRenewal, etcd unreachable); it never panics.
//
// Where etcd does not answer, TryLock gives up after 2 s, and may take up to
// 1 s more to make sure that it left no key: about 3 s in all. For a bound
// of your own, use TryLockFor(ctx, 0) with a deadline on ctx: it returns by
// that deadline + 1 s.
func (m *Mutex) TryLock() bool { return tryOnce(m.acquire) }

// LockContext takes the lock, waiting until it is held or ctx ends. On
// success it returns nil. On failure it returns ctx.Err() if ctx ended,
// ErrSessionExpired if the Session ended (or, WithRenewal, the lease the
// call used is gone), ErrLockLost if the calling goroutine holds the lock
// already but that hold is known lost (its Done closed, or its lease is
// gone: nothing changes, unlock it first), or etcd's error, every time etcd
// refuses (permission denied, say); it then leaves no key of its own in
// etcd, where etcd is reachable, including when ctx ends after etcd applied
// the request but before the reply came back. Where etcd is unreachable,
// the delete is retried in the background until it succeeds or its lease
// ends (whose revoke or expiry deletes the key).
func (m *Mutex) LockContext(ctx context.Context) error {
	_, err := m.acquire(ctx, waitForever)
	return err
}

// TryLockFor takes the lock, waiting at most wait for the holder to leave
// (wait <= 0: only try). The wait counts only the time spent waiting for
// others (another goroutine of this process, then the keys ahead in etcd),
// not etcd's answers, which ctx bounds. It returns (true, nil) when held;
// (false, nil) when the wait ran out, which means that another goroutine or
// process held or waited ahead; (false, err) on failure, with ctx.Err() when ctx ended
// first, and the errors of LockContext. WithRenewal, while no lease is to
// be had it waits for one within wait, and returns ErrSessionExpired if none
// came (at once for a try). While the delete of an earlier key of this
// process (a failed acquisition's, an unlock's) is retried in the
// background because etcd did not confirm it, the lock's turn in this
// process waits for it: a try, or a wait that runs out meanwhile, returns
// an error that says so, since etcd may or may not still have that key. A try that fails because another holder has the lock writes nothing
// to etcd; like LockContext, every call that returns without the lock leaves
// no key of its own behind. Where etcd does not answer, even a try
// (wait <= 0) waits for it until ctx ends: put a deadline on ctx to bound
// it; the call returns by that deadline + 1 s.
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
	turn := func(ctx context.Context) (*hold, bool, error) { return st.await(ctx, how, w) }
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
	return m.s.newTicket(tm, m.name, KindMutex, m.rule, fmt.Sprintf("%s/%x", m.name, tm.id), m.s.identity)
}

// UnlockContext ends one hold of the calling goroutine. It returns
// ErrNotHeld, and changes nothing, if the goroutine holds none. When the
// last hold ends it deletes the lock's key, fenced on the key's create
// revision so that it can never delete a later hold, on a context
// detached from ctx and bounded by 3 s. If etcd does not confirm the
// delete, UnlockContext returns that error and the delete is retried in the
// background until it succeeds or its lease ends (whose revoke or expiry deletes the key). It returns ErrLockLost
// (or ErrSessionExpired) if the key was already gone: the hold ends all the
// same.
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

// HoldCount returns the number of holds of the calling goroutine: 0 when it
// does not hold the lock.
func (m *Mutex) HoldCount() int {
	if st := m.lookup(); st != nil {
		return st.holdCount()
	}
	return 0
}

// Held returns the calling goroutine's hold as one snapshot (name, key,
// token, lease, loss signal), read at one moment, so that it cannot
// straddle a hand-off as four calls to Key, Token, IsOwner and Done can; and
// false when the goroutine holds nothing. A goroutine that holds through a
// Do scope gets its hold from HoldFrom(ctx).
func (m *Mutex) Held() (Hold, bool) {
	if st := m.lookup(); st != nil {
		if h := st.mine(); h != nil {
			return h.snapshot(m.name), true
		}
	}
	return Hold{}, false
}

// Key returns this process's etcd key for the lock while the process holds
// it, whichever goroutine asks, and "" otherwise.
func (m *Mutex) Key() string {
	if h := m.current(); h != nil {
		return h.t.Key()
	}
	return ""
}

// Token returns the fencing token of this process's current hold, whichever
// goroutine asks, and 0 when the process does not hold the lock. The token
// is the create revision of the owner key: it strictly increases from one
// owner to the next, across processes, so a resource that remembers the
// highest token it has seen can reject a stale holder's writes.
func (m *Mutex) Token() int64 {
	if h := m.current(); h != nil {
		return h.token()
	}
	return 0
}

// IsOwner returns a comparison for a clientv3 Txn that is true only while
// this process's current hold is the owner of the lock: a Txn guarded by it
// fails once the hold has ended or been lost, even if this process locks
// again later. When nothing is held it returns a comparison that is always
// false.
func (m *Mutex) IsOwner() clientv3.Cmp {
	if h := m.current(); h != nil {
		return ownerCmp(h.t.Key(), h.token())
	}
	return ownerCmp("", 0)
}

// Done returns a channel that is closed when this process's current hold
// ends or is lost, whichever goroutine asks. It is already closed when
// nothing is held. Each new hold gets a new channel, which stays open through
// re-locks and non-final unlocks and closes on the last unlock.
//
// While the lock is held, the channel closes:
//   - within about 100 ms of our key being deleted, by anyone, or of the
//     lease being revoked (which deletes the key);
//   - two thirds of the TTL after the last keep-alive that etcd
//     acknowledged was sent: a third of the TTL, at least, before etcd can
//     expire the lease, however late its reply came. Keep-alives are sent
//     every TTL/4, so it never closes while etcd answers them within 5/12
//     of the TTL;
//   - when the Session ends.
//
// A closed channel means: stop touching the guarded resource. It does not
// release the lock: call Unlock as usual; a lock by the holding goroutine
// meanwhile returns ErrLockLost. Watching costs one etcd watch and three
// goroutines per hold (the monitor, the watch's reader, and clientv3's),
// started on the first call to Done.
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
func (m *Mutex) current() *hold {
	if st := m.lookup(); st != nil {
		return st.current()
	}
	return nil
}
