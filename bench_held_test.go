package etcdlock_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdlock/etcdlock"
)

// benchHeldCounts are the numbers of locks of BenchmarkHeldLocks;
// ETCDLOCK_HELD_LOCKS, a comma-separated list (such as 100,10000,100000),
// replaces them.
func benchHeldCounts(b *testing.B) []int {
	return benchEnvCounts(b, "ETCDLOCK_HELD_LOCKS", []int{1, 100, 10000}, 1)
}

// benchEnvCounts returns the counts of a benchmark: those of the environment
// variable env, a comma-separated list, if set, each at least least; else
// def.
func benchEnvCounts(b *testing.B, env string, def []int, least int) []int {
	v := os.Getenv(env)
	if v == "" {
		return def
	}
	var counts []int
	for f := range strings.SplitSeq(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < least {
			b.Fatalf("%s=%q: want a comma-separated list of counts of at least %d", env, v, least)
		}
		counts = append(counts, n)
	}
	return counts
}

// benchHeldRereadTTL is the TTL of the etcdlock Sessions of
// BenchmarkHeldLocks when ETCDLOCK_HELD_REREAD=1, which counts the Txns of
// the loss signals' safety re-read: their holds are kept two TTLs more, and
// the Txns the client sent meanwhile are counted.
const benchHeldRereadTTL = 10 * time.Second

// benchHeldReread reports whether ETCDLOCK_HELD_REREAD=1.
func benchHeldReread() bool { return os.Getenv("ETCDLOCK_HELD_REREAD") == "1" }

// benchHeldWorkers is how many goroutines take the locks of
// BenchmarkHeldLocks, each its share, and later release them (an etcdlock
// hold belongs to the goroutine that took it).
const benchHeldWorkers = 8

// A benchHoldKind is one way for a Session to have a lock: held, or only a
// handle. open makes the Session on c and returns take, which takes lock
// name (or makes its handle) and returns what it made, never nil unless it
// failed, and release, which ends it. What take returns is pointer-shaped,
// so that storing it costs no allocation of the benchmark's own.
type benchHoldKind struct {
	name string
	done bool // take calls Mutex.Done: wait for its watch before measuring
	open func(tb testing.TB, c *clientv3.Client) (
		take func(ctx context.Context, name string) (any, error),
		release func(ctx context.Context, name string, h any) error)
}

var benchHoldKinds = []benchHoldKind{
	{name: "etcdlock-idle", open: func(tb testing.TB, c *clientv3.Client) (func(context.Context, string) (any, error), func(context.Context, string, any) error) {
		s := benchSession(tb, c)
		return func(_ context.Context, name string) (any, error) { return etcdlock.NewMutex(s, name), nil },
			func(context.Context, string, any) error { return nil }
	}},
	{name: "etcdlock", open: benchHoldEtcdlock(false)},
	{name: "etcdlock-done", done: true, open: benchHoldEtcdlock(true)},
	{name: "upstream-idle", open: func(tb testing.TB, c *clientv3.Client) (func(context.Context, string) (any, error), func(context.Context, string, any) error) {
		s := benchUpstreamSession(tb, c, etcdlock.DefaultTTL)
		return func(_ context.Context, name string) (any, error) { return concurrency.NewMutex(s, name), nil },
			func(context.Context, string, any) error { return nil }
	}},
	{name: "upstream", open: func(tb testing.TB, c *clientv3.Client) (func(context.Context, string) (any, error), func(context.Context, string, any) error) {
		s := benchUpstreamSession(tb, c, etcdlock.DefaultTTL)
		return func(ctx context.Context, name string) (any, error) {
				m := concurrency.NewMutex(s, name)
				return m, m.Lock(ctx)
			}, func(ctx context.Context, _ string, h any) error {
				return h.(*concurrency.Mutex).Unlock(ctx)
			}
	}},
	// put: what any lock costs at least, one key with the lease, put and
	// deleted with the plain client.
	{name: "put", open: func(tb testing.TB, c *clientv3.Client) (func(context.Context, string) (any, error), func(context.Context, string, any) error) {
		s := benchUpstreamSession(tb, c, etcdlock.DefaultTTL)
		key := func(name string) string { return fmt.Sprintf("%s/%x", name, s.Lease()) }
		return func(ctx context.Context, name string) (any, error) {
				_, err := c.Put(ctx, key(name), "", clientv3.WithLease(s.Lease()))
				return struct{}{}, err
			}, func(ctx context.Context, name string, _ any) error {
				_, err := c.Delete(ctx, key(name))
				return err
			}
	}},
}

