package etcdlockgocron

import (
	"context"
	"fmt"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/go-co-op/gocron/v2"
)

// unlockTimeout bounds Unlock's delete, which runs even when gocron's
// context has ended (the job removed, the scheduler shut down): a key left
// behind would keep the job from running elsewhere until the lease goes.
const unlockTimeout = 5 * time.Second

// A Locker is a gocron.Locker on etcd: one etcdlock.Mutex per job, named
// the Locker's prefix followed by the job's name, taken with a try.
type Locker struct {
	s       *etcdlock.Session
	prefix  string
	minHold time.Duration
}

var _ gocron.Locker = (*Locker)(nil)

// A LockerOption configures NewLocker.
type LockerOption interface{ apply(*Locker) error }

type lockerOption func(*Locker) error

func (f lockerOption) apply(l *Locker) error { return f(l) }

// WithMinHold keeps each lock for at least d after it was taken (default 0:
// until the run ends): Unlock waits for the rest of d, unless the hold is
// lost, and a scheduler's Shutdown waits for Unlock. Choose d longer than
// the spread of the replicas' starts of one tick (their clocks' skew plus
// their scheduling delays), and shorter than the job's interval (or the
// replica that holds skips the next tick) and than gocron's stop timeout
// (10 s by default).
func WithMinHold(d time.Duration) LockerOption {
	return lockerOption(func(l *Locker) error {
		if d < 0 {
			return fmt.Errorf("%w: minimum hold %v, want >= 0", ErrInvalidArgument, d)
		}
		l.minHold = d
		return nil
	})
}

// NewLocker returns a Locker whose locks use the lease of s and are named
// prefix + the job's name, prefix used as is (such as "myapp/jobs/"). It
// writes nothing. It returns ErrInvalidArgument, wrapped, for a nil Session,
// an empty prefix (so that job names do not share the names of the
// application's other locks), or an invalid option. The Locker does not
// close s.
func NewLocker(s *etcdlock.Session, prefix string, opts ...LockerOption) (*Locker, error) {
	switch {
	case s == nil:
		return nil, fmt.Errorf("%w: nil session", ErrInvalidArgument)
	case prefix == "":
		return nil, fmt.Errorf("%w: empty prefix", ErrInvalidArgument)
	}
	l := &Locker{s: s, prefix: prefix}
	for _, o := range opts {
		if err := o.apply(l); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// Lock takes the lock of the job called key if nobody holds or waits for
// it, and returns the hold, to be unlocked on the goroutine that locked it
// (as gocron does). It returns ErrBusy, wrapped, leaving no key, when the
// lock is taken; etcdlock's errors (such as etcdlock.ErrSessionExpired once
// the Session has ended, or within about the TTL while etcd cannot be
// reached), wrapped; and ErrInvalidArgument, wrapped, for a nil ctx or an
// empty key.
func (l *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	switch {
	case ctx == nil:
		return nil, fmt.Errorf("%w: nil context", ErrInvalidArgument)
	case key == "":
		return nil, fmt.Errorf("%w: empty job name", ErrInvalidArgument)
	}
	m := etcdlock.NewMutex(l.s, l.prefix+key)
	ok, err := m.TryLockFor(ctx, 0)
	switch {
	case err != nil:
		return nil, fmt.Errorf("etcdlockgocron: lock of job %q: %w", key, err)
	case !ok:
		return nil, fmt.Errorf("%w: %q", ErrBusy, key)
	}
	return &lock{m: m, until: time.Now().Add(l.minHold)}, nil
}

// A lock is one hold of a job's lock.
type lock struct {
	m     *etcdlock.Mutex
	until time.Time // WithMinHold: no unlock before
}

// Unlock waits for the rest of the minimum hold, even once ctx has ended
// (the scheduler shutting down would otherwise let another replica run the
// tick again), unless the hold is lost first; then it deletes the key. It
// returns nil when the hold lasted until then, etcdlock.ErrLockLost when its
// key was gone before, and etcdlock.ErrNotHeld when called again or on
// another goroutine.
func (k *lock) Unlock(ctx context.Context) error {
	if wait := time.Until(k.until); wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-k.m.Done():
			t.Stop()
		}
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlockTimeout)
	defer cancel()
	return k.m.UnlockContext(uctx)
}
