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
//	cpu-us/op     CPU time of the whole process (user and system, every thread:
//	              etcd's server and all the clients together), in microseconds
//	cpu-cores     the same CPU time over the wall time of the run: 2 is both cores busy
//	              (with etcd in a child process: the clients' process only)
//	etcd-cpu-us/op, etcd-cores
//	              with etcd in a child process, the same for etcd's process
//	etcd-rss-MB   with etcd in a child process, its resident memory when the clock starts
//	etcd-rss-end-MB  the same at the last acquisition
//	etcd-peak-MB  its most resident memory during the run (VmHWM, reset at the start)
//	acq/s         acquisitions per second, all holders together
//	handoff-p50-ms, handoff-p90-ms, handoff-p99-ms, handoff-max-ms
//	              from the moment a holder starts its unlock to the moment the next
//	              holder's lock returns, over the acquisitions that changed holder
//	max-keys      most keys under the lock's prefix at any one time, replayed
//	              from etcd's history after the run
//
// How cost grows with waiters and with held locks is in bench_waiting_test.go,
// bench_scale_test.go and bench_held_test.go.

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

// A benchServer is the etcd shared by the two halves of a pair, with
// counters of what the measured clients send it.
type benchServer struct {
	endpoints []string
	plain     *clientv3.Client // not counted: revisions, key watches, other holders
	// child is the process id of etcd when it runs in a child process
	// (childServer), whose CPU time and memory the meters then read; 0 when
	// etcd is embedded.
	child int
	// timeout bounds benchContend, queueing included; 0: benchTimeout.
	timeout time.Duration
	// queueBatch is how many waiters of a benchQueued run join the queue
	// at once, each batch once the one before is queued; 0: all at once.
	queueBatch int

	unary   atomic.Int64
	txns    atomic.Int64 // of which Txns
	watches atomic.Int64 // watch creations sent
	created atomic.Int64 // watch creations confirmed by etcd

	watchStreams     atomic.Int64 // Watch streams opened
	keepAliveStreams atomic.Int64 // LeaseKeepAlive streams opened
	keepAlives       atomic.Int64 // keep-alive requests sent on them
	leasesMu         sync.Mutex
	leases           map[int64]bool // leases named in those requests
}

// startBench starts an embedded etcd (etcdtest.Start with opts) for a
// benchmark.
func startBench(b *testing.B, opts ...etcdtest.Option) *benchServer {
	b.Helper()
	srv := etcdtest.Start(b, opts...)
	return &benchServer{endpoints: srv.Endpoints(), plain: srv.Client(b)}
}

