package etcdlock_test

// Helpers that the tests of every file share: servers, clients and Sessions,
// reads of the lock's keys, waiting, and the locker adapters that run one
// scenario on etcdlock.Mutex and on concurrency.Mutex.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.etcd.io/etcd/client/v3/namespace"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"google.golang.org/grpc"

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

// startServer starts an embedded etcd and returns a client of it.
func startServer(t *testing.T) (*etcdtest.Server, *clientv3.Client) {
	t.Helper()
	srv := etcdtest.Start(t)
	c := srv.Client(t)
	servers.Store(c, srv)
	t.Cleanup(func() { servers.Delete(c) })
	return srv, c
}

// servers maps the clients startServer returns to their Server, so that
// startClient gives a second client of the same keys: on an external etcd
// (ETCDTEST_ENDPOINTS), under the same prefix.
var servers sync.Map // *clientv3.Client → *etcdtest.Server

// startClient returns a second client of the server client is connected to.
func startClient(t *testing.T, client *clientv3.Client) *clientv3.Client {
	t.Helper()
	if srv, ok := servers.Load(client); ok {
		return srv.(*etcdtest.Server).Client(t)
	}
	return interceptedClient(t, client.Endpoints(), nil, nil)
}

// interceptors returns the dial options that chain the given interceptors
// (nil: none).
func interceptors(unary grpc.UnaryClientInterceptor, stream grpc.StreamClientInterceptor) []grpc.DialOption {
	var opts []grpc.DialOption
	if unary != nil {
		opts = append(opts, grpc.WithChainUnaryInterceptor(unary))
	}
	if stream != nil {
		opts = append(opts, grpc.WithChainStreamInterceptor(stream))
	}
	return opts
}

// serverClient returns a new client of srv whose calls go through the given
// interceptors (nil: none), under srv's prefix on an external etcd. It is
// closed by t.Cleanup.
func serverClient(t *testing.T, srv *etcdtest.Server, unary grpc.UnaryClientInterceptor, stream grpc.StreamClientInterceptor) *clientv3.Client {
	t.Helper()
	return srv.ClientWith(t, interceptors(unary, stream)...)
}

// proxiedServerClient returns a new client of srv whose traffic goes through
// a proxy of its own and whose calls go through the given interceptors (nil:
// none), and the Proxy that injects faults into it; on an external etcd it
// lives under srv's prefix, as srv's clients do. Unlike those of
// srv.ProxiedClient, its connections are not closed by Unblackhole. It is
// closed by t.Cleanup.
func proxiedServerClient(t *testing.T, srv *etcdtest.Server, unary grpc.UnaryClientInterceptor, stream grpc.StreamClientInterceptor) (*clientv3.Client, *etcdtest.Proxy) {
	t.Helper()
	_, proxy := srv.ProxiedClient(t)
	c := interceptedClient(t, proxy.Endpoints(), unary, stream)
	if prefix := serverPrefix(t, srv); prefix != "" {
		c.KV = namespace.NewKV(c.KV, prefix)
		c.Watcher = namespace.NewWatcher(c.Watcher, prefix)
		c.Lease = namespace.NewLease(c.Lease, prefix)
	}
	return c, proxy
}

// serverPrefix returns the prefix srv's clients put before every key they
// send: on an external etcd (ETCDTEST_ENDPOINTS), that of srv, such as
// "etcdtest/K3XV7A2QDM/"; "" on an embedded etcd. Interceptors see the keys
// with it, as sent; the test and its clients name them without. It reads a
// key through a new client of srv and looks at the request as sent.
func serverPrefix(t *testing.T, srv *etcdtest.Server) string {
	t.Helper()
	const probe = "prefix-probe"
	var sent string // written by the interceptor on the Get's goroutine
	c := serverClient(t, srv, func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if r, ok := req.(*pb.RangeRequest); ok {
			sent = string(r.Key)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}, nil)
	defer c.Close()
	if _, err := c.Get(testContext(t), probe); err != nil {
		t.Fatalf("get %q: %v", probe, err)
	}
	prefix, ok := strings.CutSuffix(sent, probe)
	if !ok {
		t.Fatalf("get %q: sent as %q", probe, sent)
	}
	return prefix
}

// sharedEtcd reports whether the tests run on an external etcd
// (ETCDTEST_ENDPOINTS), which the tests of this and other packages share:
// there etcd-wide figures, such as its revision and its list of leases,
// count theirs too.
func sharedEtcd() bool {
	return os.Getenv(etcdtest.EnvEndpoints) != ""
}

