package etcdtest

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// A Server is a single-member etcd running in the test's process, with its
// data in a tb.TempDir() (Start) or in a directory that Close removes (New).
// It is real etcd (go.etcd.io/etcd/server/v3/embed) with fast timings: a
// 10 ms heartbeat, a 100 ms election timeout (so the minimum lease TTL is 1 s
// instead of 2 s) and no fsync (unless WithFsync), which only matters if the
// machine crashes.
//
// On an external etcd, named by the environment variable ETCDTEST_ENDPOINTS
// (with ETCDTEST_CACERT, ETCDTEST_CERT and ETCDTEST_KEY for TLS), a Server
// starts nothing: Endpoints and TLS are those of that etcd, and the clients
// it hands out (Client, NewClient, ProxiedClient, NewProxiedClient) live
// under a prefix of the Server's own, such as "etcdtest/K3XV7A2QDM/", as a
// Namespace does; Close revokes their leases and deletes that prefix. A
// client made from Endpoints by the code under test is not under the
// prefix: it sees, and leaves, the whole etcd's keys. Options that need
// an embedded etcd (WithFsync; WithTLS or WithClientCertAuth when the
// environment gives no TLS) skip the test under Start.
//
// A Server is safe for concurrent use.
type Server struct {
	o     *options
	certs *certs
	m     *member
	owned owned
	once  sync.Once

	removeDir string // removed by Close: the data of a Server from New

	ext *external // under ETCDTEST_ENDPOINTS, in place of m
}

// Start starts a single-member etcd on 127.0.0.1 and returns once it is ready
// to serve clients. It calls tb.Fatal if etcd fails to start or is not ready
// within 30 s, and registers Close with tb.Cleanup. Its data, and its
// certificates under WithTLS, live in tb.TempDir() directories, which the
// testing package removes when the test ends, after Close.
//
// The client and peer listeners use ports chosen by the kernel; there are no
// metrics, pprof or HTTP/JSON gateway listeners.
//
// Under ETCDTEST_ENDPOINTS, Start starts nothing: see Server on an external
// etcd.
func Start(tb testing.TB, opts ...Option) *Server {
	tb.Helper()
	o := buildOptions(opts)
	if ext := useExternal(tb, o); ext != nil {
		s, err := startExternal(ext, o)
		if err != nil {
			tb.Fatalf("%v", err)
		}
		tb.Cleanup(func() {
			if err := s.close(); err != nil {
				tb.Errorf("%v", err)
			}
		})
		return s
	}
	s, err := start(o, tb.TempDir(), tb.TempDir())
	if err != nil {
		tb.Fatalf("%v", err)
	}
	tb.Cleanup(s.Close)
	return s
}

// startExternal returns a Server on the external etcd, whose clients live
// under a prefix of its own.
func startExternal(ext *external, o *options) (*Server, error) {
	sc, err := newScope(ext, o)
	if err != nil {
		return nil, err
	}
	o.scope = sc
	return &Server{o: o, certs: ext.certs, ext: ext}, nil
}

// New starts a single-member etcd like Start, for code that has no
// testing.TB: Example functions, demos, programs' own integration checks. Its
// data, and its certificates under WithTLS, live in a new directory under
// os.TempDir(), which Close removes. The caller must call Close; clients from
// NewClient are closed by it. If etcd fails to start or is not ready within
// 30 s, New returns an error and leaves nothing running and no directory
// behind.
//
// Under ETCDTEST_ENDPOINTS, New starts nothing, like Start; where opts ask
// for what the external etcd does not give (TLS, fsync), it starts an
// embedded etcd instead, since code without a testing.TB cannot skip.
func New(opts ...Option) (*Server, error) {
	o := buildOptions(opts)
	ext, err := externalEtcd()
	if err != nil {
		return nil, err
	}
	if ext != nil && ext.unfit(o) == "" {
		return startExternal(ext, o)
	}
	root, err := os.MkdirTemp("", "etcdtest-")
	if err != nil {
		return nil, fmt.Errorf("etcdtest: temp dir: %w", err)
	}
	certDir, dataDir := filepath.Join(root, "certs"), filepath.Join(root, "data")
	for _, dir := range []string{certDir, dataDir} {
		if err := os.Mkdir(dir, 0o700); err != nil {
			os.RemoveAll(root)
			return nil, fmt.Errorf("etcdtest: temp dir: %w", err)
		}
	}
	s, err := start(o, certDir, dataDir)
	if err != nil {
		os.RemoveAll(root)
		return nil, err
	}
	s.removeDir = root
	return s, nil
}