// benchHoldEtcdlock opens etcdlock holds, calling Done on each if done.
func benchHoldEtcdlock(done bool) func(tb testing.TB, c *clientv3.Client) (func(context.Context, string) (any, error), func(context.Context, string, any) error) {
	return func(tb testing.TB, c *clientv3.Client) (func(context.Context, string) (any, error), func(context.Context, string, any) error) {
		var opts []etcdlock.SessionOption
		if benchHeldReread() {
			opts = append(opts, etcdlock.WithTTL(benchHeldRereadTTL))
		}
		s := benchSession(tb, c, opts...)
		return func(ctx context.Context, name string) (any, error) {
				m := etcdlock.NewMutex(s, name)
				if err := m.LockContext(ctx); err != nil {
					return nil, err
				}
				if done {
					m.Done()
				}
				return m, nil
			}, func(ctx context.Context, _ string, h any) error {
				return h.(*etcdlock.Mutex).UnlockContext(ctx)
			}
	}
}

// BenchmarkHeldLocks: one Session (one lease, one client) with n distinct
// locks: held (etcdlock, upstream), held with Mutex.Done called on each
// (etcdlock-done: each hold joins the loss watch of the Session's lease
// term, which runs one goroutine and one watch for all of them), only made
// with NewMutex and never locked (-idle), or, as the
// floor of any lock, n keys put with the lease (put). etcd runs in a child
// process, so that the heap and goroutines measured are the client's only.
// Each iteration takes the n locks, benchHeldWorkers goroutines at a time,
// measures, and releases them. Metrics, per lock:
//
//	heap-B/lock        live heap after runtime.GC, held minus before
//	stack-B/lock       goroutine stacks (MemStats.StackInuse), held minus before
//	goroutines/lock    runtime.NumGoroutine, held minus before
//	ns/op, B/op, allocs/op
//	                   wall time, bytes and allocations of taking one lock (with
//	                   etcdlock-done, of its Done and watch too)
//
// and, with ETCDLOCK_HELD_REREAD=1 (etcdlock-done, TTL 10 s), rereads/ttl:
// the Txns sent in two TTLs while the locks are held, halved;
// and, over the whole run (the Session lives through all iterations):
// keepalive-streams, the LeaseKeepAlive streams the client opened;
// keepalive-leases, the leases its keep-alive requests named; keepalives,
// the requests; and watch-streams, the Watch streams it opened per iteration
// (clientv3 closes its stream when the last watch on it ends).
func BenchmarkHeldLocks(b *testing.B) {
	endpoint, _ := childServer(b)
	for _, n := range benchHeldCounts(b) {
		b.Run(fmt.Sprintf("locks=%d", n), func(b *testing.B) {
			for _, kind := range benchHoldKinds {
				b.Run(kind.name, func(b *testing.B) { benchHeld(b, endpoint, n, kind) })
			}
		})
	}
}

