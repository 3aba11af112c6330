package etcdlock

import (
	"context"
	"time"
)

// The pauses of a backoff: 50 ms, doubling to 1 s.
const (
	firstBackoff = 50 * time.Millisecond
	maxBackoff   = time.Second
)

// A backoff is the pause between two attempts that failed: 50 ms, doubling
// to 1 s.
type backoff struct{ d time.Duration }

func newBackoff() *backoff { return &backoff{d: firstBackoff} }

func (b *backoff) reset() { b.d = firstBackoff }

// next returns the pause before the next attempt, and doubles the one
// after it.
func (b *backoff) next() time.Duration {
	d := b.d
	b.d = min(2*b.d, maxBackoff)
	return d
}

// wait pauses, or returns ctx.Err() if ctx ends first.
func (b *backoff) wait(ctx context.Context) error { return sleep(ctx, b.next()) }

// sleep pauses d, or returns ctx.Err() if ctx ends first.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
