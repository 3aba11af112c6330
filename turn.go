package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// The local turn of a Mutex name: which goroutine of this process may use
// etcd for the lock, the FIFO queue of the others, and the hand-off of a
// hold between them (WithLocalHandoff).

// turn is the right to use etcd for a Mutex name in this process: one
// goroutine at a time has it, the others wait in FIFO order. Guarded by its
// record's mu.
type turn struct {
	busy     bool      // the turn is taken: by the holder, an acquirer, or a cleanup
	cleaning error     // the turn waits for a delete retried in the background: why it was not confirmed; nil otherwise
	queue    []*waiter // local goroutines waiting for the turn, oldest first
	handoffs int       // local hand-offs in a row since the key was put
}

// A waiter is a goroutine in the local queue of a turn.
type waiter struct {
	ready   chan struct{} // closed when the turn is handed to this waiter
	granted bool          // the turn is this waiter's
	handed  *hold         // the hold itself came with the turn (a local hand-off)
	group   bool          // a MultiMutex waits: the turn, never a Mutex's hold
}

// takeTurn takes the turn if it is free, else a place in the local queue
// (none for a try); a group's waiter is never handed a Mutex's hold. st.mu
// must be held.
func (st *lockState) takeTurn(try, group bool) (entry, *waiter) {
	switch {
	case !st.busy:
		st.busy = true
		return gotTurn, nil
	case try && st.cleaning != nil:
		return turnCleaning, nil
	case try:
		return turnBusy, nil
	}
	w := &waiter{ready: make(chan struct{}), group: group}
	st.queue = append(st.queue, w)
	return queued, w
}

// await ends an entry that takes the turn: errBusy for a try that found it
// taken, errCleaning for one that found it waiting for a delete, the wait of
// a queued goroutine (and the hold, if one came with the turn), else
// nothing; waited says whether it waited.
func (st *lockState) await(ctx context.Context, how entry, w *waiter) (h *hold, waited bool, err error) {
	switch how {
	case turnBusy:
		return nil, true, errBusy
	case turnCleaning:
		return nil, true, st.cleaningErr()
	case queued:
		h, err := st.awaitTurn(ctx, w)
		return h, true, err
	}
	return nil, false, nil
}

// awaitTurn waits until w has the turn: the right to use etcd for this lock.
// If the hold itself came with it (WithLocalHandoff), it returns that hold,
// which counts as taken even if ctx ended at the same moment. It returns
// errBusy if ctx ends first (another goroutine held or waited ahead),
// leaving the queue as it was; or errCleaning if the turn was then waiting
// for the delete of an earlier key of this process: nobody else held or
// waited.
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
		cleaning := st.cleaning != nil && len(st.queue) == 0 && st.owner == 0
		st.mu.Unlock()
		if cleaning {
			return nil, st.cleaningErr()
		}
	}
	return nil, errBusy
}

// retrying records that the turn waits for a delete retried in the
// background, which err left unconfirmed.
func (st *lockState) retrying(err error) {
	if err == nil {
		err = errors.New("not confirmed")
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.cleaning = err
}

// cleaningErr returns the error of a call that found the turn waiting for
// a delete: etcd may or may not still have the earlier key.
func (st *lockState) cleaningErr() error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.cleaning == nil {
		return errBusy // the delete ended meanwhile; the turn went on
	}
	return fmt.Errorf("%w: %v", errCleaning, st.cleaning)
}

// handOff passes the hold, with its etcd key and token, to the oldest local
// waiter, if WithLocalHandoff allows one more in a row and the hold is not
// known lost. It is called with st.mu held, after h.end.
func (st *lockState) handOff(h *hold) bool {
	if len(st.queue) == 0 || st.queue[0].group || st.handoffs >= st.s.maxHandoffs || h.knownLost() {
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
	st.cleaning = nil
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

	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.busy && len(st.queue) == 0 && !st.retired.Load() && st.s.records.CompareAndDelete(mutexName(st.name), st) {
		st.retired.Store(true)
	}
}
