package etcdlock

import (
	"context"
	"time"
)

// A capped hold (WithMaxHold): the loss monitor (done.go) ends a hold that
// lasts past its cap as if it were lost, then deletes its key.

// capTimer returns a channel that fires when the hold reaches its cap, and
// its stop; a nil channel, which never fires, without a cap.
func (h *keyHold) capTimer() (<-chan time.Time, func()) {
	d := h.t.s.maxHold
	if d <= 0 {
		return nil, func() {}
	}
	timer := time.NewTimer(time.Until(h.since.Add(d)))
	return timer.C, func() { timer.Stop() }
}

// dropKey deletes the key of a hold that reached its cap, fenced on its
// create revision, once its loss signal has closed. ctx is the monitor's:
// it ends when the holder's unlock ends the hold (whose delete then does
// the work) or the lease term ends (which deletes the key). A delete etcd
// does not confirm otherwise is retried in the background.
func (h *keyHold) dropKey(ctx context.Context) {
	dctx, cancel := context.WithTimeout(ctx, unlockTimeout)
	_, err := h.t.Delete(dctx)
	cancel()
	if err != nil && ctx.Err() == nil {
		h.t.releaseLater(err, nil)
	}
}

// cappedFirst reports whether the hold reached its cap before its end: its
// unlock then returns ErrLockLost even where its own delete found the key.
func (h *keyHold) cappedFirst() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.capped
}
