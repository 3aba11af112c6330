package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	recipe "go.etcd.io/etcd/client/v3/experimental/recipes"

	"github.com/etcdlock/etcdlock"
)

// Benchmarks of the rest of the family: RWMutex beside etcd's recipe
// RWMutex, Semaphore at several limits, and the cost of observing.

// benchShared runs the lockers, a goroutine each, lock then unlock in a
// loop, b.N acquisitions in all, and reports acq/s and max-inside, the most
// holders inside at once; it fails if they were more than limit (0: no
// limit), or if a writer was inside with any other holder. The first
// writers lockers are writers (an RWMutex's write side); with both kinds,
// it also reports read-acq/s and write-acq/s.
//
// A holder is inside from the return of its Lock to the call of its
// Unlock, within its hold in etcd: two holders inside at once held at once.
// Holds that overlap in etcd only before a Lock returns or after an Unlock
// is called go unseen; with nothing between the two, a holder is inside for
// nanoseconds, so the check seldom fires even for lockers that exclude
// nothing. It catches gross failures; the tests check exclusion
// (family_test.go, chaos_test.go).
func benchShared(b *testing.B, e *benchServer, lockers []benchLocker, limit, writers int) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
	defer cancel()
	// inside counts the holders inside: readers (and any holder that is no
	// writer) in its low 32 bits, writers above.
	const writer = 1 << 32
	var claimed, inside, most, clashes, reads atomic.Int64
	var wg sync.WaitGroup
	var errOnce sync.Once
	var firstErr error
	mt := e.startMeter(b)
	start := time.Now()
	for i, l := range lockers {
		wg.Go(func() {
			step := int64(1)
			if i < writers {
				step = writer
			}
			for claimed.Add(1) <= int64(b.N) {
				if err := l.Lock(ctx); err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("holder %d: lock: %w", i, err) })
					return
				}
				now := inside.Add(step)
				if step == writer && now != writer || step != writer && now >= writer {
					clashes.Add(1)
				}
				raise(&most, now/writer+now%writer)
				if step != writer {
					reads.Add(1)
				}
				inside.Add(-step)
				if err := l.Unlock(ctx); err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("holder %d: unlock: %w", i, err) })
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	if n := clashes.Load(); n > 0 {
		b.Fatalf("acquisitions with a writer and another holder inside at once: got %d, want 0", n)
	}
	if limit > 0 && most.Load() > int64(limit) {
		b.Fatalf("holders inside at once: got %d, want at most %d", most.Load(), limit)
	}
	mt.report(b, b.N)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "acq/s")
	b.ReportMetric(float64(most.Load()), "max-inside")
	if writers > 0 && writers < len(lockers) {
		b.ReportMetric(float64(reads.Load())/elapsed.Seconds(), "read-acq/s")
		b.ReportMetric(float64(int64(b.N)-reads.Load())/elapsed.Seconds(), "write-acq/s")
	}
}

// readLocker and writeLocker take an etcdlock.RWMutex's read and write
// sides; recipeReader and recipeWriter, the recipe's.
type (
	readLocker   struct{ rw *etcdlock.RWMutex }
	writeLocker  struct{ rw *etcdlock.RWMutex }
	recipeReader struct{ rw *recipe.RWMutex }
	recipeWriter struct{ rw *recipe.RWMutex }
)

func (l readLocker) Lock(ctx context.Context) error    { return l.rw.RLockContext(ctx) }
func (l readLocker) Unlock(ctx context.Context) error  { return l.rw.RUnlockContext(ctx) }
func (l writeLocker) Lock(ctx context.Context) error   { return l.rw.LockContext(ctx) }
func (l writeLocker) Unlock(ctx context.Context) error { return l.rw.UnlockContext(ctx) }

// The recipe has no context: its calls block until done.
func (l recipeReader) Lock(context.Context) error   { return l.rw.RLock() }
func (l recipeReader) Unlock(context.Context) error { return l.rw.RUnlock() }
func (l recipeWriter) Lock(context.Context) error   { return l.rw.Lock() }
func (l recipeWriter) Unlock(context.Context) error { return l.rw.Unlock() }

