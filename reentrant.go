package etcdlock

import (
	"context"
	"slices"
	"sync"

	"github.com/petermattis/goid"
)

// lockState is what this process knows of one Mutex name on one Session. All
// Mutex handles of that name and Session share it, so that they are one lock:
// one holder goroutine with a hold count, and a FIFO queue of the local
// goroutines waiting for their turn. Only the goroutine whose turn it is
// takes part in etcd's queue, so N goroutines cost etcd one key, not N.
//
// This file is the only one that reads or writes a lockState's fields. A
// record lives in Session.locks while anything uses it; once idle it is
// retired and removed, and handles that still point to it fetch a new one.
type lockState struct {
	s    *Session
	name string

	mu       sync.Mutex
	retired  bool
	busy     bool      // the turn is taken: by the holder, an acquirer, or a cleanup
	queue    []*waiter // local goroutines waiting for the turn, oldest first
	owner    int64     // goroutine id of the holder; 0 when not held
	holds    int       // how many holds the owner has
	hold     *hold     // the current hold: its token and loss signal; nil when not held
	handoffs int       // local hand-offs in a row since the key was put
}

type waiter struct {
	ready   chan struct{} // closed when the turn is handed to this waiter
	granted bool
	handed  *hold // the hold itself came with the turn (a local hand-off)
}

// An entry is how an acquisition starts in this process.
type entry int

const (
	reentered entry = iota // the goroutine held the lock: one more hold
	gotTurn                // the turn was free: it is the goroutine's now
	queued                 // the goroutine waits for the turn
	turnBusy               // a try: the turn is taken
)

// state returns the live record of the handle's lock, creating it if create
// is set; nil if there is none, which means that nothing in this process
// holds or awaits the lock.
func (m *Mutex) state(create bool) *lockState {
	if st := m.st.Load(); st != nil && !st.isRetired() {
		return st
	}
	m.s.mu.Lock()
	st := m.s.locks[m.name]
	if st == nil && create {
		st = &lockState{s: m.s, name: m.name}
		m.s.locks[m.name] = st
	}
	m.s.mu.Unlock()
	if st != nil {
		m.st.Store(st)
	}
	return st
}

func (st *lockState) isRetired() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.retired
}

// enter starts an acquisition by the calling goroutine: a re-lock if it holds
// the lock, else the turn if it is free, else a place in the local queue
// (none for a try). It returns false if the record was retired meanwhile:
// fetch the live one and enter again.
func (st *lockState) enter(try bool) (entry, *waiter, bool) {
	gid := goid.Get()
	st.mu.Lock()
	defer st.mu.Unlock()
	switch {
	case st.retired:
		return 0, nil, false
	case st.owner == gid:
		st.holds++
		return reentered, nil, true
	case !st.busy:
		st.busy = true
		return gotTurn, nil, true
	case try:
		return turnBusy, nil, true
	}
	w := &waiter{ready: make(chan struct{})}
	st.queue = append(st.queue, w)
	return queued, w, true
}

// awaitTurn waits until w has the turn: the right to use etcd for this lock.
// If the hold itself came with it (WithLocalHandoff), it returns that hold,
// which counts as taken even if ctx ended at the same moment. It returns
// ctx.Err() if ctx ends first, leaving the queue as it was.
func (st *lockState) awaitTurn(ctx context.Context, w *waiter) (*hold, error) {
	select {
	case <-w.ready:
		return w.handed, nil
	case <-ctx.Done():
	}
	st.mu.Lock()
	switch {
	case w.handed != nil:
		st.mu.Unlock()
		return w.handed, nil
	case w.granted:
		// The turn arrived as ctx ended: hand it on.
		st.mu.Unlock()
		st.passTurn()
	default:
		st.queue = slices.DeleteFunc(st.queue, func(q *waiter) bool { return q == w })
		st.mu.Unlock()
	}
	return nil, ctx.Err()
}

// grant makes the calling goroutine, which has the turn, the holder of h.
func (st *lockState) grant(h *hold) {
	gid := goid.Get()
	st.mu.Lock()
	defer st.mu.Unlock()
	st.owner, st.holds, st.hold = gid, 1, h
}

// A departure is what ending one hold left to do.
type departure int

const (
	notHolder   departure = iota // the goroutine held nothing: ErrNotHeld
	stillHeld                    // holds remain
	handedOn                     // the last hold went to a local waiter, key and all
	mustRelease                  // the last hold ended: delete the key, then pass the turn
)

// leave ends one hold of the calling goroutine. When it ends the last one,
// the loss signal closes and, unless the hold is handed to a local waiter
// (WithLocalHandoff), it returns the ended hold, whose key the caller must
// delete before it passes the turn on.
func (st *lockState) leave() (departure, *hold) {
	gid := goid.Get()
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.retired || st.owner != gid {
		return notHolder, nil
	}
	st.holds--
	if st.holds > 0 {
		return stillHeld, nil
	}
	h := st.hold
	st.owner, st.hold = 0, nil
	h.end()
	if st.handOff(h) {
		return handedOn, nil
	}
	return mustRelease, h
}

// handOff passes the hold, with its etcd key and token, to the oldest local
// waiter, if WithLocalHandoff allows one more in a row. It is called with
// st.mu held.
func (st *lockState) handOff(h *hold) bool {
	if len(st.queue) == 0 || st.handoffs >= st.s.maxHandoffs || st.s.expired() {
		st.handoffs = 0
		return false
	}
	st.handoffs++
	w := st.queue[0]
	st.queue = st.queue[1:]
	w.granted, w.handed = true, h.again()
	close(w.ready)
	return true
}

// passTurn hands the turn to the oldest local waiter, or frees it and
// retires the record if nothing else uses it.
func (st *lockState) passTurn() {
	st.mu.Lock()
	if len(st.queue) > 0 {
		w := st.queue[0]
		st.queue = st.queue[1:]
		w.granted = true
		close(w.ready)
		st.mu.Unlock()
		return
	}
	st.busy = false
	st.mu.Unlock()

	s := st.s
	s.mu.Lock()
	defer s.mu.Unlock()
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.busy && len(st.queue) == 0 && s.locks[st.name] == st {
		st.retired = true
		delete(s.locks, st.name)
	}
}

// holdCount returns the calling goroutine's holds.
func (st *lockState) holdCount() int {
	gid := goid.Get()
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.owner != gid {
		return 0
	}
	return st.holds
}

// current returns the process's current hold, nil if none.
func (st *lockState) current() *hold {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.hold
}

// waiting returns how many local goroutines wait for the turn.
func (st *lockState) waiting() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.queue)
}
