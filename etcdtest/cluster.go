package etcdtest

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/types"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdserver/api/rafthttp"
	"go.etcd.io/etcd/server/v3/storage/wal"
)

// leaderWait bounds how long Leader waits for the members to agree.
const leaderWait = 5 * time.Second

// peerReadTimeout replaces etcd's 5 s read timeout on connections between
// members. When a request between members completes, net/http aborts its
// background read by setting a past read deadline, which etcd's timeout
// connection may overwrite with its own; the connection then lingers until
// the read timeout. Stopping a member waits for such connections (up to 1 s)
// and the rest outlive the cluster, which goleak reports, so the timeout must
// be short. Members in one process exchange heartbeats every 10 ms, far more
// often than it expires.
const peerReadTimeout = 250 * time.Millisecond

// walSegmentBytes replaces etcd's 64 MB write-ahead log segment. Every member
// preallocates a segment and a spare one, 128 MB with the default, on
// TMPDIR's disk, or in memory where that is a tmpfs; a test writes a small
// part of that. A member that fills a segment cuts to the spare and
// preallocates the next, a few milliseconds every ~4 MB of writes.
const walSegmentBytes = 4 * 1000 * 1000

// The timeout and the segment size are process-wide settings of etcd, read
// when a member starts, hence set before any test runs.
func init() {
	rafthttp.ConnReadTimeout = peerReadTimeout
	wal.SegmentSizeBytes = walSegmentBytes
}

// A Cluster is an etcd cluster of several members running in the test's
// process, each with its data in a tb.TempDir(), configured like a Server.
// Members are numbered from 0 and keep their URLs and data across Stop,
// Kill and Restart. The members reach each other through a TCP proxy in
// front of each one's peer listener, which Lag uses to hold their messages.
//
// Methods that stop or start members report failures through the tb given to
// StartCluster, so call them from that test's goroutine. A Cluster is
// otherwise safe for concurrent use; Stop, Kill, Restart and Close run one at
// a time, and Leader, while it waits, sees each of them take effect.
type Cluster struct {
	tb    testing.TB
	o     *options
	certs *certs
	owned owned
	once  sync.Once
	lag   *lagState

	ext *external // under ETCDTEST_ENDPOINTS, in place of the members

	mu      sync.Mutex
	members []*member
	proxies []*peerProxy // in front of the members' peer listeners, in member order
	closed  bool
}

// StartCluster starts an n-member etcd cluster on 127.0.0.1 and returns once
// every member is ready, which implies that a leader has been elected. It
// calls tb.Fatal if a member fails to start or is not ready within 30 s, and
// registers Close with tb.Cleanup. It panics if n < 1.
//
// Ports are picked free before the members start, since every member must
// know its peers' URLs in advance, and stay taken while a member is stopped.
// If another socket takes one in the moment between, StartCluster retries
// with new ports, at most three times in all, and Restart fails the test.
//
// Under ETCDTEST_ENDPOINTS, StartCluster starts nothing and the Cluster is
// the external etcd: its Endpoints, and clients under a prefix of their own
// as with a Server on an external etcd. StartCluster skips the test if the
// external etcd has fewer than n endpoints, and Stop, Kill, Restart, Lag,
// CatchUp and Leader skip it, saying why.
func StartCluster(tb testing.TB, n int, opts ...Option) *Cluster {
	tb.Helper()
	if n < 1 {
		panic(fmt.Sprintf("etcdtest: StartCluster with %d members", n))
	}
	c := &Cluster{tb: tb, o: buildOptions(opts), lag: newLagState(n)}
	if ext := useExternal(tb, c.o); ext != nil {
		if len(ext.endpoints) < n {
			tb.Skipf("etcdtest: StartCluster(%d) needs %d endpoints; %s has %d", n, n, EnvEndpoints, len(ext.endpoints))
		}
		sc, err := newScope(ext, c.o)
		if err != nil {
			tb.Fatalf("%v", err)
		}
		c.o.scope, c.certs, c.ext = sc, ext.certs, ext
		tb.Cleanup(func() {
			c.Close()
			if err := sc.close(); err != nil {
				tb.Errorf("%v", err)
			}
		})
		return c
	}
	scheme := "http"
	if c.o.tls {
		crt, err := newCerts(tb.TempDir(), c.o.clientCertAuth)
		if err != nil {
			tb.Fatalf("%v", err)
		}
		c.certs, scheme = crt, "https"
	}
	for attempt := 1; ; attempt++ {
		err := c.startMembers(tb, n, scheme)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EADDRINUSE) || attempt == 3 {
			tb.Fatalf("%v", err)
		}
	}
	tb.Cleanup(c.Close)
	deadline := time.After(readyTimeout)
	for _, m := range c.members {
		if err := m.waitReady(deadline); err != nil {
			tb.Fatalf("%v", err)
		}
	}
	return c
}

