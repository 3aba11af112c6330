package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// The sync.Locker side of Mutex and RWMutex: methods without a context or an
// error, which block until held and panic where sync.Mutex would, or where
// the lock can never be taken.

// lockBlocking calls lock until it succeeds, retrying what can be retried
// (etcd unreachable, a malformed reply) with backoff for as long as the
// Session lives. It panics, naming the context method, where the lock can
// never be taken: an ended Session, bad input, or a deadlock on oneself.
func lockBlocking(method, name string, s *Session, lock func(context.Context) error) {
	backoff := newBackoff()
	for {
		err := lock(context.Background())
		if err == nil {
			return
		}
		if errors.Is(err, ErrSessionExpired) || errors.Is(err, ErrInvalidName) ||
			errors.Is(err, ErrInvalidArgument) || errors.Is(err, ErrWouldDeadlock) {
			panic(fmt.Sprintf("etcdlock: %s of %q: %v (use %sContext to handle this as an error)", method, name, err, method))
		}
		// The Session's end makes the next call fail at once, and panic.
		_ = backoff.wait(s.cs.Ctx())
	}
}

// unlockOrPanic calls unlock, and panics, naming the context method, where
// nothing was held or the input is bad. Other failures are not reported: the
// hold ends all the same, and its key is deleted in the background or
// expires with the lease.
func unlockOrPanic(method, name string, unlock func(context.Context) error) {
	err := unlock(context.Background())
	if errors.Is(err, ErrNotHeld) || errors.Is(err, ErrInvalidName) || errors.Is(err, ErrInvalidArgument) {
		panic(fmt.Sprintf("etcdlock: %s of %q: %v (use %sContext to handle this as an error)", method, name, err, method))
	}
}

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
func (b *backoff) wait(ctx context.Context) error {
	t := time.NewTimer(b.next())
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