// interceptedClient returns a client of endpoints whose calls go through the
// given interceptors (nil: none). It is closed by t.Cleanup.
func interceptedClient(t *testing.T, endpoints []string, unary grpc.UnaryClientInterceptor, stream grpc.StreamClientInterceptor) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		DialOptions: interceptors(unary, stream),
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("new client: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// startProxied starts an embedded etcd and returns a client of it and a
// client through a proxy that can cut that client off. Callers defer
// proxy.Unblackhole(), so that the cleanups that close Sessions and clients
// find etcd reachable.
func startProxied(t *testing.T) (healthy, proxied *clientv3.Client, proxy *etcdtest.Proxy) {
	t.Helper()
	srv := etcdtest.Start(t)
	proxied, proxy = srv.ProxiedClient(t)
	return srv.Client(t), proxied, proxy
}

// newSession makes a Session on client, closed by t.Cleanup.
func newSession(t *testing.T, client *clientv3.Client, opts ...etcdlock.SessionOption) *etcdlock.Session {
	t.Helper()
	s, err := etcdlock.NewSession(client, opts...)
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// aliveSession makes a Session on client with the given TTL, closed by
// t.Cleanup, whose lease has had a keep-alive acknowledged. Until the first
// one, clientv3 gives a lease DialTimeout + 1 s (6 s here), not its TTL,
// before it stops keeping it alive: cut off at once, a new Session would end
// after 6 s whatever its TTL.
func aliveSession(t *testing.T, client *clientv3.Client, ttl time.Duration) *etcdlock.Session {
	t.Helper()
	resp, err := client.Grant(testContext(t), int64(ttl/time.Second))
	if err != nil {
		t.Fatalf("grant: got %v, want nil", err)
	}
	acks, stop := ackWatch(t, client, resp.ID)
	eventually(t, "the first keep-alive acknowledgement", func() bool { return !acks.last().IsZero() })
	s := newSession(t, client, etcdlock.WithLease(resp.ID))
	stop()
	return s
}

// newUpstreamSession makes a concurrency.Session on client, closed by
// t.Cleanup.
func newUpstreamSession(t *testing.T, client *clientv3.Client, ttl int) *concurrency.Session {
	t.Helper()
	s, err := concurrency.NewSession(client, concurrency.WithTTL(ttl))
	if err != nil {
		t.Fatalf("concurrency.NewSession: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// followAcks calls ack with the arrival time of each keep-alive
// acknowledgement of lease at client, until stop is called: a second
// keep-alive channel on the same lease sees every reply the Session's own
// channel sees, without an extra RPC. If clientv3 stops keeping the lease
// alive first (it was not found, or no reply came for a TTL: what ends a
// Session too), it calls end, if not nil, with the time. Until stopped, the
// channel keeps the lease alive too.
func followAcks(client *clientv3.Client, lease clientv3.LeaseID, ack, end func(time.Time)) (stop func(), err error) {
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := client.KeepAlive(ctx, lease)
	if err != nil {
		cancel()
		return nil, err
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for range ch {
			ack(time.Now())
		}
		if ctx.Err() == nil && end != nil {
			end(time.Now())
		}
	})
	return func() {
		cancel()
		wg.Wait()
	}, nil
}

// ackWatch records when keep-alive acknowledgements for lease arrive at
// client (followAcks). It returns the record and a stop function, also
// called by t.Cleanup.
func ackWatch(t *testing.T, client *clientv3.Client, id clientv3.LeaseID) (acks *ackLog, stop func()) {
	t.Helper()
	acks = &ackLog{}
	stop, err := followAcks(client, id, acks.add, nil)
	if err != nil {
		t.Fatalf("KeepAlive(%x): got %v, want nil", id, err)
	}
	t.Cleanup(stop)
	return acks, stop
}

// An ackLog records when keep-alive acknowledgements arrive.
type ackLog struct {
	mu      sync.Mutex
	at      time.Time     // the last one; zero before the first
	longest time.Duration // the longest time between two
}

func (a *ackLog) add(at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.at.IsZero() {
		a.longest = max(a.longest, at.Sub(a.at))
	}
	a.at = at
}

// last returns when the last acknowledgement arrived; the zero time before
// the first.
func (a *ackLog) last() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.at
}

// longestGap returns the longest time between two acknowledgements, or
// from the last one to now.
func (a *ackLog) longestGap(now time.Time) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.at.IsZero() {
		return 0
	}
	return max(a.longest, now.Sub(a.at))
}

// keyOf returns the key a Session's lease uses for the lock name.
func keyOf(name string, lease clientv3.LeaseID) string {
	return fmt.Sprintf("%s/%x", name, lease)
}

// queueKeys returns the keys under the lock's prefix, oldest first. Unlike
// the helpers below, it may be called from any goroutine.
func queueKeys(ctx context.Context, client *clientv3.Client, name string) ([]*mvccpb.KeyValue, error) {
	resp, err := client.Get(ctx, name+"/", clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, err
	}
	return resp.Kvs, nil
}

// lockKeys returns the keys under the lock's prefix, oldest first.
func lockKeys(t *testing.T, client *clientv3.Client, name string) []string {
	t.Helper()
	return keysOfLease(t, client, name, clientv3.NoLease)
}

// keysOfLease returns the keys under the lock's prefix attached to lease,
// oldest first; every key for clientv3.NoLease.
func keysOfLease(t *testing.T, client *clientv3.Client, name string, lease clientv3.LeaseID) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	kvs, err := queueKeys(ctx, client, name)
	if err != nil {
		t.Fatalf("get keys of %q: %v", name, err)
	}
	keys := make([]string, 0, len(kvs))
	for _, kv := range kvs {
		if lease == clientv3.NoLease || clientv3.LeaseID(kv.Lease) == lease {
			keys = append(keys, string(kv.Key))
		}
	}
	return keys
}

// currentRevision returns etcd's current revision. It may be called from
// any goroutine.
func currentRevision(ctx context.Context, client *clientv3.Client) (int64, error) {
	resp, err := client.Get(ctx, "\x00")
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

// wroteSince returns the keys written (put or deleted) in client's keyspace
// after revision rev, up to now: on an external etcd, only under the test's
// prefix, so that the writes of tests running beside it do not count. It
// watches from rev+1 and asks for a progress report to know it has seen
// everything up to now.
func wroteSince(t *testing.T, client *clientv3.Client, rev int64) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	now, err := currentRevision(ctx, client)
	if err != nil {
		t.Fatalf("current revision: %v", err)
	}
	if now <= rev {
		return nil
	}
	wctx, stop := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer stop()
	wch := client.Watch(wctx, "", clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	var keys []string
	for {
		if err := client.RequestProgress(wctx); err != nil {
			t.Fatalf("watch progress: %v", err)
		}
		select {
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil {
				t.Fatalf("watch from revision %d: %v", rev+1, wr.Err())
			}
			for _, ev := range wr.Events {
				if ev.Kv.ModRevision <= now {
					keys = append(keys, fmt.Sprintf("%s %q at %d", ev.Type, ev.Kv.Key, ev.Kv.ModRevision))
				}
			}
			if wr.Header.Revision >= now && (wr.IsProgressNotify() || len(wr.Events) > 0 && wr.Events[len(wr.Events)-1].Kv.ModRevision >= now) {
				return keys
			}
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			t.Fatalf("watch from revision %d: no progress to %d within %v", rev+1, now, testTimeout)
		}
	}
}

// revision returns etcd's current revision.
func revision(t *testing.T, client *clientv3.Client) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	rev, err := currentRevision(ctx, client)
	if err != nil {
		t.Fatalf("get revision: %v", err)
	}
	return rev
}

// leaseTTL returns the remaining TTL of the lease in whole seconds, rounded
// toward zero, as etcd reports it, and whether etcd still has the lease. A
// lease past its expiry that etcd has not yet revoked (it looks every
// 500 ms) is still there, with its keys.
func leaseTTL(t *testing.T, client *clientv3.Client, id clientv3.LeaseID) (int64, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	resp, err := client.TimeToLive(ctx, id)
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return 0, false
	case err != nil:
		t.Fatalf("TimeToLive(%x): got %v, want nil", id, err)
	}
	return resp.TTL, resp.TTL >= 0
}

