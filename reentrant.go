package etcdlock

import (
	"context"
	"slices"
	"sync"
)

// lockState is what this process knows of one lock name on one Session. All
// Mutex handles of that name and Session share it, so that they are one lock:
// one holder goroutine with a hold count, and a FIFO queue of the local
// goroutines waiting for their turn. Only the goroutine whose turn it is
// takes part in etcd's queue, so N goroutines cost etcd one key, not N.
//
// A record lives in Session.locks while anything uses it. Once idle it is
// retired and removed; handles that still point to it fetch a new one.
type lockState struct {
	s    *Session
	name string

	mu       sync.Mutex
	retired  bool
	busy     bool      // the turn is taken: by the holder, an acquirer, or a cleanup
	queue    []*waiter // local goroutines waiting for the turn, oldest first
	owner    int64     // goroutine id of the holder; 0 when not held
	holds    int       // the holder's hold count
	rev      int64     // create revision of our key while held: the fencing token
	hold     *hold     // the current hold's loss signal; nil when not held
	handoffs int       // local hand-offs in a row since the key was put
}

type waiter struct {
	ready   chan struct{} // closed when the turn is handed to this waiter
	granted bool
	held    bool // the turn came with the hold (a local hand-off)
}

// record returns the handle's lock record, creating it if needed, with its
// mu held.
func (m *Mutex) record() *lockState {
	for {
		if st := m.st.Load(); st != nil {
			st.mu.Lock()
			if !st.retired {
				return st
			}
			st.mu.Unlock()
		}
		m.s.mu.Lock()
		st := m.s.locks[m.name]
		if st == nil {
			st = &lockState{s: m.s, name: m.name}
			m.s.locks[m.name] = st
		}
		m.s.mu.Unlock()
		m.st.Store(st)
	}
}

// peek returns the handle's lock record with its mu held, or nil if the lock
// has none, which means nothing in this process holds or awaits it.
func (m *Mutex) peek() *lockState {
	if m == nil || m.s == nil {
		return nil
	}
	if st := m.st.Load(); st != nil {
		st.mu.Lock()
		if !st.retired {
			return st
		}
		st.mu.Unlock()
	}
	m.s.mu.Lock()
	st := m.s.locks[m.name]
	m.s.mu.Unlock()
	if st == nil {
		return nil
	}
	m.st.Store(st)
	st.mu.Lock()
	if st.retired {
		st.mu.Unlock()
		return nil
	}
	return st
}

// waitTurn is called with st.mu held and returns with it released. It
// returns nil once the calling goroutine has the turn: the right to use
// etcd for this lock. held reports that the turn came with the lock itself,
// handed off by the previous local holder (WithLocalHandoff), which counts
// as taken even if ctx ended at the same moment. It returns ctx.Err() if ctx
// ends first, leaving the queue as it was.
func (st *lockState) waitTurn(ctx context.Context) (held bool, err error) {
	if !st.busy {
		st.busy = true
		st.mu.Unlock()
		return false, nil
	}
	w := &waiter{ready: make(chan struct{})}
	st.queue = append(st.queue, w)
	st.mu.Unlock()

	select {
	case <-w.ready:
		return w.held, nil
	case <-ctx.Done():
	}
	st.mu.Lock()
	switch {
	case w.held:
		st.mu.Unlock()
		return true, nil
	case w.granted:
		// The turn arrived as ctx ended: hand it on.
		st.mu.Unlock()
		st.passTurn()
	default:
		st.queue = slices.DeleteFunc(st.queue, func(q *waiter) bool { return q == w })
		st.mu.Unlock()
	}
	return false, ctx.Err()
}

// handOff passes the hold itself, with its etcd key and token, to the oldest
// local waiter, if WithLocalHandoff allows one more in a row. It is called
// with st.mu held, by the goroutine ending the last hold.
func (st *lockState) handOff() bool {
	if len(st.queue) == 0 || st.handoffs >= st.s.maxHandoffs || st.s.expired() {
		st.handoffs = 0
		return false
	}
	st.handoffs++
	w := st.queue[0]
	st.queue = st.queue[1:]
	w.granted, w.held = true, true
	close(w.ready)
	return true
}

// passTurn hands the turn to the oldest local waiter, or frees it.
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
	st.s.retire(st)
}

// retire removes st from the Session if nothing uses it.
func (s *Session) retire(st *lockState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.busy && len(st.queue) == 0 && s.locks[st.name] == st {
		st.retired = true
		delete(s.locks, st.name)
	}
}
