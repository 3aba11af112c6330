package etcdlock_test

// Helpers that the tests of every file share: servers, clients and Sessions,
// reads of the lock's keys, waiting, and the locker adapters that run one
// scenario on etcdlock.Mutex and on concurrency.Mutex.

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/goleak"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

func TestMain(m *testing.M) {
	holderMain() // a holder process of the process test (process_test.go), when run as one
	if os.Getenv(v3lockServerEnv) == "1" {
		runV3lockServer()
	}
	testflags.SetParallel(16)               // the parallel tests mostly wait for leases and timers
	goleak.VerifyTestMain(etcdtest.Main(m)) // etcdtest.Main stops the server of namespace_test.go
}

// testTimeout bounds every wait of a test: generous, since CI machines are
// shared and run with -race.
const testTimeout = 30 * time.Second

// faultsFor returns how long a fault test injects faults: short, unless the
// environment variable env asks for a long run, with 1 (10 minutes) or a
// duration such as 3m.
func faultsFor(t *testing.T, env string, short time.Duration) time.Duration {
	t.Helper()
	switch v := os.Getenv(env); v {
	case "":
		return short
	case "1":
		return 10 * time.Minute
	default:
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want 1 (10 minutes) or a duration such as 3m", env, v)
		}
		return d
	}
}

// testContext returns a context that ends after testTimeout or with the test.
func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// lockName returns a lock name of the test's own.
func lockName(t *testing.T) string {
	return "test/" + strings.ReplaceAll(t.Name(), "/", "_")
}

// Bounds the contract promises (docs/api.md, doc comments), as the tests assert
// them: twice the promise, so that a loaded machine does not fail them, or
// the promise itself where that is already more than twice what a loaded
// run measures. How long a call takes below its bound is logged, not
// asserted; docs/reliability.md keeps the figures.
const (
	// closeBound: Session.Close returns within 5 s even when etcd is
	// unreachable; its revoke is bounded by 2 s.
	closeBound = 5 * time.Second
	// unlockBound: UnlockContext's delete is bounded by 3 s.
	unlockBound = 2 * 3 * time.Second
	// deadlineSlack: a lock call returns by its deadline, or its cancel,
	// + 1 s.
	deadlineSlack = 2 * time.Second
	// expiredBound: a waiter whose own lease is gone returns
	// ErrSessionExpired within 1 s.
	expiredBound = 2 * time.Second
	// doneBound: Mutex.Done closes within 2 s of our key's delete or the
	// lease's revoke; it measures about 100 ms.
	doneBound = 2 * time.Second
)

// checkBound logs how long a call took, and fails the test if that is more
// than bound.
func checkBound(t *testing.T, what string, took, bound time.Duration) {
	t.Helper()
	t.Logf("%s: returned after %v", what, took.Round(time.Millisecond))
	if took > bound {
		t.Errorf("%s: returned after %v, want ≤ %v", what, took.Round(time.Millisecond), bound)
	}
}

// randomDeadline returns a deadline between 0 and 3 ms: short enough to end
// a call at any point of its round trips to etcd.
func randomDeadline() time.Duration {
	return time.Duration(rand.Int64N(int64(3*time.Millisecond) + 1))
}

// waitUntil polls cond every 10 ms until it holds (nil) or ctx ends
// (ctx.Err()). It may be called from any goroutine.
func waitUntil(ctx context.Context, cond func() bool) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

// long skips a long fault run outside the long run, saying so: chaos,
// holder processes and checked histories take minutes together. .ci/run
// runs them with ETCDLOCK_LONG=1.
func long(t *testing.T) {
	t.Helper()
	if !testflags.Long() {
		t.Skip("a long fault run: ETCDLOCK_LONG=1 runs it (.ci/run does)")
	}
}

// eventually polls cond until it holds, failing the test after testTimeout.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if waitUntil(ctx, cond) != nil {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// result runs f in a goroutine and returns a channel with its error.
func result(f func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}

// waitErr waits for an error from ch, failing the test after testTimeout.
func waitErr(t *testing.T, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(testTimeout):
		t.Fatalf("timed out waiting for a call to return")
		return nil
	}
}

// blocked reports whether nothing arrives on ch within d: the call is still
// waiting. A short d only makes the check weaker, never flaky: use it only
// where the call must not return.
func blocked(ch <-chan error, d time.Duration) bool {
	select {
	case <-ch:
		return false
	case <-time.After(d):
		return true
	}
}

// isClosed reports whether ch is closed now.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// closedWithin waits up to d for ch to close and returns how long it took.
func closedWithin(ch <-chan struct{}, d time.Duration) (time.Duration, bool) {
	start := time.Now()
	select {
	case <-ch:
		return time.Since(start), true
	case <-time.After(d):
		return d, false
	}
}

