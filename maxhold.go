package etcdlock

import (
	"context"
	"fmt"
	"time"
)

// A capped hold (WithMaxHold, CapHold): the loss watch (losswatch.go) ends a
// hold that lasts past its cap as if it were lost, then deletes its key.

// holdCapKey is the context key of CapHold's cap.
type holdCapKey struct{}

// CapHold returns a copy of ctx under which a lock call caps its hold at d,
// as WithMaxHold; d <= 0 or a nil ctx: ErrInvalidArgument, wrapped, ctx as is.
func CapHold(ctx context.Context, d time.Duration) (context.Context, error) {
	switch {
	case ctx == nil:
		return ctx, fmt.Errorf("%w: CapHold: nil context", ErrInvalidArgument)
	case d <= 0:
		return ctx, fmt.Errorf("%w: CapHold: the cap must be positive, got %v", ErrInvalidArgument, d)
	}
	return context.WithValue(ctx, holdCapKey{}, d), nil
}

// capBy lowers t's cap to that of ctx (CapHold), if lower or t has none.
func (t *ticket) capBy(ctx context.Context) {
	if d, ok := ctx.Value(holdCapKey{}).(time.Duration); ok && (t.maxHold == 0 || d < t.maxHold) {
		t.maxHold = d
	}
}

// capTimer runs f once a hold that began at since reaches the cap d, and
// returns its timer; without a cap (d 0), it returns nil. No goroutine runs
// until the cap.
func capTimer(since time.Time, d time.Duration, f func()) *time.Timer {
	if d <= 0 {
		return nil
	}
	return time.AfterFunc(time.Until(since.Add(d)), f)
}

// dropCapped deletes the key of t, whose hold reached its cap, fenced on
// its create revision, once the hold's loss signal has closed. ctx ends
// when the holder's unlock ends the hold (whose delete then does the work)
// or when the lease term ends (which deletes the key). A delete etcd does
// not confirm otherwise is retried in the background.
func dropCapped(ctx context.Context, t *ticket) {
	dctx, cancel := context.WithTimeout(ctx, unlockTimeout)
	_, err := t.Delete(dctx)
	cancel()
	if err != nil && ctx.Err() == nil {
		// The holder keeps its turn until its unlock: a try of another
		// goroutine meanwhile is busy, not "cleaning".
		t.deleteLater(nil)
	}
}