// start starts a server and waits until it is ready; on failure it leaves
// nothing running.
func start(o *options, certDir, dataDir string) (*Server, error) {
	s := &Server{o: o}
	scheme := "http"
	if o.tls {
		crt, err := newCerts(certDir, o.clientCertAuth)
		if err != nil {
			return nil, err
		}
		s.certs, scheme = crt, "https"
	}
	peer := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	s.m = &member{
		name:      "etcdtest",
		dir:       dataDir,
		clientURL: url.URL{Scheme: scheme, Host: "127.0.0.1:0"},
		peerURL:   peer,
		listenURL: peer,
		cluster:   "etcdtest=" + peer.String(),
		token:     "etcdtest",
	}
	if err := s.m.start(o, s.certs); err != nil {
		return nil, err
	}
	if err := s.m.waitReady(time.After(readyTimeout)); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Endpoints returns the client URL of the server, such as
// http://127.0.0.1:40123, or https under WithTLS. It stays valid, and keeps
// the same value, until Close.
//
// etcd itself only knows the URL it was told to listen on, with port 0, and
// reports that in its member list: do not let a client replace its endpoints
// with the member list (clientv3.Config.AutoSyncInterval, Client.Sync).
// Cluster members, whose ports are picked in advance, have no such limit.
func (s *Server) Endpoints() []string {
	if s.ext != nil {
		return append([]string(nil), s.ext.endpoints...)
	}
	return []string{s.m.endpoint}
}

// TLS returns the client-side TLS files and config, or nil without WithTLS.
// Each call returns a new copy, free to modify.
func (s *Server) TLS() *TLSFiles {
	if s.certs == nil {
		return nil
	}
	return s.certs.client.clone()
}

// Client returns a new client of the server, with a 5 s DialTimeout and,
// under WithTLS, the TLS config of TLS. It is closed by tb.Cleanup, or by
// Close if that comes first; closing it earlier is fine. Client calls
// tb.Fatal after Close.
func (s *Server) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	return client(tb, &s.owned, s.Endpoints(), s.o, s.certs)
}

// ClientWith returns a new client, like Client, made with extra gRPC dial
// options: interceptors that delay, drop or record the client's calls, say.
// On an external etcd it is under the Server's prefix, as Client's are, so
// that it shares the keys of the test's other clients.
func (s *Server) ClientWith(tb testing.TB, opts ...grpc.DialOption) *clientv3.Client {
	tb.Helper()
	return client(tb, &s.owned, s.Endpoints(), s.o, s.certs, opts...)
}

// ProxiedClient returns a new client, like Client, whose traffic goes through
// a TCP proxy, and the Proxy that injects faults into it. The client and the
// proxy are closed together, by tb.Cleanup or by Close.
func (s *Server) ProxiedClient(tb testing.TB) (*clientv3.Client, *Proxy) {
	tb.Helper()
	return proxiedClient(tb, &s.owned, s.Endpoints(), s.o, s.certs)
}

// NewProxiedClient returns a new client whose traffic goes through a TCP
// proxy, and the Proxy that injects faults into it, like ProxiedClient, for
// code that has no testing.TB. Close closes both, if the caller has not
// closed the client before; the proxy runs until then. After Close,
// NewProxiedClient returns an error.
func (s *Server) NewProxiedClient() (*clientv3.Client, *Proxy, error) {
	c, p, _, err := newProxiedClient(&s.owned, s.Endpoints(), s.o, s.certs)
	return c, p, err
}

// Close closes the clients and proxies handed out by s, then stops etcd. For
// a Server from New it then removes the data directory; that of a Server from
// Start is removed by the testing package when the test ends. Close is safe
// to call more than once and concurrently: every call returns once etcd has
// stopped.
//
// On an external etcd, Close closes the clients, revokes the leases granted
// through them and deletes the keys under their prefix, and leaves etcd
// running.
func (s *Server) Close() {
	s.close()
}

// close is Close, with the error of the clear on an external etcd.
func (s *Server) close() error {
	var err error
	s.once.Do(func() {
		s.owned.closeAll()
		if s.ext != nil {
			err = s.o.scope.close()
			return
		}
		s.m.stop(graceful, releasePorts)
		if s.removeDir != "" {
			os.RemoveAll(s.removeDir)
		}
	})
	return err
}

// NewClient returns a new client of the server, like Client, for code that
// has no testing.TB. Close closes it, if the caller has not done so before.
// After Close, NewClient returns an error.
func (s *Server) NewClient() (*clientv3.Client, error) {
	c, err := newClient(s.Endpoints(), s.o, s.certs)
	if err != nil {
		return nil, err
	}
	if _, ok := s.owned.add(func() { c.Close() }); !ok {
		c.Close()
		return nil, errors.New("etcdtest: NewClient called after Close")
	}
	return c, nil
}

func client(tb testing.TB, own *owned, endpoints []string, o *options, crt *certs, dopts ...grpc.DialOption) *clientv3.Client {
	tb.Helper()
	c, err := newClient(endpoints, o, crt, dopts...)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	closeFn, ok := own.add(func() { c.Close() })
	if !ok {
		c.Close()
		tb.Fatalf("etcdtest: Client called after Close")
	}
	tb.Cleanup(closeFn)
	return c
}

func proxiedClient(tb testing.TB, own *owned, endpoints []string, o *options, crt *certs) (*clientv3.Client, *Proxy) {
	tb.Helper()
	c, p, closeFn, err := newProxiedClient(own, endpoints, o, crt)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	tb.Cleanup(closeFn)
	return c, p
}

// newProxiedClient returns a client through a new proxy, both owned by own,
// and the function that closes them.
func newProxiedClient(own *owned, endpoints []string, o *options, crt *certs) (*clientv3.Client, *Proxy, func(), error) {
	p, err := newProxy(endpoints, o.logger)
	if err != nil {
		return nil, nil, nil, err
	}
	c, err := newClient(p.Endpoints(), o, crt, grpc.WithContextDialer(p.dial))
	if err != nil {
		p.close()
		return nil, nil, nil, err
	}
	closeFn, ok := own.add(func() {
		c.Close()
		p.close()
	})
	if !ok {
		c.Close()
		p.close()
		return nil, nil, nil, errors.New("etcdtest: ProxiedClient or NewProxiedClient called after Close")
	}
	return c, p, closeFn, nil
}