// closeTime returns a function that reports when ch closed (zero while
// open). Its goroutine ends when ch closes.
func closeTime(ch <-chan struct{}) func() time.Time {
	var at atomic.Int64
	go func() {
		<-ch
		at.Store(time.Now().UnixNano())
	}()
	return func() time.Time {
		if n := at.Load(); n != 0 {
			return time.Unix(0, n)
		}
		return time.Time{}
	}
}

// catchPanic runs f and returns what it panicked with, or nil.
func catchPanic(f func()) (r any) {
	defer func() { r = recover() }()
	f()
	return nil
}

// assertPanics checks that f panics with a message containing want.
func assertPanics(t *testing.T, what, want string, f func()) {
	t.Helper()
	r := catchPanic(f)
	if r == nil {
		t.Errorf("%s did not panic", what)
		return
	}
	if msg, ok := r.(string); !ok || !strings.Contains(msg, want) {
		t.Errorf("%s panicked with %v, want a message naming %s", what, r, want)
	}
}

// locker is what a scenario needs of a lock, so that it runs unchanged on
// etcdlock.Mutex (ours) and on concurrency.Mutex (upstream).
type locker interface {
	Lock(ctx context.Context) error
	// TryLock reports false, nil when another holder has the lock.
	TryLock(ctx context.Context) (bool, error)
	Unlock(ctx context.Context) error
	// Key is the lock's etcd key, while held.
	Key() string
}

// ours is an etcdlock.Mutex as a locker.
type ours struct{ m *etcdlock.Mutex }

func oursOn(s *etcdlock.Session, name string) ours { return ours{etcdlock.NewMutex(s, name)} }

func (l ours) Lock(ctx context.Context) error            { return l.m.LockContext(ctx) }
func (l ours) TryLock(ctx context.Context) (bool, error) { return l.m.TryLockFor(ctx, 0) }
func (l ours) Unlock(ctx context.Context) error          { return l.m.UnlockContext(ctx) }
func (l ours) Key() string                               { return l.m.Key() }

// oursFor is ours with Lock done by TryLockFor(ctx, wait): a wait that runs
// out is an error.
type oursFor struct {
	ours
	wait time.Duration
}

var errWaitRanOut = errors.New("the wait ran out")

func (l oursFor) Lock(ctx context.Context) error {
	ok, err := l.m.TryLockFor(ctx, l.wait)
	if err == nil && !ok {
		return errWaitRanOut
	}
	return err
}

// upstream is a concurrency.Mutex as a locker.
type upstream struct{ m *concurrency.Mutex }

func upstreamOn(s *concurrency.Session, name string) upstream {
	return upstream{concurrency.NewMutex(s, name)}
}

func (l upstream) Lock(ctx context.Context) error   { return l.m.Lock(ctx) }
func (l upstream) Unlock(ctx context.Context) error { return l.m.Unlock(ctx) }
func (l upstream) Key() string                      { return l.m.Key() }

func (l upstream) TryLock(ctx context.Context) (bool, error) {
	err := l.m.TryLock(ctx)
	if errors.Is(err, concurrency.ErrLocked) {
		return false, nil
	}
	return err == nil, err
}

// worker locks a lock in a goroutine of its own, and unlocks it there once
// released, the way a separate worker would.
type worker struct {
	locked  chan error // Lock's result
	release chan struct{}
	cancel  context.CancelFunc
	done    chan error // Unlock's result, or nil when Lock failed
	once    sync.Once
	err     error
}

// lockInGoroutine starts a worker that locks l with ctx; t.Cleanup releases
// it.
func lockInGoroutine(t *testing.T, ctx context.Context, l locker) *worker {
	ctx, cancel := context.WithCancel(ctx)
	w := &worker{
		locked:  make(chan error, 1),
		release: make(chan struct{}),
		cancel:  cancel,
		done:    make(chan error, 1),
	}
	go func() {
		err := l.Lock(ctx)
		w.locked <- err
		if err != nil {
			w.done <- nil
			return
		}
		<-w.release
		uctx, ucancel := context.WithTimeout(context.Background(), testTimeout)
		defer ucancel()
		w.done <- l.Unlock(uctx)
	}()
	t.Cleanup(func() { _ = w.Release() })
	return w
}

// Release makes the worker unlock, or give up a Lock still waiting, and
// returns the Unlock's error. It may be called from any goroutine.
func (w *worker) Release() error {
	w.once.Do(func() {
		close(w.release)
		w.cancel()
		w.err = <-w.done
	})
	return w.err
}

