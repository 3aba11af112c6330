package etcdlock

import (
	"context"
	"time"
)

// A capped hold (WithMaxHold): the loss monitor (done.go) ends a hold that
// lasts past its cap as if it were lost, then deletes its key.

// capTimer returns a channel that fires when a hold that began at since
// reaches the cap d, and its stop; without a cap (d 0), a nil channel,
// which never fires.
func capTimer(since time.Time, d time.Duration) (<-chan time.Time, func()) {
	if d <= 0 {
		return nil, func() {}
	}
	timer := time.NewTimer(time.Until(since.Add(d)))
	return timer.C, func() { timer.Stop() }
}

// dropCapped deletes the key of t, whose hold reached its cap, fenced on
// its create revision, once the hold's loss signal has closed. ctx is the
// loss monitor's: it ends when the holder's unlock ends the hold (whose
// delete then does the work) or when the lease term ends (which deletes the
// key). A delete etcd does not confirm otherwise is retried in the
// background.
func dropCapped(ctx context.Context, t *ticket) {
	dctx, cancel := context.WithTimeout(ctx, unlockTimeout)
	_, err := t.Delete(dctx)
	cancel()
	if err != nil && ctx.Err() == nil {
		t.releaseLater(err, nil)
	}
}