func benchHeld(b *testing.B, endpoint string, n int, kind benchHoldKind) {
	ctx, cancel := context.WithTimeout(context.Background(), benchTimeout+time.Duration(n)*2*time.Millisecond)
	defer cancel()
	e := &benchServer{endpoints: []string{endpoint}}
	take, release := kind.open(b, e.client(b))
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s/%d", benchName(b), i)
	}
	held := make([]any, n) // made before the measure, so that it is not counted
	workers := min(n, benchHeldWorkers)
	var heap, stack, goroutines, took, allocated, allocs, rereads float64
	iters := 0
	for b.Loop() {
		var (
			wg         sync.WaitGroup
			taken      sync.WaitGroup
			start, end = make(chan struct{}), make(chan struct{})
			errs       = make([]error, workers)
		)
		taken.Add(workers)
		for w := range workers {
			wg.Go(func() {
				<-start
				for i := w; i < n && errs[w] == nil; i += workers {
					held[i], errs[w] = take(ctx, names[i])
				}
				taken.Done()
				<-end
				for i := w; i < n; i += workers {
					if held[i] != nil {
						if err := release(ctx, names[i], held[i]); err != nil && errs[w] == nil {
							errs[w] = err
						}
					}
					held[i] = nil
				}
			})
		}
		created := e.created.Load()
		before := benchMeasure()
		t := time.Now()
		close(start)
		taken.Wait()
		var err error
		settled := time.Now()
		if kind.done {
			settled, err = benchWaitWatches(ctx, e, created)
		}
		took += float64(settled.Sub(t))
		after := benchMeasure()
		if kind.done && benchHeldReread() {
			txns := e.txns.Load()
			time.Sleep(2 * benchHeldRereadTTL)
			rereads += float64(e.txns.Load()-txns) / 2
		}
		close(end)
		wg.Wait()
		for _, werr := range append(errs, err) {
			if werr != nil {
				b.Fatal(werr)
			}
		}
		heap += float64(after.heap) - float64(before.heap)
		stack += float64(after.stack) - float64(before.stack)
		goroutines += float64(after.goroutines - before.goroutines)
		allocated += float64(after.allocated - before.allocated)
		allocs += float64(after.allocs - before.allocs)
		iters++
	}
	locks := float64(iters * n)
	b.ReportMetric(heap/locks, "heap-B/lock")
	b.ReportMetric(stack/locks, "stack-B/lock")
	b.ReportMetric(goroutines/locks, "goroutines/lock")
	b.ReportMetric(took/locks, "ns/op")
	b.ReportMetric(allocated/locks, "B/op")
	b.ReportMetric(allocs/locks, "allocs/op")
	b.ReportMetric(float64(e.keepAliveStreams.Load()), "keepalive-streams")
	b.ReportMetric(float64(e.keptAlive()), "keepalive-leases")
	b.ReportMetric(float64(e.keepAlives.Load()), "keepalives")
	b.ReportMetric(float64(e.watchStreams.Load())/float64(iters), "watch-streams")
	if kind.done && benchHeldReread() {
		b.ReportMetric(rereads/float64(iters), "rereads/ttl")
	}
}

// benchMemory is the process's memory and goroutines at one moment.
type benchMemory struct {
	heap       uint64 // live heap: HeapAlloc right after a GC
	stack      uint64 // goroutine stacks: StackInuse
	allocated  uint64 // bytes allocated so far
	allocs     uint64 // objects allocated so far
	goroutines int
}

func benchMeasure() benchMemory {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return benchMemory{heap: ms.HeapAlloc, stack: ms.StackInuse, allocated: ms.TotalAlloc, allocs: ms.Mallocs, goroutines: runtime.NumGoroutine()}
}

// benchWaitWatches waits until the loss signals asked for are watched:
// etcd has confirmed a watch creation to e's clients since created were,
// has confirmed every creation sent, and none came for 200 ms. It returns
// when the last came.
func benchWaitWatches(ctx context.Context, e *benchServer, created int64) (time.Time, error) {
	const quiet = 200 * time.Millisecond
	last, since := e.created.Load(), time.Now()
	for {
		now := e.created.Load()
		switch {
		case now != last || e.watches.Load() != now:
			last, since = now, time.Now()
		case now > created && time.Since(since) >= quiet:
			return since, nil
		}
		t := time.NewTimer(time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return since, fmt.Errorf("%d watches confirmed, %d sent: %w", e.created.Load(), e.watches.Load(), ctx.Err())
		case <-t.C:
		}
	}
}
