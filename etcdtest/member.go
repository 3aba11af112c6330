package etcdtest

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	// readyTimeout bounds the wait for a member to serve; it is far above
	// the usual 25–300 ms so that slow CI machines and -race still pass.
	readyTimeout = 30 * time.Second

	tickMs     = 10
	electionMs = 100

	dialTimeout = 5 * time.Second
)

// member is one embedded etcd and what it needs to start again with the same
// data directory and URLs.
type member struct {
	name      string
	dir       string
	clientURL url.URL // port 0 lets the kernel pick; endpoint has the real one
	peerURL   url.URL // advertised to the other members
	listenURL url.URL // where it listens for them: peerURL, or behind a peerProxy
	cluster   string  // initial cluster, "name=peerURL,..."
	token     string  // initial cluster token

	endpoint string             // client URL with the port in use
	e        *embed.Etcd        // nil while stopped
	stopping context.CancelFunc // ends the gRPC streams of e
	calls    *gate              // the unary calls of e
	hold     *portHold          // keeps the ports while e is nil, if not nil
}

// start starts m and returns without waiting for it to be ready.
func (m *member) start(o *options, crt *certs) error {
	cfg := embed.NewConfig()
	cfg.Name = m.name
	cfg.Dir = m.dir
	cfg.ListenClientUrls = []url.URL{m.clientURL}
	cfg.AdvertiseClientUrls = []url.URL{m.clientURL}
	cfg.ListenPeerUrls = []url.URL{m.listenURL}
	cfg.AdvertisePeerUrls = []url.URL{m.peerURL}
	cfg.InitialCluster = m.cluster
	cfg.InitialClusterToken = m.token
	cfg.UnsafeNoFsync = !o.fsync
	cfg.TickMs = tickMs
	cfg.ElectionMs = electionMs
	// bcrypt's lowest cost (4, not 10): a test's passwords guard nothing,
	// and each login of a test with auth on would otherwise cost about
	// 100 ms of CPU, seconds under -race with tests running beside it.
	cfg.BcryptCost = 4
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(o.logger)
	// Clients of this package speak gRPC; the HTTP/JSON gateway would only
	// add a loopback gRPC connection per member.
	cfg.EnableGRPCGateway = false
	if crt != nil {
		cfg.ClientTLSInfo = crt.server
	}
	m.release()
	stopping, stop := context.WithCancel(context.Background())
	calls := &gate{}
	cfg.GRPCAdditionalServerOptions = []grpc.ServerOption{
		grpc.ChainStreamInterceptor(endStreams(stopping)),
		grpc.ChainUnaryInterceptor(calls.unary),
	}

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		stop()
		return fmt.Errorf("etcdtest: start member %s: %w", m.name, err)
	}
	m.e, m.stopping, m.calls = e, stop, calls
	if m.endpoint == "" { // a restart keeps the URL; readers do not lock
		m.endpoint = m.clientURL.Scheme + "://" + e.Clients[0].Addr().String()
	}
	return nil
}

// waitReady waits until m serves clients, fails, or deadline passes.
func (m *member) waitReady(deadline <-chan time.Time) error {
	select {
	case <-m.e.Server.ReadyNotify():
		return nil
	case err := <-m.e.Err():
		return fmt.Errorf("etcdtest: member %s failed before it was ready: %v", m.name, err)
	case <-deadline:
		return fmt.Errorf("etcdtest: member %s not ready after %v", m.name, readyTimeout)
	}
}

// stopMode is how stop stops a member.
type stopMode int

const (
	graceful stopMode = iota // a leader hands its leadership over first, as on SIGTERM
	crash                    // raft stops at once, with no hand-over
)

// portsAfterStop is what stop does with a member's ports.
type portsAfterStop int

const (
	releasePorts portsAfterStop = iota // let them go, with any held ones: the member is done
	keepPorts                          // hold them until the member restarts
)

// stop stops m if it runs, and keeps or releases its ports.
func (m *member) stop(mode stopMode, ports portsAfterStop) {
	if m.e != nil {
		if mode == crash {
			// etcd's HardStop closes the backend under calls still
			// reading it, which can crash the process: let those finish
			// first, unanswered, as a crash would leave them.
			m.calls.close()
			m.e.Server.HardStop()
		}
		m.stopping()
		m.e.Close()
		m.e, m.stopping = nil, nil
		if ports == keepPorts {
			// On failure another socket took a port in the meantime, and
			// Restart reports it.
			m.hold, _ = holdPorts(m.clientURL.Host, m.listenURL.Host)
		}
	}
	if ports == releasePorts {
		m.release()
	}
}

// release gives up the ports held for m, if any.
func (m *member) release() {
	if m.hold != nil {
		m.hold.release()
		m.hold = nil
	}
}

var errMemberStopped = status.Error(codes.Unavailable, "etcdtest: member stopped")

// gateDrain bounds how long a crash waits for the unary calls under way.
const gateDrain = time.Second

// A gate admits a member's unary calls until it closes, and counts those
// under way.
type gate struct {
	mu     sync.Mutex
	closed bool
	inside atomic.Int64
}

// unary is the gate as a gRPC interceptor: once the gate is closed, calls
// fail with codes.Unavailable, and calls under way lose their answer.
func (g *gate) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil, errMemberStopped
	}
	g.inside.Add(1)
	g.mu.Unlock()
	defer g.inside.Add(-1)
	resp, err := handler(ctx, req)
	if g.isClosed() {
		return nil, errMemberStopped
	}
	return resp, err
}

func (g *gate) isClosed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
}

// close admits no more calls and waits, up to gateDrain, for those under
// way to return.
func (g *gate) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	for deadline := time.Now().Add(gateDrain); g.inside.Load() > 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
}

// endStreams ends every gRPC stream once stopping is done, with
// codes.Unavailable like a dropped connection, so that clients fail over.
// Without it embed.Etcd.Close waits about 5 s for open watch and keep-alive
// streams before it cuts them.
func endStreams(stopping context.Context) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, cancel := context.WithCancel(ss.Context())
		defer cancel()
		defer context.AfterFunc(stopping, cancel)()
		err := handler(srv, &serverStream{ServerStream: ss, ctx: ctx})
		if stopping.Err() != nil {
			return errMemberStopped
		}
		return err
	}
}

type serverStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *serverStream) Context() context.Context { return s.ctx }

// owned closes, before etcd stops, the clients and proxies handed out by a
// Server or Cluster.
type owned struct {
	mu     sync.Mutex
	closed bool
	items  []*closer
}

type closer struct {
	once sync.Once
	f    func()
}

func (c *closer) close() { c.once.Do(c.f) }

// add registers f and returns a func that runs it once; ok is false, and f
// is not registered, after closeAll.
func (o *owned) add(f func()) (closeFn func(), ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil, false
	}
	c := &closer{f: f}
	o.items = append(o.items, c)
	return c.close, true
}

// closeAll runs every registered func, newest first, and refuses new ones.
func (o *owned) closeAll() {
	o.mu.Lock()
	items := o.items
	o.items, o.closed = nil, true
	o.mu.Unlock()
	for i := len(items) - 1; i >= 0; i-- {
		items[i].close()
	}
}

func newClient(endpoints []string, o *options, crt *certs, dopts ...grpc.DialOption) (*clientv3.Client, error) {
	cfg := clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: dialTimeout,
		Logger:      o.logger,
		DialOptions: dopts,
	}
	if crt != nil {
		cfg.TLS = crt.client.Config.Clone()
	}
	c, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcdtest: new client: %w", err)
	}
	if o.scope != nil {
		o.scope.wrap(c)
	}
	return c, nil
}
