package etcdlock_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
)

// The reliability tests (the chaos test, the holder processes and the
// checked contention test) see a lock only through a primitive, so that each
// kind of lock of the family joins all of them with one adapter: a kind
// below, and an entry in kinds.

// A primitive takes holds of one lock for one holder.
type primitive interface {
	// acquire takes one hold, waiting until it is held or ctx ends. It
	// returns the hold's fencing token; release, which ends the hold and
	// returns nil when it was clean, ErrLockLost or ErrSessionExpired when
	// the hold had been lost, and any other error when etcd did not confirm;
	// the hold's loss signal; and the comparison that guards the hold's
	// Txns. release is called once, by the goroutine that called acquire.
	acquire(ctx context.Context) (token int64, release func(context.Context) error, done <-chan struct{}, isOwner clientv3.Cmp, err error)
}

// A kind is one kind of lock, as the reliability tests run it.
type kind struct {
	// limit is the number of holds the lock allows at once: 1 for an
	// exclusive lock.
	limit int
	// shared tells that the holds may coexist up to limit; an exclusive
	// hold (shared false) coexists with none.
	shared bool
	// make returns a primitive for one holder of the lock called name on
	// the Session s. With wait < 0 its acquire waits as long as ctx allows;
	// with wait ≥ 0 it waits at most wait and then returns errWaitRanOut,
	// if the kind can (it may ignore wait).
	make func(s *etcdlock.Session, name string, wait time.Duration) primitive
}

// kinds are the kinds of lock the reliability tests run, by name (the name
// is how a holder process is told which to run). The chaos, process and
// contention tests run each kind as a subtest of that name.
var kinds = map[string]kind{
	"mutex":       {limit: 1, make: holding(openMutex)},
	"rwmutex-w":   {limit: 1, make: holding(openWriter)},
	"rwmutex-r":   {limit: 0, shared: true, make: holding(openReader)},
	"semaphore-2": {limit: 2, shared: true, make: holding(openSemaphore(2))},
}

// holding makes a kind's primitive of a lock of the family (family_test.go).
func holding(open func(s *etcdlock.Session, name string) famLock) func(s *etcdlock.Session, name string, wait time.Duration) primitive {
	return func(s *etcdlock.Session, name string, wait time.Duration) primitive {
		return famPrimitive{l: open(s, name), wait: wait}
	}
}

// famPrimitive holds a lock of the family: Lock, or TryLock with a wait ≥ 0.
type famPrimitive struct {
	l    famLock
	wait time.Duration
}

func (p famPrimitive) acquire(ctx context.Context) (int64, func(context.Context) error, <-chan struct{}, clientv3.Cmp, error) {
	var err error
	if p.wait >= 0 {
		var held bool
		held, err = p.l.TryLock(ctx, p.wait)
		if err == nil && !held {
			err = errWaitRanOut
		}
	} else {
		err = p.l.Lock(ctx)
	}
	if err != nil {
		return 0, nil, nil, clientv3.Cmp{}, err
	}
	return p.l.Token(), p.l.Unlock, p.l.Done(), p.l.IsOwner(), nil
}

// forEachKind runs f as a subtest for each kind, by name.
func forEachKind(t *testing.T, f func(t *testing.T, name string)) {
	for _, name := range slices.Sorted(maps.Keys(kinds)) {
		t.Run(name, func(t *testing.T) { f(t, name) })
	}
}

// releaseResult sorts the error of a primitive's release.
func releaseResult(err error) opResult {
	switch {
	case err == nil:
		return resOK
	case errors.Is(err, etcdlock.ErrLockLost) || errors.Is(err, etcdlock.ErrSessionExpired):
		return resLost
	default:
		return resUnknown
	}
}
