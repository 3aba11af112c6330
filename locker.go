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
		if s == nil || !s.lockable(err) {
			panic(fmt.Sprintf("etcdlock: %s of %q: %v (use %sContext to handle this as an error)", method, name, err, method))
		}
		// The Session's end makes the next call fail at once, and panic.
		_ = backoff.wait(s.life)
	}
}

// tryLockTimeout bounds the TryLock methods, which have no context of their
// own.
const tryLockTimeout = 2 * time.Second

// tryOnce tries acquire once, bounded by tryLockTimeout, for a TryLock
// method, which has no context of its own: false on any failure.
func tryOnce(acquire func(ctx context.Context, wait time.Duration) (bool, error)) bool {
	ctx, cancel := context.WithTimeout(context.Background(), tryLockTimeout)
	defer cancel()
	ok, _ := acquire(ctx, tryOnly)
	return ok
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
