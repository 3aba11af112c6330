package etcdtest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/namespace"
)

// cleanupTimeout bounds the deletes and revokes that end a Namespace.
const cleanupTimeout = 10 * time.Second

// TestingM is the part of *testing.M that Main needs; goleak.TestingM is the
// same interface.
type TestingM interface {
	Run() int
}

// Main returns m with a Run that runs the tests, then stops the package's
// shared server, if Shared started one, and removes its data. A package
// that calls Shared runs its tests through it, in its TestMain:
//
//	func TestMain(m *testing.M) {
//		goleak.VerifyTestMain(etcdtest.Main(m))
//	}
//
// or os.Exit(etcdtest.Main(m).Run()) without goleak. Main starts nothing
// itself: a package whose tests never call Shared pays nothing.
func Main(m TestingM) TestingM {
	shared.mu.Lock()
	shared.main = true
	shared.mu.Unlock()
	return mainM{m}
}

type mainM struct{ m TestingM }

func (m mainM) Run() int {
	code := m.m.Run()
	shared.close()
	return code
}

// shared is the package's shared server, started by the first Shared.
var shared sharedServer

type sharedServer struct {
	mu     sync.Mutex
	main   bool    // TestMain runs the tests through Main
	srv    *Server // started by the first Shared; nil on an external etcd
	ext    *external
	admin  *clientv3.Client // nil until the first Shared
	err    error            // why the server could not start; Shared fails on it
	prefix string
	next   atomic.Int64
}

// get returns a client of all the shared etcd's keys, starting the server
// if need be.
func (s *sharedServer) get() (*clientv3.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.main {
		return nil, errors.New("etcdtest: Shared needs the tests run through etcdtest.Main, which stops the shared server: " +
			"func TestMain(m *testing.M) { goleak.VerifyTestMain(etcdtest.Main(m)) }")
	}
	if s.admin == nil && s.err == nil {
		s.prefix = "etcdtest/" + rand.Text()[:10] + "/"
		s.ext, s.err = externalEtcd()
		switch {
		case s.err != nil:
		case s.ext != nil:
			s.admin, s.err = newClient(s.ext.endpoints, buildOptions(nil), s.ext.certs)
		default:
			s.srv, s.err = New()
			if s.err == nil {
				s.admin, s.err = s.srv.NewClient()
			}
		}
	}
	return s.admin, s.err
}

// newClient returns a new client of the shared etcd, outside any prefix.
func (s *sharedServer) newClient() (*clientv3.Client, error) {
	if s.ext != nil {
		return newClient(s.ext.endpoints, buildOptions(nil), s.ext.certs)
	}
	return s.srv.NewClient()
}

func (s *sharedServer) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		s.srv.Close() // closes admin and every Namespace's client
	} else if s.admin != nil {
		s.admin.Close()
	}
	s.srv, s.ext, s.admin, s.err = nil, nil, nil, nil
}

// A Namespace is a test's share of an etcd that other tests use at the same
// time: a client whose keys live under a prefix of its own.
type Namespace struct {
	// Client reaches only the keys under Prefix: its KV, Watcher and Lease
	// are go.etcd.io/etcd/client/v3/namespace wrappers, so that the test
	// writes, reads and watches "a" where etcd stores Prefix+"a", and
	// sees nothing of other tests. Its other interfaces (Cluster,
	// Maintenance, Auth) reach the whole server, as do clients made from
	// its Endpoints.
	Client *clientv3.Client

	// Prefix is the namespace's prefix, such as "etcdtest/K3XV7A2QDM/17/",
	// unique in the test process; the random part keeps the test binaries
	// of other packages that share an etcd apart.
	Prefix string
}

