package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
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
	// acquire takes one hold, waiting until it is held or ctx ends.
	acquire(ctx context.Context) (grant, error)
}

// A grant is one hold that a primitive took.
type grant struct {
	token int64 // the hold's fencing token
	// release ends the hold and returns nil when it was clean, ErrLockLost
	// or ErrSessionExpired when the hold had been lost, and any other error
	// when etcd did not confirm. It is called once, by the goroutine that
	// called acquire.
	release func(context.Context) error
	done    <-chan struct{}  // the hold's loss signal
	isOwner clientv3.Cmp     // guards the hold's Txns
	lease   clientv3.LeaseID // of the hold's key
}

// A kind is one kind of lock, as the reliability tests run it.
type kind struct {
	// limit is the number of holds the lock allows at once: 1 for an
	// exclusive lock.
	limit int
	// shared tells that the holds may coexist up to limit; an exclusive
	// hold (shared false) coexists with none.
	shared bool
	// ownSession tells that each hold is taken on a Session of its own, not
	// the holder's: the lease to watch is the hold's.
	ownSession bool
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
	"lead":        {limit: 1, ownSession: true, make: leading},
	// A MultiMutex of the name and of a name nested under it (openMulti):
	// its holds are judged in the name's queue.
	"multi": {limit: 1, make: holding(openMulti)},
}

// leading makes a kind's primitive of Lead: each hold is one term of a Lead
// of its own, on a Session of its own with s's client and TTL.
func leading(s *etcdlock.Session, name string, _ time.Duration) primitive {
	return leadPrimitive{client: s.Client(), name: name, ttl: s.TTL()}
}

type leadPrimitive struct {
	client *clientv3.Client
	name   string
	ttl    time.Duration
}

// A leadTerm is what Lead's f hands to acquire: its context and hold, and the
// channel that ends it.
type leadTerm struct {
	ctx context.Context
	h   etcdlock.Hold
	end chan struct{}
}

// acquire campaigns until the first term, or until ctx ends. The term ends
// with release, which stops Lead and waits for it: Lead releases the lock
// only once f has returned.
func (p leadPrimitive) acquire(ctx context.Context) (grant, error) {
	lctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	terms := make(chan leadTerm, 1)
	led := make(chan error, 1)
	go func() {
		led <- etcdlock.Lead(lctx, p.client, p.name, func(fctx context.Context) error {
			h, _ := etcdlock.HoldFrom(fctx)
			tm := leadTerm{ctx: fctx, h: h, end: make(chan struct{})}
			terms <- tm
			select {
			case <-tm.end:
			case <-fctx.Done():
				<-tm.end // the hold is the test's until it releases it
			}
			return nil
		}, etcdlock.WithTTL(p.ttl))
	}()
	var tm leadTerm
	select {
	case tm = <-terms:
	case <-ctx.Done():
		stop()
		select {
		case tm = <-terms: // a term began as ctx ended: end it
			close(tm.end)
		case <-led:
			return grant{}, ctx.Err()
		}
		<-led
		return grant{}, ctx.Err()
	}
	release := func(ctx context.Context) error {
		// Lead does not say how its release went: ask etcd whether the
		// hold still held when release was called. f's context alone cannot
		// tell, in a process that was frozen past the TTL and has not yet
		// seen its Done close.
		lost, err := tm.ctx.Err() != nil, error(nil)
		if !lost {
			var resp *clientv3.TxnResponse
			if resp, err = p.client.Txn(ctx).If(tm.h.IsOwner()).Commit(); err == nil {
				lost = !resp.Succeeded
			}
		}
		stop()
		close(tm.end)
		<-led
		switch {
		case lost:
			return etcdlock.ErrLockLost
		case err != nil:
			return fmt.Errorf("lead: hold %d not confirmed: %w", tm.h.Token, err)
		}
		return nil
	}
	return grant{token: tm.h.Token, release: release, done: tm.ctx.Done(), isOwner: tm.h.IsOwner(), lease: tm.h.Lease}, nil
}

// holding makes a kind's primitive of a lock of the family (family_test.go).
func holding(open func(s *etcdlock.Session, name string) famLock) func(s *etcdlock.Session, name string, wait time.Duration) primitive {
	return func(s *etcdlock.Session, name string, wait time.Duration) primitive {
		return famPrimitive{l: open(s, name), wait: wait, lease: s.Lease()}
	}
}

// famPrimitive holds a lock of the family: Lock, or TryLock with a wait ≥ 0.
type famPrimitive struct {
	l     famLock
	wait  time.Duration
	lease clientv3.LeaseID // the Session's
}

func (p famPrimitive) acquire(ctx context.Context) (grant, error) {
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
		return grant{}, err
	}
	return grant{token: p.l.Token(), release: p.l.Unlock, done: p.l.Done(), isOwner: p.l.IsOwner(), lease: p.lease}, nil
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