// A famLock is one lock of the family, as a test uses it.
type famLock interface {
	Lock(ctx context.Context) error
	// TryLock waits at most wait; false, nil when it ran out.
	TryLock(ctx context.Context, wait time.Duration) (bool, error)
	Unlock(ctx context.Context) error
	Token() int64
	IsOwner() clientv3.Cmp
	Done() <-chan struct{}
}

type mutexLock struct{ m *etcdlock.Mutex }

func (l mutexLock) Lock(ctx context.Context) error { return l.m.LockContext(ctx) }
func (l mutexLock) TryLock(ctx context.Context, wait time.Duration) (bool, error) {
	return l.m.TryLockFor(ctx, wait)
}
func (l mutexLock) Unlock(ctx context.Context) error { return l.m.UnlockContext(ctx) }
func (l mutexLock) Token() int64                     { return l.m.Token() }
func (l mutexLock) IsOwner() clientv3.Cmp            { return l.m.IsOwner() }
func (l mutexLock) Done() <-chan struct{}            { return l.m.Done() }

type writeLock struct{ rw *etcdlock.RWMutex }

func (l writeLock) Lock(ctx context.Context) error { return l.rw.LockContext(ctx) }
func (l writeLock) TryLock(ctx context.Context, wait time.Duration) (bool, error) {
	return l.rw.TryLockFor(ctx, wait)
}
func (l writeLock) Unlock(ctx context.Context) error { return l.rw.UnlockContext(ctx) }
func (l writeLock) Token() int64                     { return l.rw.Token() }
func (l writeLock) IsOwner() clientv3.Cmp            { return l.rw.IsOwner() }
func (l writeLock) Done() <-chan struct{}            { return l.rw.Done() }

type readLock struct{ rw *etcdlock.RWMutex }

func (l readLock) Lock(ctx context.Context) error { return l.rw.RLockContext(ctx) }
func (l readLock) TryLock(ctx context.Context, wait time.Duration) (bool, error) {
	return l.rw.TryRLockFor(ctx, wait)
}
func (l readLock) Unlock(ctx context.Context) error { return l.rw.RUnlockContext(ctx) }
func (l readLock) Token() int64                     { return l.rw.Token() }
func (l readLock) IsOwner() clientv3.Cmp            { return l.rw.IsOwner() }
func (l readLock) Done() <-chan struct{}            { return l.rw.Done() }

// semLock holds n permits of a semaphore at once; used from one goroutine.
type semLock struct {
	sem     *etcdlock.Semaphore
	n       int
	permits []*etcdlock.Permit
}

func (l *semLock) Lock(ctx context.Context) error {
	for len(l.permits) < l.n {
		p, err := l.sem.Acquire(ctx)
		if err != nil {
			l.releaseAll()
			return err
		}
		l.permits = append(l.permits, p)
	}
	return nil
}

func (l *semLock) TryLock(ctx context.Context, wait time.Duration) (bool, error) {
	for len(l.permits) < l.n {
		p, err := l.sem.TryAcquire(ctx, wait)
		if err != nil {
			l.releaseAll()
			if errors.Is(err, etcdlock.ErrNoPermit) {
				return false, nil
			}
			return false, err
		}
		l.permits = append(l.permits, p)
	}
	return true, nil
}

// releaseAll gives back the permits taken before a failure.
func (l *semLock) releaseAll() {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	for _, p := range l.permits {
		_ = p.Release(ctx)
	}
	l.permits = nil
}

func (l *semLock) Unlock(ctx context.Context) error {
	if len(l.permits) == 0 {
		return (*etcdlock.Permit)(nil).Release(ctx)
	}
	var errs []error
	for _, p := range l.permits {
		errs = append(errs, p.Release(ctx))
	}
	l.permits = nil
	return errors.Join(errs...)
}

func (l *semLock) Token() int64 {
	if len(l.permits) == 0 {
		return 0
	}
	return l.permits[0].Token()
}

func (l *semLock) IsOwner() clientv3.Cmp {
	if len(l.permits) == 0 {
		return (*etcdlock.Permit)(nil).IsOwner()
	}
	return l.permits[0].IsOwner()
}

func (l *semLock) Done() <-chan struct{} {
	if len(l.permits) == 0 {
		return (*etcdlock.Permit)(nil).Done()
	}
	return l.permits[0].Done()
}

// raise makes m at least n.
func raise(m *atomic.Int64, n int64) {
	for old := m.Load(); n > old && !m.CompareAndSwap(old, n); old = m.Load() {
		// Another holder raised it meanwhile: look again.
	}
}
