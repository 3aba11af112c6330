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

// A MultiMutex holds all of its names, or none, and is a sync.Locker. Its
// keys are its names' Mutex keys, put by one Txn (one token): it excludes a
// Mutex of each name. MultiMutexes never wait for each other in a cycle,
// whatever their names' order. A name held another way: ErrWouldDeadlock.
type MultiMutex struct {
	s     *Session
	names []string      // sorted, distinct
	rules []*queue.Rule // each name's: any older key of the lock blocks ours
	group string        // the names, joined: the mark of its holds in their records
}

// NewMultiMutex returns a handle on the locks called names, in any order.
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

// LockContext takes every lock, as Mutex.LockContext does.
func (m *MultiMutex) LockContext(ctx context.Context) error {
	_, err := m.acquire(ctx, waitForever)
	return err
}

// TryLockFor takes every lock, as Mutex.TryLockFor does.
func (m *MultiMutex) TryLockFor(ctx context.Context, wait time.Duration) (bool, error) {
	return m.acquire(ctx, max(wait, tryOnly))
}

// TryLock takes every lock if nobody holds or waits for any of the names.
func (m *MultiMutex) TryLock() bool { return tryOnce(m.acquire) }

// Lock takes every lock, as Mutex.Lock does.
func (m *MultiMutex) Lock() { lockBlocking("Lock", m.label(), m.session(), m.LockContext) }

// Unlock ends one hold of the calling goroutine, as Mutex.Unlock does.
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
	turn := func(ctx context.Context) (*keyHold, bool, error) {
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
	grant := func(h *keyHold) {
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

// UnlockContext ends one hold; the last deletes every key in one Txn, and
// returns ErrLockLost, having deleted the others, if one was gone.
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

// Held returns the calling goroutine's hold, and false if it holds none.
func (m *MultiMutex) Held() (Hold, bool) {
	if h := m.current(true); h != nil {
		return h.snapshot(m.label()), true
	}
	return Hold{}, false
}

// Token returns the token of the Session's hold (every key's), or 0.
func (m *MultiMutex) Token() int64 {
	if h := m.current(false); h != nil {
		return h.token()
	}
	return 0
}

// Done returns the Session's hold's loss signal: any of its keys lost.
func (m *MultiMutex) Done() <-chan struct{} {
	if h := m.current(false); h != nil {
		return h.lost()
	}
	return closedDone
}

// current returns this process's current hold of the names (with mine,
// only the calling goroutine's), nil if none.
func (m *MultiMutex) current(mine bool) *keyHold {
	if m == nil || m.s == nil || len(m.names) == 0 {
		return nil
	}
	if st := mutexState(m.s, m.names[0], false); st != nil {
		return st.groupHold(m.group, mine)
	}
	return nil
}
