package etcdlock_test

// Benchmarks of etcdlock.Mutex side by side with concurrency.Mutex
// (client/v3 v3.7.3): each pair, Benchmark…/etcdlock and Benchmark…/upstream,
// runs in the same process on the same embedded etcd. scripts/bench.sh runs
// them and prints the ratios of the medians; docs/benchmarks.md has the
// figures and what limits each one.
//
// Custom metrics, per operation unless named otherwise:
//
//	writes/op     etcd revisions consumed (puts and deletes), from the revision delta
//	rpcs/op       unary RPCs sent by the measured clients (every attempt, retries included)
//	watches/op    watches created by the measured clients
//	acq/s         acquisitions per second, all holders together
//	handoff-p50-ms, handoff-p99-ms
//	              from the moment a holder starts its unlock to the moment the next
//	              holder's lock returns, over the acquisitions that changed holder
//	max-keys      most keys under the lock's prefix at any one time, replayed
//	              from etcd's history after the run

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
)

// benchTimeout bounds every lock call of a benchmark, so that a hang fails
// the run instead of stalling it.
const benchTimeout = 2 * time.Minute

// A benchServer is the embedded etcd shared by the two halves of a pair,
// with counters of what the measured clients send it.
type benchServer struct {
	srv   *etcdtest.Server
	plain *clientv3.Client // not counted: revisions, key watches, other holders

	unary   atomic.Int64
	watches atomic.Int64
}

func startBench(b *testing.B) *benchServer {
	b.Helper()
	srv := etcdtest.Start(b)
	return &benchServer{srv: srv, plain: srv.Client(b)}
}

// client returns a new client whose RPCs are counted, closed by b.Cleanup.
func (e *benchServer) client(b *testing.B) *clientv3.Client {
	b.Helper()
	unary := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		e.unary.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	stream := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil || method != "/etcdserverpb.Watch/Watch" {
			return cs, err
		}
		return &benchCountingStream{ClientStream: cs, creates: &e.watches}, nil
	}
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   e.srv.Endpoints(),
		DialTimeout: 5 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(unary), grpc.WithChainStreamInterceptor(stream)},
		Logger:      zap.NewNop(),
	})
	if err != nil {
		b.Fatalf("new client: %v", err)
	}
	b.Cleanup(func() { _ = c.Close() })
	return c
}

// benchCountingStream counts the watch creations sent on a Watch stream.
type benchCountingStream struct {
	grpc.ClientStream
	creates *atomic.Int64
}

func (s *benchCountingStream) SendMsg(m any) error {
	if req, ok := m.(*pb.WatchRequest); ok && req.GetCreateRequest() != nil {
		s.creates.Add(1)
	}
	return s.ClientStream.SendMsg(m)
}

// revision returns etcd's current revision.
func (e *benchServer) revision(b *testing.B) int64 {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
	defer cancel()
	resp, err := e.plain.Get(ctx, "\x00")
	if err != nil {
		b.Fatalf("get revision: %v", err)
	}
	return resp.Header.Revision
}

// A benchMeter counts etcd writes, RPCs and watches from start to report.
type benchMeter struct {
	e                   *benchServer
	rev, unary, watches int64
}

func (e *benchServer) startMeter(b *testing.B) *benchMeter {
	b.Helper()
	m := &benchMeter{e: e, rev: e.revision(b)}
	m.unary, m.watches = e.unary.Load(), e.watches.Load()
	return m
}

// report reports writes/op, rpcs/op and watches/op over ops operations.
func (m *benchMeter) report(b *testing.B, ops int) {
	b.Helper()
	unary, watches := m.e.unary.Load()-m.unary, m.e.watches.Load()-m.watches
	writes := m.e.revision(b) - m.rev
	b.ReportMetric(float64(writes)/float64(ops), "writes/op")
	b.ReportMetric(float64(unary)/float64(ops), "rpcs/op")
	b.ReportMetric(float64(watches)/float64(ops), "watches/op")
}