// startMembers starts n new members on fresh ports, or none.
func (c *Cluster) startMembers(tb testing.TB, n int, scheme string) error {
	token := rand.Text()
	members := make([]*member, 0, n)
	proxies := make([]*peerProxy, 0, n)
	abort := func() {
		for _, m := range members {
			m.stop(crash, releasePorts)
		}
		for _, p := range proxies {
			p.close()
		}
	}
	for i := range n {
		hold, err := holdFreePorts(2)
		if err != nil {
			abort()
			return err
		}
		ports := hold.ports()
		m := &member{
			name:      fmt.Sprintf("m%d", i),
			dir:       tb.TempDir(),
			clientURL: localURL(scheme, ports[0]),
			listenURL: localURL("http", ports[1]),
			token:     token,
			hold:      hold,
		}
		members = append(members, m)
		p, err := newPeerProxy(i, m.listenURL.Host, c.lag)
		if err != nil {
			abort()
			return fmt.Errorf("etcdtest: peer proxy of member %s: %w", m.name, err)
		}
		proxies = append(proxies, p)
		m.peerURL = url.URL{Scheme: "http", Host: p.addr()}
	}
	peers := make([]string, n)
	for i, m := range members {
		peers[i] = m.name + "=" + m.peerURL.String()
	}
	for _, m := range members {
		m.cluster = strings.Join(peers, ",")
		if err := m.start(c.o, c.certs); err != nil {
			abort()
			return err
		}
	}
	ids := make([]string, n)
	for i, m := range members {
		ids[i] = m.e.Server.MemberID().String()
	}
	c.lag.setIDs(ids)
	c.members, c.proxies = members, proxies
	return nil
}

// Members returns the number of members, running or not; on an external
// etcd, the number of its endpoints.
func (c *Cluster) Members() int {
	if c.ext != nil {
		return len(c.ext.endpoints)
	}
	return len(c.members)
}

// Endpoints returns the client URLs of all members in member order, such as
// http://127.0.0.1:40123 (https under WithTLS), including stopped members.
// They do not change on Restart.
func (c *Cluster) Endpoints() []string {
	if c.ext != nil {
		return append([]string(nil), c.ext.endpoints...)
	}
	eps := make([]string, len(c.members))
	for i, m := range c.members {
		eps[i] = m.endpoint
	}
	return eps
}

// TLS returns the client-side TLS files and config, or nil without WithTLS.
// Each call returns a new copy, free to modify.
func (c *Cluster) TLS() *TLSFiles {
	if c.certs == nil {
		return nil
	}
	return c.certs.client.clone()
}

// Client returns a new client with the endpoints of all members, like
// Server.Client: closed by tb.Cleanup or by Close, whichever comes first.
func (c *Cluster) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	return client(tb, &c.owned, c.Endpoints(), c.o, c.certs)
}

// ProxiedClient returns a new client whose traffic to each member goes
// through a TCP proxy of its own, and the Proxy that controls them all. The
// client and the proxies are closed together, by tb.Cleanup or by Close.
func (c *Cluster) ProxiedClient(tb testing.TB) (*clientv3.Client, *Proxy) {
	tb.Helper()
	return proxiedClient(tb, &c.owned, c.Endpoints(), c.o, c.certs)
}

// Leader returns the index of the leader, or -1 if there is none. It waits up
// to 5 s for the running members to agree on a running leader, as they do
// shortly after an election, and returns -1 at once when fewer than a quorum
// of members run. Members that lag (Lag) are not asked: they cannot hear the
// leader. The answer may be stale as soon as it is returned.
func (c *Cluster) Leader() int {
	if c.ext != nil {
		c.tb.Helper()
		skipFault(c.tb, "Cluster.Leader")
	}
	deadline := time.Now().Add(leaderWait)
	for {
		c.mu.Lock()
		i, final := c.leaderLocked()
		c.mu.Unlock()
		if i >= 0 || final || time.Now().After(deadline) {
			return i
		}
		time.Sleep(tickMs * time.Millisecond)
	}
}