// A leaseLog is a client's Lease that records the leases granted through
// it.
type leaseLog struct {
	clientv3.Lease

	mu  sync.Mutex
	ids []clientv3.LeaseID
}

// logLeases records the leases granted through client from now on. Call it
// before client is in use.
func logLeases(client *clientv3.Client) *leaseLog {
	l := &leaseLog{Lease: client.Lease}
	client.Lease = l
	return l
}

func (l *leaseLog) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	resp, err := l.Lease.Grant(ctx, ttl)
	if err == nil {
		l.mu.Lock()
		l.ids = append(l.ids, resp.ID)
		l.mu.Unlock()
	}
	return resp, err
}

// granted returns the leases granted so far, oldest first.
func (l *leaseLog) granted() []clientv3.LeaseID {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]clientv3.LeaseID(nil), l.ids...)
}

// leasesLeft returns the leases etcd has: on an etcd of the test's own,
// every one; on an external etcd that other tests share, whose listing
// has theirs too, those of ids, the test's own, that etcd still has.
func leasesLeft(t *testing.T, client *clientv3.Client, ids ...clientv3.LeaseID) []clientv3.LeaseID {
	t.Helper()
	if !sharedEtcd() {
		resp, err := client.Leases(testContext(t))
		if err != nil {
			t.Fatalf("leases: %v", err)
		}
		left := make([]clientv3.LeaseID, len(resp.Leases))
		for i, l := range resp.Leases {
			left[i] = l.ID
		}
		return left
	}
	var left []clientv3.LeaseID
	for _, id := range ids {
		if leaseAlive(t, client, id) {
			left = append(left, id)
		}
	}
	return left
}

// leaseAlive reports whether etcd still has the lease.
func leaseAlive(t *testing.T, client *clientv3.Client, id clientv3.LeaseID) bool {
	t.Helper()
	_, alive := leaseTTL(t, client, id)
	return alive
}

// Bounds the contract promises (API.md, doc comments), as the tests assert
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