// benchName returns a lock name of the benchmark's own.
func benchName(b *testing.B) string {
	return "bench/" + strings.ReplaceAll(b.Name(), "/", "_")
}

// A benchLocker is one holder of a lock: an etcdlock.Mutex or a
// concurrency.Mutex.
type benchLocker interface {
	Lock(ctx context.Context) error
	Unlock(ctx context.Context) error
}

type etcdlockLocker struct{ m *etcdlock.Mutex }

func (l etcdlockLocker) Lock(ctx context.Context) error   { return l.m.LockContext(ctx) }
func (l etcdlockLocker) Unlock(ctx context.Context) error { return l.m.UnlockContext(ctx) }

// A benchImpl makes sessions of one of the two libraries. A session returns
// lockers on it: newLocker(name) is a new handle of the lock name.
type benchImpl struct {
	name       string
	newSession func(b *testing.B, c *clientv3.Client) (newLocker func(name string) benchLocker)
}

var benchImpls = []benchImpl{
	{"etcdlock", func(b *testing.B, c *clientv3.Client) func(string) benchLocker {
		s := benchSession(b, c)
		return func(name string) benchLocker { return etcdlockLocker{etcdlock.NewMutex(s, name)} }
	}},
	{"upstream", func(b *testing.B, c *clientv3.Client) func(string) benchLocker {
		s := benchUpstreamSession(b, c)
		return func(name string) benchLocker { return concurrency.NewMutex(s, name) }
	}},
}

