package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/etcdlock/etcdlock/internal/queue"
)

// A MultiMutex is several locks taken together, and a sync.Locker: it holds
// when it holds every one of its names, and takes none of them while it
// waits.
//
// Its keys are its names' Mutex keys (name/<lease ID in hex>), all put by
// one etcd Txn, so that they share one create revision, the token: a Mutex,
// concurrency.Mutex or etcdctl lock on any one of the names excludes it and
// is excluded by it. In each name's queue a key waits only for older keys,
// and the keys of one acquisition are as old as each other: MultiMutexes
// that share names never wait for each other in a cycle, whatever order
// their names were given in, and need no timeout to get out of one. (A
// holder of one lock that waits for another, lock by lock, can still wait
// in a cycle with anyone: what a MultiMutex is for.)
//
// Holds are per goroutine and reentrant, as a Mutex's: the holding goroutine
// may lock again, through this handle or another with the same Session and
// names, and needs one unlock per lock. A goroutine that holds one of the
// names another way (a Mutex, a Do scope, another MultiMutex) gets
// ErrWouldDeadlock, as a holder of the MultiMutex does from a Mutex of one
// of its names: it would hold one lock while it waits for another.
//
// Like a Mutex, it cannot promise mutual exclusion to a resource outside
// etcd on its own: guard such resources with Token, or watch Done.
//
// The zero MultiMutex is not usable; make one with NewMultiMutex. Its
// methods are safe for use by many goroutines.
type MultiMutex struct {
	s     *Session
	names []string      // sorted, distinct
	rules []*queue.Rule // each name's: any older key of the lock blocks ours
	group string        // the names, joined: the mark of its holds in their records
}

// NewMultiMutex returns a handle on the locks called names, taken together
// with the lease of s. Names may come in any order, and more than once;
// handles with the same Session and the same names are the same lock.
// NewMultiMutex writes nothing to etcd and never fails: a nil Session or no
// names make every context method return ErrInvalidArgument, and an empty
// name ErrInvalidName; TryLock then returns false, and Lock panics.
func NewMultiMutex(s *Session, names ...string) *MultiMutex {
	names = slices.Compact(slices.Sorted(slices.Values(names)))
	m := &MultiMutex{s: s, names: names, group: strings.Join(names, "\x00")}
	for _, name := range names {
		pfx := name + "/"
		m.rules = append(m.rules, queue.Lock(pfx, pfx))
	}
	return m
}

// Names returns the locks' names, sorted, each once.
func (m *MultiMutex) Names() []string {
	if m == nil {
		return nil
	}
	return slices.Clone(m.names)
}

// label names the locks in errors and panics.
func (m *MultiMutex) label() string {
	if m == nil {
		return ""
	}
	return strings.Join(m.names, ",")
}

// check returns the error that makes a call on m impossible, if any.
func (m *MultiMutex) check(ctx context.Context) error {
	switch {
	case m == nil || m.s == nil:
		return validate(false, "", ctx)
	case len(m.names) == 0:
		if err := validate(true, "-", ctx); err != nil {
			return err
		}
		return fmt.Errorf("%w: no lock names", ErrInvalidArgument)
	}
	// Sorted: the empty name, if given, comes first.
	return validate(true, m.names[0], ctx)
}

func (m *MultiMutex) session() *Session {
	if m == nil {
		return nil
	}
	return m.s
}

// LockContext takes every lock, waiting until all are held or ctx ends. On
// success it returns nil. On failure it returns ctx.Err() if ctx ended,
// ErrSessionExpired if the Session ended, ErrWouldDeadlock if the calling
// goroutine holds one of the names another way, or etcd's error; it then
// leaves no key of its own in any of the queues, where etcd is reachable,
// including when ctx ends after etcd applied the request but before the
// reply came back. Where etcd is unreachable, the delete is retried in the
// background until it succeeds or its lease ends (whose revoke or expiry deletes the key).
func (m *MultiMutex) LockContext(ctx context.Context) error {
	_, err := m.acquire(ctx, waitForever)
	return err
}

// TryLockFor takes every lock, waiting at most wait for the holders to leave
// (wait <= 0: only try), counted as Mutex.TryLockFor counts it. It returns
// (true, nil) when all are held; (false, nil) when the wait ran out while
// others held or waited ahead; (false, err) on failure, as LockContext. A try
// that fails because a name is held writes nothing to etcd; every call that
// returns without the locks leaves no key of its own behind.
func (m *MultiMutex) TryLockFor(ctx context.Context, wait time.Duration) (bool, error) {
	return m.acquire(ctx, max(wait, tryOnly))
}

// TryLock takes every lock if it can without waiting for another holder, and
// reports whether it did. It returns false at once when another goroutine or
// process holds (or waits for) any of the names, and writes nothing to etcd
// then. It also returns false when it cannot succeed for any other reason
// (etcd unreachable for 2 s, bad input, closed Session); it never panics.
func (m *MultiMutex) TryLock() bool { return tryOnce(m.acquire) }

// Lock takes every lock, blocking until all are held. It retries what can
// be retried (etcd unreachable, a malformed reply) for as long as the
// Session lives. It panics only where the locks can never be taken: an
// expired or closed Session, bad input, or a goroutine that holds one of
// the names another way. Use LockContext to get those as errors, or to
// bound the wait.
func (m *MultiMutex) Lock() { lockBlocking("Lock", m.label(), m.session(), m.LockContext) }

