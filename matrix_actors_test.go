package etcdlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
)

// The actors of the fault matrix: how each kind of lock takes, holds and
// releases under the seam's faults (matrix_test.go runs the cases).

// An actor is the lock under test, on the seam's client.
type actor interface {
	// acquire takes the lock: only a try (wait 0), or waiting at most wait
	// (< 0: until ctx ends).
	acquire(ctx context.Context, wait time.Duration) (bool, error)
	// hold returns the key and token of the hold, and its loss signal.
	hold() (key string, token int64, done <-chan struct{})
	release(ctx context.Context) error
}

// famActor makes an actor of a lock of the family.
func famActor(open func(s *etcdlock.Session, name string) famLock) func(*testing.T, *clientv3.Client, *etcdlock.Session, string, *seam) actor {
	return func(t *testing.T, _ *clientv3.Client, s *etcdlock.Session, name string, _ *seam) actor {
		a := &lockActor{l: open(s, name), ops: make(chan func())}
		stopped := make(chan struct{})
		go func() {
			defer close(stopped)
			for f := range a.ops {
				f()
			}
		}()
		t.Cleanup(func() { close(a.ops); <-stopped })
		return a
	}
}

// A lockActor runs every call on a goroutine of its own: holds belong to
// goroutines.
type lockActor struct {
	l   famLock
	ops chan func()
}

// on runs f on the actor's goroutine.
func (a *lockActor) on(f func()) {
	ran := make(chan struct{})
	a.ops <- func() { f(); close(ran) }
	<-ran
}

func (a *lockActor) acquire(ctx context.Context, wait time.Duration) (held bool, err error) {
	a.on(func() {
		if wait < 0 {
			err = a.l.Lock(ctx)
			held = err == nil
			return
		}
		held, err = a.l.TryLock(ctx, wait)
	})
	return held, err
}

func (a *lockActor) hold() (key string, token int64, done <-chan struct{}) {
	a.on(func() { key, token, done = heldKey(a.l), a.l.Token(), a.l.Done() })
	return key, token, done
}

func (a *lockActor) release(ctx context.Context) (err error) {
	a.on(func() { err = a.l.Unlock(ctx) })
	return err
}

// heldKey returns the key of a lock of the family's hold.
func heldKey(l famLock) string {
	switch l := l.(type) {
	case mutexLock:
		return l.m.Key()
	case *semLock:
		if len(l.permits) > 0 {
			return l.permits[0].Key()
		}
		return ""
	}
	return "" // an RWMutex's: found by its token
}

// scopeActor runs Do or Lead: a hold is one run of f, which reports it and
// runs until released or its context ends.
type scopeActor struct {
	started chan struct{}
	stop    chan struct{}
	ended   chan struct{} // closed when Do or Lead returned, with err
	err     error
	cancel  context.CancelFunc

	mu   sync.Mutex
	held etcdlock.Hold
	fctx context.Context
}

func newScopeActor() *scopeActor {
	return &scopeActor{started: make(chan struct{}, 16), stop: make(chan struct{}), ended: make(chan struct{})}
}

func (a *scopeActor) f(ctx context.Context) error {
	h, _ := etcdlock.HoldFrom(ctx)
	a.mu.Lock()
	if a.fctx == nil {
		// The hold under test is the first: Lead may lead again, on a new
		// Session, once the first term's hold is lost, before the case
		// looks at it.
		a.held, a.fctx = h, ctx
	}
	a.mu.Unlock()
	a.started <- struct{}{}
	select {
	case <-a.stop:
	case <-ctx.Done():
	}
	return nil
}

// run starts run, with a context that ends after wait (wait >= 0), and
// waits until f starts or run returns.
func (a *scopeActor) run(ctx context.Context, wait time.Duration, run func(ctx context.Context) error) (bool, error) {
	if wait >= 0 {
		ctx, a.cancel = context.WithTimeout(ctx, wait)
	} else {
		ctx, a.cancel = context.WithCancel(ctx)
	}
	go func() {
		defer close(a.ended)
		a.err = run(ctx)
	}()
	select {
	case <-a.started:
		return true, nil
	case <-a.ended:
		return false, a.err
	}
}

func (a *scopeActor) hold() (string, int64, <-chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.held.Key, a.held.Token, a.fctx.Done()
}

// release ends f and waits for Do or Lead to return.
func (a *scopeActor) release(context.Context) error {
	close(a.stop)
	a.cancel()
	select {
	case <-a.ended:
		if errors.Is(a.err, context.Canceled) {
			return nil // Lead ends with its context
		}
		return a.err
	case <-time.After(testTimeout):
		return errors.New("test: Do or Lead did not return after its release")
	}
}

// end stops Do or Lead if still running.
func (a *scopeActor) end() {
	if a.cancel != nil {
		a.cancel()
		select {
		case <-a.ended:
		case <-time.After(testTimeout):
		}
	}
}

type doScope struct {
	*scopeActor
	m *etcdlock.Mutex
}

func doActor(t *testing.T, _ *clientv3.Client, s *etcdlock.Session, name string, _ *seam) actor {
	a := &doScope{newScopeActor(), etcdlock.NewMutex(s, name)}
	t.Cleanup(a.end)
	return a
}

func (a *doScope) acquire(ctx context.Context, wait time.Duration) (bool, error) {
	return a.run(ctx, wait, func(ctx context.Context) error { return a.m.Do(ctx, a.f) })
}

type leadScope struct {
	*scopeActor
	client *clientv3.Client
	name   string
}

func leadActor(t *testing.T, client *clientv3.Client, _ *etcdlock.Session, name string, _ *seam) actor {
	a := &leadScope{newScopeActor(), client, name}
	t.Cleanup(a.end)
	return a
}

func (a *leadScope) acquire(ctx context.Context, wait time.Duration) (bool, error) {
	return a.run(ctx, wait, func(ctx context.Context) error {
		return etcdlock.Lead(ctx, a.client, a.name, a.f, etcdlock.WithTTL(matrixTTL))
	})
}
