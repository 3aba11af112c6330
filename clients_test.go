package etcdlock_test

// Helpers that the tests of every file share: servers, clients and Sessions,
// reads of the lock's keys, waiting, and the locker adapters that run one
// scenario on etcdlock.Mutex and on concurrency.Mutex.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/handover"
)

// The tests' etcd: servers, clients (intercepted, proxied, under a shared
// etcd's prefix), Sessions, and what etcd holds (keys, revisions, leases).

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
	u, err := url.Parse(proxy.Endpoints()[0])
	if err != nil {
		t.Fatalf("proxy endpoint: %v", err)
	}
	// A client of srv (under its prefix, as its others), dialled through
	// the proxy.
	viaProxy := grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", u.Host)
	})
	return srv.ClientWith(t, append(interceptors(unary, stream), viaProxy)...), proxy
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

// wroteSince returns the keys written (put or deleted) in the keyspace of
// client, a client of startServer, after revision rev, up to now: on an
// external etcd, only under the test's prefix, so that the writes of tests
// running beside it do not count.
//
// It watches every key of etcd from rev+1, outside the client's prefix, and
// knows it has seen everything up to now by the first event at now or
// later: each revision is some write's. A progress report would not do:
// before v3.4.24 and v3.5.8 etcd answers RequestProgress at once with its
// current revision, even to a watch still catching up from an older one
// (etcd-io/etcd#15220), so that on etcd 3.4.23 the writes came after the
// report, and were missed.
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
	prefix := ""
	if srv, ok := servers.Load(client); ok {
		prefix = serverPrefix(t, srv.(*etcdtest.Server))
	} else if sharedEtcd() {
		t.Fatal("wroteSince: the client is not one of startServer's, whose prefix it knows")
	}
	w := clientv3.NewWatcher(client) // on the client's connection, outside its prefix
	defer w.Close()
	wch := w.Watch(clientv3.WithRequireLeader(ctx), "", clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	var keys []string
	for {
		select {
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil {
				t.Fatalf("watch from revision %d: %v", rev+1, wr.Err())
			}
			for _, ev := range wr.Events {
				key, ours := strings.CutPrefix(string(ev.Kv.Key), prefix)
				if ours && ev.Kv.ModRevision <= now {
					keys = append(keys, fmt.Sprintf("%s %q at %d", ev.Type, key, ev.Kv.ModRevision))
				}
			}
			if n := len(wr.Events); n > 0 && wr.Events[n-1].Kv.ModRevision >= now {
				return keys
			}
		case <-ctx.Done():
			t.Fatalf("watch from revision %d: no event at %d within %v", rev+1, now, testTimeout)
		}
	}
}

// compactFirstRevision compacts etcd's first revision away, and no more, so
// that a watch from revision 1 (failingWatches', a lagging seam's) fails as
// compacted: the fault of a watch that cannot resume. It puts name+
// "-compacted" first, so that etcd has a revision firstWrite to compact at. A
// compaction is of the whole etcd: one at the current revision would take
// the history that the watches and reads of the tests beside it, on a
// shared etcd (ETCDTEST_ENDPOINTS), start from; revision 1 is none's. An
// etcd compacted further already (by an earlier call, or its own
// auto-compaction) is as good.
func compactFirstRevision(t *testing.T, ctx context.Context, client *clientv3.Client, name string) {
	t.Helper()
	if _, err := client.Put(ctx, name+"-compacted", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Compact(ctx, firstWrite); err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("compact at revision %d: %v", firstWrite, err)
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

// sessionLeases returns the leases in etcd but the term counts': Lead's
// count of a name's terms is on a lease of its own, which outlives the
// Sessions by design (docs/keys.md: lasting, 15 minutes), with the count's
// key or, where its grant's reply was lost, none.
func sessionLeases(ctx context.Context, c *clientv3.Client) ([]clientv3.LeaseStatus, error) {
	leases, err := c.Leases(ctx)
	if err != nil {
		return nil, err
	}
	var left []clientv3.LeaseStatus
	for _, l := range leases.Leases {
		ttl, err := c.TimeToLive(ctx, l.ID, clientv3.WithAttachedKeys())
		if err != nil {
			return nil, err
		}
		count := ttl.GrantedTTL == int64(handover.CountTTL/time.Second)
		for _, k := range ttl.Keys {
			count = count && strings.Contains(string(k), handover.TermPrefix)
		}
		if !count {
			left = append(left, l)
		}
	}
	return left, nil
}