// benchSession makes a Session with the default TTL, closed by b.Cleanup.
func benchSession(b *testing.B, c *clientv3.Client, opts ...etcdlock.SessionOption) *etcdlock.Session {
	b.Helper()
	s, err := etcdlock.NewSession(c, opts...)
	if err != nil {
		b.Fatalf("NewSession: %v", err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

// benchUpstreamSession makes a concurrency.Session with the same TTL as
// benchSession, closed by b.Cleanup.
func benchUpstreamSession(b *testing.B, c *clientv3.Client) *concurrency.Session {
	b.Helper()
	s, err := concurrency.NewSession(c, concurrency.WithTTL(int(etcdlock.DefaultTTL/time.Second)))
	if err != nil {
		b.Fatalf("concurrency.NewSession: %v", err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

// forEachImpl runs one sub-benchmark per library on the same server.
func forEachImpl(b *testing.B, e *benchServer, f func(b *testing.B, e *benchServer, impl benchImpl)) {
	for _, impl := range benchImpls {
		b.Run(impl.name, func(b *testing.B) { f(b, e, impl) })
	}
}

// BenchmarkUncontended: one holder locks and unlocks a lock nobody else
// wants. One op is a LockContext and an UnlockContext (upstream: Lock(ctx)
// and Unlock(ctx)).
func BenchmarkUncontended(b *testing.B) {
	forEachImpl(b, startBench(b), func(b *testing.B, e *benchServer, impl benchImpl) {
		l := impl.newSession(b, e.client(b))(benchName(b))
		ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
		defer cancel()
		m := e.startMeter(b)
		for b.Loop() {
			if err := l.Lock(ctx); err != nil {
				b.Fatalf("Lock: %v", err)
			}
			if err := l.Unlock(ctx); err != nil {
				b.Fatalf("Unlock: %v", err)
			}
		}
		m.report(b, b.N)
	})
}

// BenchmarkFencedDelete prices the fence of UnlockContext (D6), without a
// lock: one op puts a key and deletes it, with a plain Delete as
// concurrency.Mutex's Unlock does, or with a Txn that deletes the key only if
// its create revision is the put's, as UnlockContext does.
func BenchmarkFencedDelete(b *testing.B) {
	e := startBench(b)
	c := e.client(b)
	ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
	defer cancel()
	b.Run("delete", func(b *testing.B) {
		key := benchName(b)
		for b.Loop() {
			if _, err := c.Put(ctx, key, ""); err != nil {
				b.Fatalf("Put: %v", err)
			}
			if _, err := c.Delete(ctx, key); err != nil {
				b.Fatalf("Delete: %v", err)
			}
		}
	})
	b.Run("fenced-delete", func(b *testing.B) {
		key := benchName(b)
		for b.Loop() {
			put, err := c.Put(ctx, key, "")
			if err != nil {
				b.Fatalf("Put: %v", err)
			}
			resp, err := c.Txn(ctx).
				If(clientv3.Compare(clientv3.CreateRevision(key), "=", put.Header.Revision)).
				Then(clientv3.OpDelete(key)).
				Commit()
			if err != nil || !resp.Succeeded {
				b.Fatalf("fenced delete: succeeded %v, err %v; want true, nil", resp != nil && resp.Succeeded, err)
			}
		}
	})
}

// BenchmarkRelock: the goroutine that holds the lock locks it again and
// unlocks. Upstream has no reentrancy (a second Lock on the same Session
// returns at once, and one Unlock frees it for everyone), so there is no
// upstream half.
func BenchmarkRelock(b *testing.B) {
	e := startBench(b)
	b.Run("etcdlock", func(b *testing.B) {
		m := etcdlock.NewMutex(benchSession(b, e.client(b)), benchName(b))
		ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
		defer cancel()
		if err := m.LockContext(ctx); err != nil {
			b.Fatalf("LockContext: %v", err)
		}
		mt := e.startMeter(b)
		for b.Loop() {
			if err := m.LockContext(ctx); err != nil {
				b.Fatalf("re-lock: %v", err)
			}
			if err := m.UnlockContext(ctx); err != nil {
				b.Fatalf("unlock of the re-lock: %v", err)
			}
		}
		b.StopTimer()
		mt.report(b, b.N)
		if got := m.HoldCount(); got != 1 {
			b.Fatalf("HoldCount after the loop: got %d, want 1", got)
		}
		if err := m.UnlockContext(ctx); err != nil {
			b.Fatalf("UnlockContext: %v", err)
		}
	})
}

// BenchmarkTryLockHeld: TryLock on a lock that another Session holds, on a
// client of its own. Every try must fail.
func BenchmarkTryLockHeld(b *testing.B) {
	e := startBench(b)
	b.Run("etcdlock", func(b *testing.B) {
		ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
		defer cancel()
		name := benchName(b)
		holder := etcdlock.NewMutex(benchSession(b, e.plain), name)
		if err := holder.LockContext(ctx); err != nil {
			b.Fatalf("holder LockContext: %v", err)
		}
		m := etcdlock.NewMutex(benchSession(b, e.client(b)), name)
		mt := e.startMeter(b)
		for b.Loop() {
			if m.TryLock() {
				b.Fatal("TryLock took a lock held by another Session")
			}
		}
		b.StopTimer()
		mt.report(b, b.N)
		if err := holder.UnlockContext(ctx); err != nil {
			b.Fatalf("holder UnlockContext: %v", err)
		}
	})
	b.Run("upstream", func(b *testing.B) {
		ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
		defer cancel()
		name := benchName(b)
		holder := concurrency.NewMutex(benchUpstreamSession(b, e.plain), name)
		if err := holder.Lock(ctx); err != nil {
			b.Fatalf("holder Lock: %v", err)
		}
		m := concurrency.NewMutex(benchUpstreamSession(b, e.client(b)), name)
		mt := e.startMeter(b)
		for b.Loop() {
			if err := m.TryLock(ctx); !errors.Is(err, concurrency.ErrLocked) {
				b.Fatalf("TryLock on a lock held by another Session: got %v, want %v", err, concurrency.ErrLocked)
			}
		}
		b.StopTimer()
		mt.report(b, b.N)
		if err := holder.Unlock(ctx); err != nil {
			b.Fatalf("holder Unlock: %v", err)
		}
	})
}

// benchCounts are the numbers of holders or locks of the scaling benchmarks.
var benchCounts = []int{2, 8, 32}

// benchHandoffs is the WithLocalHandoff bound of BenchmarkOneProcess's
// hand-off variant: at most 8 local holds in a row keep the key.
const benchHandoffs = 8

// BenchmarkContended: n Sessions, each on a client of its own as separate
// processes would be, take turns on one lock. One op is one acquisition.
func BenchmarkContended(b *testing.B) {
	for _, n := range benchCounts {
		b.Run(fmt.Sprintf("sessions=%d", n), func(b *testing.B) {
			forEachImpl(b, startBench(b), func(b *testing.B, e *benchServer, impl benchImpl) {
				name := benchName(b)
				lockers := make([]benchLocker, n)
				for i := range lockers {
					lockers[i] = impl.newSession(b, e.client(b))(name)
				}
				benchContend(b, e, lockers, false)
			})
		})
	}
}

// BenchmarkOneProcess: n goroutines of one process, on one client, take
// turns on one lock. etcdlock: one Session and one Mutex shared by all, with
// the default Session, and with WithLocalHandoff(benchHandoffs). Upstream: a
// Session per goroutine, since goroutines sharing a Session all hold the
// lock at once (D1). One op is one acquisition.
func BenchmarkOneProcess(b *testing.B) {
	etcdlockRun := func(e *benchServer, n int, opts ...etcdlock.SessionOption) func(b *testing.B) {
		return func(b *testing.B) {
			m := etcdlock.NewMutex(benchSession(b, e.client(b), opts...), benchName(b))
			lockers := make([]benchLocker, n)
			for i := range lockers {
				lockers[i] = etcdlockLocker{m}
			}
			benchContend(b, e, lockers, false)
		}
	}
	for _, n := range benchCounts {
		b.Run(fmt.Sprintf("goroutines=%d", n), func(b *testing.B) {
			e := startBench(b)
			b.Run("etcdlock", etcdlockRun(e, n))
			b.Run(fmt.Sprintf("etcdlock-handoff%d", benchHandoffs), etcdlockRun(e, n, etcdlock.WithLocalHandoff(benchHandoffs)))
			b.Run("upstream", func(b *testing.B) {
				c, name := e.client(b), benchName(b)
				lockers := make([]benchLocker, n)
				for i := range lockers {
					lockers[i] = concurrency.NewMutex(benchUpstreamSession(b, c), name)
				}
				benchContend(b, e, lockers, false)
			})
		})
	}
}

// BenchmarkIndependent: n goroutines of one process, on one client and one
// Session, each lock and unlock a lock of their own. One op is one lock and
// unlock pair.
func BenchmarkIndependent(b *testing.B) {
	for _, n := range append([]int{1}, benchCounts[1:]...) {
		b.Run(fmt.Sprintf("locks=%d", n), func(b *testing.B) {
			forEachImpl(b, startBench(b), func(b *testing.B, e *benchServer, impl benchImpl) {
				newLocker, name := impl.newSession(b, e.client(b)), benchName(b)
				lockers := make([]benchLocker, n)
				for i := range lockers {
					lockers[i] = newLocker(fmt.Sprintf("%s-%d", name, i))
				}
				benchContend(b, e, lockers, true)
			})
		})
	}
}

// benchContend runs each locker in a goroutine of its own, lock then unlock
// in a loop, b.N acquisitions in all, and reports acq/s. It fails if two
// holders of one lock overlap. Unless independent, the lockers are holders of
// one lock: it then also reports the handoff percentiles and the most keys
// the lock had at once.
func benchContend(b *testing.B, e *benchServer, lockers []benchLocker, independent bool) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
	defer cancel()
	var keys *benchKeyWatch
	if !independent {
		keys = benchWatchKeys(b, e.plain, benchName(b))
	}

	var (
		claimed  atomic.Int64                         // acquisitions started
		inside   = make([]atomic.Int32, len(lockers)) // holders of each lock
		overlaps atomic.Int64
		prev     atomic.Int64 // id of the last holder to start unlocking; 0: none yet
		unlockAt atomic.Int64 // when it started, in ns since t0
		errOnce  sync.Once
		firstErr error
		wg       sync.WaitGroup
	)
	fail := func(err error) { errOnce.Do(func() { firstErr = err }) }
	handoffs := make([][]time.Duration, len(lockers))
	mt := e.startMeter(b)
	b.ResetTimer()
	t0 := time.Now()
	for i, l := range lockers {
		id, lock := int64(i+1), 0
		if independent {
			lock = i
		}
		wg.Go(func() {
			for claimed.Add(1) <= int64(b.N) {
				if err := l.Lock(ctx); err != nil {
					fail(fmt.Errorf("holder %d: Lock: %w", id, err))
					return
				}
				locked := time.Since(t0)
				if inside[lock].Add(1) != 1 {
					overlaps.Add(1)
				}
				if p := prev.Load(); !independent && p != 0 && p != id {
					handoffs[i] = append(handoffs[i], locked-time.Duration(unlockAt.Load()))
				}
				inside[lock].Add(-1)
				prev.Store(id)
				unlockAt.Store(int64(time.Since(t0)))
				if err := l.Unlock(ctx); err != nil {
					fail(fmt.Errorf("holder %d: Unlock: %w", id, err))
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(t0)
	b.StopTimer()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	if n := overlaps.Load(); n > 0 {
		b.Fatalf("%d acquisitions overlapped another holder, want 0", n)
	}
	mt.report(b, b.N)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "acq/s")
	if all := slices.Concat(handoffs...); len(all) > 0 {
		slices.Sort(all)
		b.ReportMetric(benchPercentile(all, 0.50).Seconds()*1e3, "handoff-p50-ms")
		b.ReportMetric(benchPercentile(all, 0.99).Seconds()*1e3, "handoff-p99-ms")
	}
	if keys != nil {
		b.ReportMetric(float64(keys.stop(b)), "max-keys")
	}
}

// benchPercentile returns the q-quantile of sorted, by the nearest rank.
func benchPercentile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// A benchKeyWatch counts the keys under a lock's prefix over a run. It
// replays etcd's history of the prefix once the run is over, in revision
// order, so that no watch adds work to the measured part, and returns the
// most keys that existed at once.
type benchKeyWatch struct {
	client *clientv3.Client
	pfx    string
	from   int64 // the revision at the start
	live   map[string]bool
}

func benchWatchKeys(b *testing.B, c *clientv3.Client, name string) *benchKeyWatch {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
	defer cancel()
	pfx := name + "/"
	resp, err := c.Get(ctx, pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		b.Fatalf("get keys of %q: %v", name, err)
	}
	w := &benchKeyWatch{client: c, pfx: pfx, from: resp.Header.Revision, live: make(map[string]bool)}
	for _, kv := range resp.Kvs {
		w.live[string(kv.Key)] = true
	}
	return w
}

// stop replays every change under the prefix since the start, up to a mark
// it puts under the prefix, and returns the most keys seen at once.
func (w *benchKeyWatch) stop(b *testing.B) int {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
	defer cancel()
	end := w.pfx + "end/"
	if _, err := w.client.Put(ctx, end, ""); err != nil {
		b.Fatalf("put %q: %v", end, err)
	}
	defer func() { _, _ = w.client.Delete(ctx, end) }()
	most := len(w.live)
	wch := w.client.Watch(ctx, w.pfx, clientv3.WithPrefix(), clientv3.WithRev(w.from+1))
	for wr := range wch {
		if err := wr.Err(); err != nil {
			b.Fatalf("replay of %q: %v", w.pfx, err)
		}
		for _, ev := range wr.Events {
			key := string(ev.Kv.Key)
			switch {
			case key == end:
				return most
			case ev.Type == clientv3.EventTypePut:
				w.live[key] = true
			default:
				delete(w.live, key)
			}
			most = max(most, len(w.live))
		}
	}
	b.Fatalf("replay of %q: the watch ended before the end mark", w.pfx)
	return 0
}