// leaderLocked returns the leader all running members agree on; final is
// true when there cannot be one.
func (c *Cluster) leaderLocked() (i int, final bool) {
	if c.runningLocked() < len(c.members)/2+1 {
		return -1, true
	}
	var lead types.ID
	for i, m := range c.members {
		if m.e == nil || c.lag.lags(i) {
			continue
		}
		l := m.e.Server.Leader()
		if l == 0 || (lead != 0 && l != lead) {
			return -1, false
		}
		lead = l
	}
	for i, m := range c.members {
		if m.e != nil && m.e.Server.MemberID() == lead {
			return i, false
		}
	}
	return -1, false
}

func (c *Cluster) runningLocked() int {
	n := 0
	for _, m := range c.members {
		if m.e != nil {
			n++
		}
	}
	return n
}

// member returns member i, or panics.
func (c *Cluster) member(method string, i int) *member {
	if c.ext != nil {
		c.tb.Helper()
		skipFault(c.tb, "Cluster."+method)
	}
	if i < 0 || i >= len(c.members) {
		panic(fmt.Sprintf("etcdtest: %s(%d) of a %d-member cluster", method, i, len(c.members)))
	}
	return c.members[i]
}

// Stop stops member i gracefully: a leader hands its leadership to another
// member first, as etcd does on SIGTERM. Open watch and keep-alive streams on
// the member end at once with codes.Unavailable, where etcd would wait up to
// its 5 s request timeout, so clients fail over without delay. A request that
// reaches the member as it stops fails with codes.Unavailable too; clientv3
// retries reads on another member, not writes.
//
// While the member is stopped its ports stay taken, and connections to them
// are reset at once, much like refused ones. Stop does nothing if the member
// is already stopped, and panics if i is out of range.
func (c *Cluster) Stop(i int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.member("Stop", i).stop(graceful, keepPorts)
}

// Kill stops member i abruptly, like a crash: raft stops at once, with no
// leadership hand-over; streams and requests fail as with Stop, and
// requests under way get no answer (codes.Unavailable) whether or not they
// took effect. Kill first lets those requests finish, up to 1 s, since
// etcd's hard stop closes the storage under reads still running, which
// crashes the test process (etcd #17223). Data written before Kill
// survives in the data directory, since the test process itself goes on
// (the fsync that etcd skips without WithFsync only matters for a machine
// crash). Kill does nothing if the member is already stopped, and panics if
// i is out of range.
func (c *Cluster) Kill(i int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.member("Kill", i).stop(crash, keepPorts)
}

// Restart starts the stopped member i again with its data directory and URLs.
// When it makes a quorum with the running members, Restart returns once every
// running member is ready to serve; without a quorum no member can be ready,
// so it returns as soon as the member has started. It calls tb.Fatal if the
// member fails to start (as when another socket took one of its ports) or
// the running members are not ready within 30 s. Restart panics if i is out
// of range, if member i runs or lags (see Lag), or after Close.
func (c *Cluster) Restart(i int) {
	c.tb.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.member("Restart", i)
	if c.closed {
		panic(fmt.Sprintf("etcdtest: Restart(%d) after Close", i))
	}
	if m.e != nil {
		panic(fmt.Sprintf("etcdtest: Restart(%d) of a running member", i))
	}
	if c.lag.lags(i) {
		panic(fmt.Sprintf("etcdtest: Restart(%d) of a member that lags: it cannot be ready before CatchUp", i))
	}
	if err := m.start(c.o, c.certs); err != nil {
		c.tb.Fatalf("%v", err)
	}
	if c.runningLocked() < len(c.members)/2+1 {
		return
	}
	deadline := time.After(readyTimeout)
	for _, m := range c.members {
		if m.e == nil {
			continue
		}
		if err := m.waitReady(deadline); err != nil {
			c.tb.Fatalf("%v", err)
		}
	}
}

// Close closes the clients and proxies handed out by c, then stops every
// member, abruptly since the cluster's data is thrown away, and the proxies
// between the members, dropping what a lag held. Close is safe to call more
// than once and concurrently: every call returns once all members and
// proxies have stopped.
func (c *Cluster) Close() {
	c.once.Do(func() {
		c.owned.closeAll()
		c.mu.Lock()
		defer c.mu.Unlock()
		c.closed = true
		var wg sync.WaitGroup
		for _, m := range c.members {
			wg.Go(func() {
				m.stop(crash, releasePorts)
			})
		}
		wg.Wait()
		for _, p := range c.proxies {
			p.close()
		}
	})
}
