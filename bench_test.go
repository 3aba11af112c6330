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
// This file has the harness: the etcd, the meters and the two libraries.
// The benchmarks of one holder are in bench_single_test.go, of holders that
// contend in bench_contended_test.go; how cost grows with waiters and with
// held locks in bench_waiting_test.go, bench_scale_test.go and
// bench_held_test.go.

import (
	"context"
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