// BenchmarkRWMutex: 4 sessions that only read (they hold together: the
// cost of a read hold), 2 sessions that only write (a writer's hand-off),
// and 8 readers with 2 writers at once, beside etcd's recipe RWMutex. Each
// session is on a client of its own. One op is one acquisition, a read or a
// write.
func BenchmarkRWMutex(b *testing.B) {
	e := startBench(b)
	for _, tc := range []struct {
		name             string
		readers, writers int
	}{{"readers=4", 4, 0}, {"writers=2", 0, 2}, {"readers=8,writers=2", 8, 2}} {
		b.Run(tc.name, func(b *testing.B) {
			b.Run("etcdlock", func(b *testing.B) {
				name := benchName(b)
				lockers := make([]benchLocker, tc.writers+tc.readers)
				for i := range lockers {
					rw := etcdlock.NewRWMutex(benchSession(b, e.client(b)), name)
					lockers[i] = readLocker{rw}
					if i < tc.writers {
						lockers[i] = writeLocker{rw}
					}
				}
				benchShared(b, e, lockers, 0, tc.writers)
			})
			b.Run("recipe", func(b *testing.B) {
				name := benchName(b)
				lockers := make([]benchLocker, tc.writers+tc.readers)
				for i := range lockers {
					rw := recipe.NewRWMutex(benchUpstreamSession(b, e.client(b), etcdlock.DefaultTTL), name)
					lockers[i] = recipeReader{rw}
					if i < tc.writers {
						lockers[i] = recipeWriter{rw}
					}
				}
				benchShared(b, e, lockers, 0, tc.writers)
			})
		})
	}
}

// permitLocker takes one permit of a Semaphore at a time; used by one
// goroutine.
type permitLocker struct {
	sem *etcdlock.Semaphore
	p   *etcdlock.Permit
}

func (l *permitLocker) Lock(ctx context.Context) (err error) {
	l.p, err = l.sem.Acquire(ctx)
	return err
}

func (l *permitLocker) Unlock(ctx context.Context) error {
	if l.p == nil {
		return errors.New("no permit held")
	}
	err := l.p.Release(ctx)
	l.p = nil
	return err
}

// BenchmarkSemaphore: twice limit sessions (at least 2) share a Semaphore of
// limit 1, 4 and 16, each taking one permit at a time; the Mutex rate to
// compare with is BenchmarkContended's. One op is one acquisition.
func BenchmarkSemaphore(b *testing.B) {
	e := startBench(b)
	for _, limit := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("limit=%d/etcdlock", limit), func(b *testing.B) {
			name := benchName(b)
			lockers := make([]benchLocker, max(2, 2*limit))
			for i := range lockers {
				lockers[i] = &permitLocker{sem: etcdlock.NewSemaphore(benchSession(b, e.client(b)), name, limit)}
			}
			benchShared(b, e, lockers, limit, 0)
		})
	}
}

// BenchmarkObserver: the uncontended pair with no observer, with an
// Observer that does nothing, and with WithLogger at Debug writing text to
// nowhere: what observing costs the lock path. One op is a LockContext and
// an UnlockContext.
func BenchmarkObserver(b *testing.B) {
	e := startBench(b)
	for _, tc := range []struct {
		name string
		opts []etcdlock.SessionOption
	}{
		{"none", nil},
		{"observer", []etcdlock.SessionOption{etcdlock.WithObserver(etcdlock.ObserverFunc(func(etcdlock.Event) {}))}},
		{"logger", []etcdlock.SessionOption{etcdlock.WithLogger(slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelDebug})))}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			m := etcdlock.NewMutex(benchSession(b, e.client(b), tc.opts...), benchName(b))
			ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
			defer cancel()
			mt := e.startMeter(b)
			for b.Loop() {
				if err := m.LockContext(ctx); err != nil {
					b.Fatalf("LockContext: %v", err)
				}
				if err := m.UnlockContext(ctx); err != nil {
					b.Fatalf("UnlockContext: %v", err)
				}
			}
			b.StopTimer()
			mt.report(b, b.N)
		})
	}
}