// Unlock ends one hold of the calling goroutine. Like sync.Mutex.Unlock, it
// panics if the goroutine holds nothing; use UnlockContext to get
// ErrNotHeld instead. Other failures are not reported: the hold ends all
// the same, and the keys are deleted in the background or expire with the
// lease.
func (m *MultiMutex) Unlock() { unlockOrPanic("Unlock", m.label(), m.UnlockContext) }

// acquire takes one hold for the calling goroutine, waiting as wait says:
// waitForever, tryOnly, or at most that long. It returns (false, nil) when
// the wait ran out.
func (m *MultiMutex) acquire(ctx context.Context, wait time.Duration) (bool, error) {
	if err := m.check(ctx); err != nil {
		return false, err
	}
	tm, err := m.s.begin(ctx, wait)
	if err != nil {
		return false, err
	}
	switch groupEntry(ctx, m.s, m.names, m.group) {
	case reentered:
		return true, nil
	case wouldDeadlock:
		return false, ErrWouldDeadlock
	case holdLost:
		return false, errRelockLost
	}
	// This process's turn of each name first, in the order of the names
	// (reentrant.go): each name has one key per process.
	var turns []*lockState
	pass := func() {
		for _, st := range turns {
			st.passTurn()
		}
	}
	turn := func(ctx context.Context) (*hold, bool, error) {
		contended := false
		for _, name := range m.names {
			st, waited, err := groupTurn(ctx, m.s, name, wait == tryOnly)
			contended = contended || waited
			if err != nil {
				pass()
				return nil, contended, err
			}
			turns = append(turns, st)
		}
		return nil, contended, nil
	}
	grant := func(h *hold) {
		for _, st := range turns {
			st.grantGroup(m.group, h)
		}
	}
	t := m.s.newGroupTicket(tm, m.names, m.rules)
	t.turn = groupKeeper{&turns}
	_, err = m.s.acquire(ctx, claim{t: t, wait: wait, turn: turn, then: pass, grant: grant})
	if errors.Is(err, errBusy) {
		return false, nil
	}
	return err == nil, err
}

// UnlockContext ends one hold of the calling goroutine. It returns
// ErrNotHeld, and changes nothing, if the goroutine holds none. When the
// last hold ends it deletes every key in one Txn, fenced on their create
// revision so that it can never delete a later hold, on a context
// detached from ctx and bounded by 3 s. If etcd does not confirm the
// delete, UnlockContext returns that error and the delete is retried in the
// background until it succeeds or its lease ends (whose revoke or expiry deletes the key). It returns ErrLockLost
// (or ErrSessionExpired) if a key was already gone, after it deleted the
// others: the hold ends all the same.
func (m *MultiMutex) UnlockContext(ctx context.Context) error {
	if err := m.check(ctx); err != nil {
		return err
	}
	sts := make([]*lockState, len(m.names))
	for i, name := range m.names {
		if sts[i] = mutexState(m.s, name, false); sts[i] == nil {
			return ErrNotHeld
		}
	}
	how, h := sts[0].leaveGroup(m.group)
	if how == notHolder {
		return ErrNotHeld
	}
	for _, st := range sts[1:] {
		st.leaveGroup(m.group)
	}
	if how == stillHeld {
		return nil
	}
	h.end()
	return h.unlock(ctx, func() {
		for _, st := range sts {
			st.passTurn()
		}
	})
}

// Held returns the calling goroutine's hold, as one snapshot: Name is the
// names joined by commas, Keys gives a key per name, all at the one Token.
// It returns false when the goroutine holds nothing.
func (m *MultiMutex) Held() (Hold, bool) {
	if h := m.current(true); h != nil {
		return h.snapshot(m.label()), true
	}
	return Hold{}, false
}

// Token returns the fencing token of this process's current hold, whichever
// goroutine asks (as a Mutex's): the create revision that every key of the
// hold shares, the token each name's Mutex would report; 0 when nothing is
// held. It strictly increases from one holder of a name to the next, across
// processes.
func (m *MultiMutex) Token() int64 {
	if h := m.current(false); h != nil {
		return h.token()
	}
	return 0
}

// Done returns a channel that is closed when this process's current hold
// ends or is lost, whichever goroutine asks: when any of its keys is deleted
// (by anyone) or the lease is lost, as Mutex.Done describes. It is already
// closed when nothing is held. Each new hold gets a new channel, which stays
// open through re-locks and non-final unlocks; a lock by the holding
// goroutine once it closed returns ErrLockLost. Watching costs one etcd
// watch per name and 1 + 2 × names goroutines per hold, started on the
// first call.
func (m *MultiMutex) Done() <-chan struct{} {
	if h := m.current(false); h != nil {
		return h.lost()
	}
	return closedDone
}

// current returns this process's current hold of the names (with mine,
// only the calling goroutine's), nil if none.
func (m *MultiMutex) current(mine bool) *hold {
	if m == nil || m.s == nil || len(m.names) == 0 {
		return nil
	}
	if st := mutexState(m.s, m.names[0], false); st != nil {
		return st.groupHold(m.group, mine)
	}
	return nil
}