// client returns a new client whose RPCs and streams are counted, closed by
// tb.Cleanup.
func (e *benchServer) client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	unary := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		e.unary.Add(1)
		if method == "/etcdserverpb.KV/Txn" {
			e.txns.Add(1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	stream := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return cs, err
		}
		switch method {
		case "/etcdserverpb.Watch/Watch":
			e.watchStreams.Add(1)
		case "/etcdserverpb.Lease/LeaseKeepAlive":
			e.keepAliveStreams.Add(1)
		default:
			return cs, nil
		}
		return &benchCountingStream{ClientStream: cs, e: e}, nil
	}
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   e.endpoints,
		DialTimeout: 5 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(unary), grpc.WithChainStreamInterceptor(stream)},
		Logger:      zap.NewNop(),
	})
	if err != nil {
		tb.Fatalf("new client: %v", err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// benchCountingStream counts the watch creations sent and confirmed on a
// Watch stream, and the keep-alive requests sent on a LeaseKeepAlive stream
// with the leases they name.
type benchCountingStream struct {
	grpc.ClientStream
	e *benchServer
}

func (s *benchCountingStream) SendMsg(m any) error {
	switch req := m.(type) {
	case *pb.WatchRequest:
		if req.GetCreateRequest() != nil {
			s.e.watches.Add(1)
		}
	case *pb.LeaseKeepAliveRequest:
		s.e.keepAlives.Add(1)
		s.e.leasesMu.Lock()
		if s.e.leases == nil {
			s.e.leases = make(map[int64]bool)
		}
		s.e.leases[req.ID] = true
		s.e.leasesMu.Unlock()
	}
	return s.ClientStream.SendMsg(m)
}

func (s *benchCountingStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if resp, ok := m.(*pb.WatchResponse); ok && err == nil && resp.Created {
		s.e.created.Add(1)
	}
	return err
}

// keptAlive returns how many leases keep-alive requests have named so far.
func (e *benchServer) keptAlive() int {
	e.leasesMu.Lock()
	defer e.leasesMu.Unlock()
	return len(e.leases)
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

// A benchSnapshot is what the measured clients and the process have done up
// to a moment. Taking one sends no RPC.
type benchSnapshot struct {
	at             time.Time
	cpu            time.Duration // CPU time of the whole process; valid if cpuOK
	cpuOK          bool
	unary, watches int64
	etcd           benchProc // etcd's process, when it runs in a child
}

func (e *benchServer) counts() benchSnapshot {
	cpu, ok := benchCPU()
	s := benchSnapshot{at: time.Now(), cpu: cpu, cpuOK: ok, unary: e.unary.Load(), watches: e.watches.Load()}
	if e.child != 0 {
		s.etcd = benchReadProc(e.child)
	}
	return s
}

// callTimeout returns what bounds benchContend.
func (e *benchServer) callTimeout() time.Duration {
	if e.timeout > 0 {
		return e.timeout
	}
	return benchTimeout
}

// A benchMeter counts etcd writes, RPCs, watches and CPU time from its start
// to a report.
type benchMeter struct {
	e     *benchServer
	rev   int64
	start benchSnapshot
}

func (e *benchServer) startMeter(b *testing.B) *benchMeter {
	b.Helper()
	m := &benchMeter{e: e, rev: e.revision(b)}
	if e.child != 0 {
		benchResetPeak(e.child)
	}
	m.start = e.counts()
	return m
}

// report reports writes/op, rpcs/op, watches/op, cpu-us/op and cpu-cores
// over ops operations, from the start to now.
func (m *benchMeter) report(b *testing.B, ops int) {
	b.Helper()
	m.reportUntil(b, ops, m.e.counts())
	writes := m.e.revision(b) - m.rev
	b.ReportMetric(float64(writes)/float64(ops), "writes/op")
}

// reportUntil reports what report does, but writes/op, from the start to
// end; with etcd in a child process, also etcd's own CPU time and memory.
func (m *benchMeter) reportUntil(b *testing.B, ops int, end benchSnapshot) {
	b.Helper()
	b.ReportMetric(float64(end.unary-m.start.unary)/float64(ops), "rpcs/op")
	b.ReportMetric(float64(end.watches-m.start.watches)/float64(ops), "watches/op")
	wall := end.at.Sub(m.start.at)
	if m.start.cpuOK && end.cpuOK {
		cpu := end.cpu - m.start.cpu
		b.ReportMetric(float64(cpu.Microseconds())/float64(ops), "cpu-us/op")
		if wall > 0 {
			b.ReportMetric(cpu.Seconds()/wall.Seconds(), "cpu-cores")
		}
	}
	if m.start.etcd.ok && end.etcd.ok {
		cpu := end.etcd.cpu - m.start.etcd.cpu
		b.ReportMetric(float64(cpu.Microseconds())/float64(ops), "etcd-cpu-us/op")
		if wall > 0 {
			b.ReportMetric(cpu.Seconds()/wall.Seconds(), "etcd-cores")
		}
		b.ReportMetric(float64(m.start.etcd.rss)/(1<<20), "etcd-rss-MB")
		b.ReportMetric(float64(end.etcd.rss)/(1<<20), "etcd-rss-end-MB")
		b.ReportMetric(float64(end.etcd.peak)/(1<<20), "etcd-peak-MB")
	}
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
	newSession func(tb testing.TB, c *clientv3.Client) (newLocker func(name string) benchLocker)
}

var benchImpls = []benchImpl{
	{"etcdlock", func(tb testing.TB, c *clientv3.Client) func(string) benchLocker {
		s := benchSession(tb, c)
		return func(name string) benchLocker { return etcdlockLocker{etcdlock.NewMutex(s, name)} }
	}},
	{"upstream", func(tb testing.TB, c *clientv3.Client) func(string) benchLocker {
		s := benchUpstreamSession(tb, c, etcdlock.DefaultTTL)
		return func(name string) benchLocker { return concurrency.NewMutex(s, name) }
	}},
}

// benchSession makes a Session (by default with the default TTL), closed
// by tb.Cleanup.
func benchSession(tb testing.TB, c *clientv3.Client, opts ...etcdlock.SessionOption) *etcdlock.Session {
	tb.Helper()
	s, err := etcdlock.NewSession(c, opts...)
	if err != nil {
		tb.Fatalf("NewSession: %v", err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s
}

// benchUpstreamSession makes a concurrency.Session with a TTL of ttl,
// closed by tb.Cleanup.
func benchUpstreamSession(tb testing.TB, c *clientv3.Client, ttl time.Duration) *concurrency.Session {
	tb.Helper()
	s, err := concurrency.NewSession(c, concurrency.WithTTL(int(ttl/time.Second)))
	if err != nil {
		tb.Fatalf("concurrency.NewSession: %v", err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s
}

// A benchScope is a testing.TB for what must be closed before the benchmark
// ends: its cleanups run, newest first, when close is called.
type benchScope struct {
	testing.TB
	cleanups []func()
}

func (s *benchScope) Cleanup(f func()) { s.cleanups = append(s.cleanups, f) }

func (s *benchScope) close() {
	for _, f := range slices.Backward(s.cleanups) {
		f()
	}
	s.cleanups = nil
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
	forEachImpl(b, startBench(b), benchUncontended)
}

func benchUncontended(b *testing.B, e *benchServer, impl benchImpl) {
	benchLockUnlock(b, e, impl.newSession(b, e.client(b))(benchName(b)))
}

// benchLockUnlock measures one holder that locks and unlocks l, which nobody
// else wants: one op is a Lock and an Unlock.
func benchLockUnlock(b *testing.B, e *benchServer, l benchLocker) {
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
}

// BenchmarkFsync: BenchmarkUncontended and BenchmarkContended/sessions=2 on
// an etcd that fsyncs its log and backend (etcdtest.WithFsync), as a
// production etcd does, with its data in a temporary directory: on the disk
// of TMPDIR, /tmp by default.
func BenchmarkFsync(b *testing.B) {
	b.Run("Uncontended", func(b *testing.B) {
		forEachImpl(b, startBench(b, etcdtest.WithFsync()), benchUncontended)
	})
	b.Run("Contended/sessions=2", func(b *testing.B) {
		forEachImpl(b, startBench(b, etcdtest.WithFsync()), benchSessions(2))
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
		holder := concurrency.NewMutex(benchUpstreamSession(b, e.plain, etcdlock.DefaultTTL), name)
		if err := holder.Lock(ctx); err != nil {
			b.Fatalf("holder Lock: %v", err)
		}
		m := concurrency.NewMutex(benchUpstreamSession(b, e.client(b), etcdlock.DefaultTTL), name)
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

// BenchmarkTryLockFree: TryLock on a free lock, then UnlockContext (upstream:
// TryLock(ctx) and Unlock(ctx)). One op is the pair; rpcs/op counts both.
func BenchmarkTryLockFree(b *testing.B) {
	e := startBench(b)
	b.Run("etcdlock", func(b *testing.B) {
		ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
		defer cancel()
		m := etcdlock.NewMutex(benchSession(b, e.client(b)), benchName(b))
		mt := e.startMeter(b)
		for b.Loop() {
			if !m.TryLock() {
				b.Fatal("TryLock of a free lock: got false")
			}
			if err := m.UnlockContext(ctx); err != nil {
				b.Fatalf("UnlockContext: %v", err)
			}
		}
		b.StopTimer()
		mt.report(b, b.N)
	})
	b.Run("upstream", func(b *testing.B) {
		ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
		defer cancel()
		m := concurrency.NewMutex(benchUpstreamSession(b, e.client(b), etcdlock.DefaultTTL), benchName(b))
		mt := e.startMeter(b)
		for b.Loop() {
			if err := m.TryLock(ctx); err != nil {
				b.Fatalf("TryLock of a free lock: %v", err)
			}
			if err := m.Unlock(ctx); err != nil {
				b.Fatalf("Unlock: %v", err)
			}
		}
		b.StopTimer()
		mt.report(b, b.N)
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
			forEachImpl(b, startBench(b), benchSessions(n))
		})
	}
}

// benchSessions returns the body of BenchmarkContended for n sessions.
func benchSessions(n int) func(b *testing.B, e *benchServer, impl benchImpl) {
	return func(b *testing.B, e *benchServer, impl benchImpl) {
		name := benchName(b)
		lockers := make([]benchLocker, n)
		for i := range lockers {
			lockers[i] = impl.newSession(b, e.client(b))(name)
		}
		benchContend(b, e, name, lockers, benchOneLock)
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
			benchContend(b, e, benchName(b), lockers, benchOneLock)
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
					lockers[i] = concurrency.NewMutex(benchUpstreamSession(b, c, etcdlock.DefaultTTL), name)
				}
				benchContend(b, e, benchName(b), lockers, benchOneLock)
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
				benchContend(b, e, name, lockers, benchIndependent)
			})
		})
	}
}

// How the lockers of benchContend contend.
type benchContention int

const (
	// benchOneLock: the lockers take turns on one lock. Each joins the
	// queue when its goroutine starts, and leaves once b.N acquisitions
	// have been claimed.
	benchOneLock benchContention = iota
	// benchIndependent: each locker has a lock of its own.
	benchIndependent
	// benchQueued: one lock, and every locker waits in its queue before the
	// clock starts: the first holds the lock until each of the others has a
	// key under its prefix and a watch (waitQueue). The clock stops at the
	// b.N-th acquisition, which also cancels the others' waits, so the
	// queue stays full for the whole run whatever b.N is. writes/op and
	// max-keys are not reported; leftover-keys is the number of keys the
	// cancelled waits left under the prefix (deleted before the next run).
	benchQueued
)

// benchContend runs each locker in a goroutine of its own, lock then unlock
// in a loop, b.N acquisitions in all, and reports acq/s. It fails if two
// holders of one lock overlap. Unless independent, the lockers are holders of
// the lock name: it then also reports the hand-off percentiles and, for
// benchOneLock, the most keys the lock had at once.
func benchContend(b *testing.B, e *benchServer, name string, lockers []benchLocker, how benchContention) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e.callTimeout())
	defer cancel()
	// runCtx is the lock calls' context: a failure ends it, and so does the
	// last acquisition of a queued run.
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	// Each locker's lock calls have a context of their own, so that the
	// waits of a queued run can be ended a batch at a time (queueBatch).
	lockCtx := make([]context.Context, len(lockers))
	stopLock := make([]context.CancelFunc, len(lockers))
	for i := range lockers {
		lockCtx[i], stopLock[i] = context.WithCancel(runCtx)
		defer stopLock[i]()
	}
	finished := make(chan struct{})                 // queued: closed at the b.N-th acquisition
	returned := make([]chan struct{}, len(lockers)) // closed when a locker's goroutine ends
	for i := range returned {
		returned[i] = make(chan struct{})
	}
	var keys *benchKeyWatch
	if how == benchOneLock {
		keys = benchWatchKeys(b, e.plain, name)
	}
	queued := how == benchQueued

	var (
		claimed  atomic.Int64                         // acquisitions started (not queued)
		acquired atomic.Int64                         // acquisitions made
		inside   = make([]atomic.Int32, len(lockers)) // holders of each lock
		overlaps atomic.Int64
		prev     atomic.Int64  // id of the last holder to start unlocking; 0: none yet
		unlockAt atomic.Int64  // when it started, in ns since t0
		over     atomic.Bool   // queued: the b.N-th acquisition was made
		end      benchSnapshot // queued: at the b.N-th acquisition
		errOnce  sync.Once
		firstErr error
		wg       sync.WaitGroup
		started  = make(chan struct{}) // closed when the clock starts, after t0 is set
		t0       time.Time
	)
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err })
		stopRun()
	}
	handoffs := make([][]time.Duration, len(lockers))
	run := func(i int, l benchLocker) {
		id, lock := int64(i+1), 0
		if how == benchIndependent {
			lock = i
		}
		for queued || claimed.Add(1) <= int64(b.N) {
			if err := l.Lock(lockCtx[i]); err != nil {
				if !over.Load() {
					fail(fmt.Errorf("holder %d: Lock: %w", id, err))
				}
				return
			}
			// Already closed: no acquisition can be made before the clock
			// starts, but only this receive tells the race detector so.
			<-started
			locked := time.Since(t0)
			n := acquired.Add(1)
			if inside[lock].Add(1) != 1 {
				overlaps.Add(1)
			}
			if p := prev.Load(); how != benchIndependent && p != 0 && p != id && n <= int64(b.N) {
				handoffs[i] = append(handoffs[i], locked-time.Duration(unlockAt.Load()))
			}
			inside[lock].Add(-1)
			if queued && n == int64(b.N) {
				end = e.counts()
				over.Store(true)
				close(finished)
			}
			prev.Store(id)
			unlockAt.Store(int64(time.Since(t0)))
			if err := l.Unlock(ctx); err != nil {
				fail(fmt.Errorf("holder %d: Unlock: %w", id, err))
				return
			}
			if queued && n >= int64(b.N) {
				return
			}
		}
	}

	first := 0 // the lockers started before the clock
	if queued {
		// The first locker holds the lock while the others queue, and its
		// release is the first hand-off.
		holding := make(chan struct{})
		wg.Go(func() {
			defer close(returned[0])
			if err := lockers[0].Lock(lockCtx[0]); err != nil {
				fail(fmt.Errorf("holder 1: Lock: %w", err))
				return
			}
			close(holding)
			<-started
			prev.Store(1)
			unlockAt.Store(int64(time.Since(t0)))
			if err := lockers[0].Unlock(ctx); err != nil {
				fail(fmt.Errorf("holder 1: Unlock: %w", err))
				return
			}
			run(0, lockers[0])
		})
		select {
		case <-holding:
			created := e.created.Load()
			batch := e.queueBatch
			if batch <= 0 {
				batch = len(lockers)
			}
			for i := 1; i < len(lockers); i++ {
				wg.Go(func() { defer close(returned[i]); run(i, lockers[i]) })
				if i%batch != 0 && i < len(lockers)-1 {
					continue
				}
				if err := e.waitQueue(runCtx, name, i+1, created); err != nil {
					fail(fmt.Errorf("waiting for %d sessions to queue for %q: %w", i+1, name, err))
					break
				}
			}
		case <-runCtx.Done():
		}
		first = len(lockers)
	}
	mt := e.startMeter(b)
	b.ResetTimer()
	t0 = time.Now()
	close(started)
	for i := first; i < len(lockers); i++ {
		wg.Go(func() { defer close(returned[i]); run(i, lockers[i]) })
	}
	leftover := 0
	if queued {
		select { // the b.N-th acquisition, or a failure
		case <-finished:
		case <-runCtx.Done():
		}
		b.StopTimer()
		// End the waits, a batch at a time if asked: thousands of waits
		// that end at once each delete their key, and etcd refuses
		// requests once its apply lags 5,000 entries behind.
		if batch := e.queueBatch; batch > 0 && over.Load() {
			for i := range lockers {
				stopLock[i]()
				if (i+1)%batch == 0 || i == len(lockers)-1 {
					for j := i + 1 - min(batch, i%batch+1); j <= i; j++ {
						<-returned[j]
					}
				}
			}
		}
		stopRun()
		wg.Wait() // the waits end at once and should remove their keys
		// A lock call cancelled after etcd applied its put but before the
		// reply came back may leave its key behind (upstream does): the
		// next run would then wait behind it for ever. Count such keys,
		// and delete them.
		resp, err := e.plain.Delete(ctx, name+"/", clientv3.WithPrefix())
		if err != nil {
			b.Fatalf("delete what the cancelled waits left under %q: %v", name+"/", err)
		}
		leftover = int(resp.Deleted)
	} else {
		wg.Wait()
		b.StopTimer()
		end = e.counts()
	}
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	if n := overlaps.Load(); n > 0 {
		b.Fatalf("%d acquisitions overlapped another holder, want 0", n)
	}
	if queued {
		mt.reportUntil(b, b.N, end)
		b.ReportMetric(float64(leftover), "leftover-keys")
	} else {
		mt.report(b, b.N)
	}
	b.ReportMetric(float64(b.N)/end.at.Sub(t0).Seconds(), "acq/s")
	if all := slices.Concat(handoffs...); len(all) > 0 {
		slices.Sort(all)
		for _, q := range []struct {
			q    float64
			unit string
		}{{0.50, "handoff-p50-ms"}, {0.90, "handoff-p90-ms"}, {0.99, "handoff-p99-ms"}, {1, "handoff-max-ms"}} {
			b.ReportMetric(benchPercentile(all, q.q).Seconds()*1e3, q.unit)
		}
	}
	if keys != nil {
		b.ReportMetric(float64(keys.stop(b)), "max-keys")
	}
}

// waitQueue waits until n holders are in the queue of the lock name: n
// keys under its prefix, and a watch confirmed by etcd for each of the n-1
// waiters (watch creations counted from created on), which both libraries
// make to wait for their predecessor. Until then the waiters' first reads
// and watches would still be under way when the clock starts.
func (e *benchServer) waitQueue(ctx context.Context, name string, n int, created int64) error {
	for {
		resp, err := e.plain.Get(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return err
		}
		if resp.Count >= int64(n) && e.created.Load()-created >= int64(n-1) {
			return nil
		}
		t := time.NewTimer(5 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%d keys, %d watches: %w", resp.Count, e.created.Load()-created, ctx.Err())
		case <-t.C:
		}
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