// Shared returns a new Namespace on the package's shared server: one
// single-member etcd, started by the first call and stopped after the tests
// by Main, which Shared needs (it calls tb.Fatal without it, or if the
// server does not start). Under ETCDTEST_ENDPOINTS the shared server is the
// external etcd, which Main leaves running. Tests that call it may run in parallel: each has
// its own prefix and its own client.
//
// When the test ends, tb.Cleanup revokes the leases granted through the
// Namespace's client, deletes every key under its prefix and closes the
// client; it reports a failure of these with tb.Errorf. Leases granted
// otherwise, and keys written outside the prefix, are left alone.
//
// What sharing costs: the tests share one server's revision counter, its
// compaction and its load, so a test must not depend on revision numbers
// being small or on another test's absence; a test that stops or breaks
// its server (ProxiedClient, StartCluster) wants a server of its own, and
// one that compacts takes the history that the others read and watch from
// (compacting at revision 2 makes watches from revision 1 fail and takes
// nothing that another test wrote).
func Shared(tb testing.TB) *Namespace {
	tb.Helper()
	admin, err := shared.get()
	if err != nil {
		tb.Fatalf("%v", err)
	}
	prefix := fmt.Sprintf("%s%d/", shared.prefix, shared.next.Add(1))
	c, err := shared.newClient()
	if err != nil {
		tb.Fatalf("%v", err)
	}
	ns, leases := namespaced(c, prefix)
	tb.Cleanup(func() {
		if err := ns.clear(admin, leases); err != nil {
			tb.Errorf("%v", err)
		}
		c.Close()
	})
	return ns
}

// namespaced puts c's KV, Watcher and Lease under prefix and returns the
// namespace with the record of the leases granted through it.
func namespaced(c *clientv3.Client, prefix string) (*Namespace, *leaseRecord) {
	leases := &leaseRecord{Lease: namespace.NewLease(c.Lease, prefix), ids: map[clientv3.LeaseID]struct{}{}}
	c.KV = namespace.NewKV(c.KV, prefix)
	c.Watcher = &watchGuard{Watcher: namespace.NewWatcher(c.Watcher, prefix), raw: c.Watcher}
	c.Lease = leases
	return &Namespace{Client: c, Prefix: prefix}, leases
}

// watchGuard keeps a namespace Watcher's Close from running beside its
// Watch. The namespace package's Watch adds to a sync.WaitGroup that its
// Close waits on, a data race when a client is closed while code that uses
// it opens a watch (a test's crashed process, a Session's loss watch). Close
// first closes the raw Watcher, so that a Watch waiting for its watch to be
// created returns, then waits for the calls of Watch in progress.
type watchGuard struct {
	clientv3.Watcher                  // the namespace's
	raw              clientv3.Watcher // the one it wraps
	mu               sync.RWMutex     // held by Watch for reading, by Close
}

func (w *watchGuard) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.Watcher.Watch(ctx, key, opts...)
}

func (w *watchGuard) Close() error {
	err := w.raw.Close()
	w.mu.Lock()
	defer w.mu.Unlock()
	return errors.Join(err, w.Watcher.Close())
}

// clear revokes the namespace's leases and deletes its keys through admin,
// a client outside the namespace that the test cannot have closed.
func (ns *Namespace) clear(admin *clientv3.Client, leases *leaseRecord) error {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	var errs []error
	for _, id := range leases.granted() {
		_, err := admin.Revoke(ctx, id)
		if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			errs = append(errs, fmt.Errorf("revoke lease %x: %w", id, err))
		}
	}
	if _, err := admin.Delete(ctx, ns.Prefix, clientv3.WithPrefix()); err != nil {
		errs = append(errs, fmt.Errorf("delete %s*: %w", ns.Prefix, err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("etcdtest: clean namespace %s: %w", ns.Prefix, err)
	}
	return nil
}

// leaseRecord is a Lease that remembers the leases it granted.
type leaseRecord struct {
	clientv3.Lease

	mu  sync.Mutex
	ids map[clientv3.LeaseID]struct{}
}

func (l *leaseRecord) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	resp, err := l.Lease.Grant(ctx, ttl)
	if err == nil {
		l.mu.Lock()
		l.ids[resp.ID] = struct{}{}
		l.mu.Unlock()
	}
	return resp, err
}

func (l *leaseRecord) granted() []clientv3.LeaseID {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := make([]clientv3.LeaseID, 0, len(l.ids))
	for id := range l.ids {
		ids = append(ids, id)
	}
	return ids
}
