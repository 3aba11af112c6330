package etcdtest_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// opTimeout bounds operations expected to succeed; it is generous so that
// slow CI machines and -race do not fail the tests.
const opTimeout = 10 * time.Second

// embeddedOnly skips a test that mixes clients of its own with those of
// etcdtest, which do not share a prefix on an external etcd.
func embeddedOnly(t *testing.T) {
	t.Helper()
	if eps := os.Getenv(etcdtest.EnvEndpoints); eps != "" {
		t.Skipf("mixes its own clients with etcdtest's, which live under a prefix on the external etcd %s", eps)
	}
}

func put(t *testing.T, c *clientv3.Client, key, val string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	if _, err := c.Put(ctx, key, val); err != nil {
		t.Fatalf("put %q: got %v, want nil", key, err)
	}
}

// putRetry puts like a caller that retries failed writes, as callers must
// right after a member stops: a client that has not yet noticed may still send
// the request to it, and clientv3 does not retry a write that may have been
// sent.
func putRetry(t *testing.T, c *clientv3.Client, key, val string) {
	t.Helper()
	deadline := time.Now().Add(opTimeout)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
		_, err := c.Put(ctx, key, val)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("put %q: got %v, want nil", key, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func get(t *testing.T, c *clientv3.Client, key string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	resp, err := c.Get(ctx, key)
	if err != nil {
		t.Fatalf("get %q: got %v, want nil", key, err)
	}
	if len(resp.Kvs) != 1 {
		t.Fatalf("get %q: got %d keys, want 1", key, len(resp.Kvs))
	}
	return string(resp.Kvs[0].Value)
}

// getErr returns the error of a Get bounded by d.
func getErr(t *testing.T, c *clientv3.Client, key string, d time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	_, err := c.Get(ctx, key)
	return err
}

// singleClient returns a client of one endpoint only, closed at the end of
// the test.
func singleClient(t *testing.T, endpoint string, tlsFiles *etcdtest.TLSFiles) *clientv3.Client {
	t.Helper()
	cfg := clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if tlsFiles != nil {
		cfg.TLS = tlsFiles.Config
	}
	c, err := clientv3.New(cfg)
	if err != nil {
		t.Fatalf("new client: got %v, want nil", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestStartPutGet(t *testing.T) {
	srv := etcdtest.Start(t)
	eps := srv.Endpoints()
	if len(eps) != 1 || !strings.HasPrefix(eps[0], "http://127.0.0.1:") {
		t.Fatalf("endpoints: got %q, want [http://127.0.0.1:PORT]", eps)
	}
	if got := srv.TLS(); got != nil {
		t.Fatalf("TLS without WithTLS: got %+v, want nil", got)
	}
	c := srv.Client(t)
	put(t, c, t.Name(), "v")
	if got := get(t, c, t.Name()); got != "v" {
		t.Fatalf("value: got %q, want %q", got, "v")
	}
}

func TestClientClosedOnCleanup(t *testing.T) {
	srv := etcdtest.Start(t)
	var c *clientv3.Client
	t.Run("sub", func(t *testing.T) {
		c = srv.Client(t)
		put(t, c, t.Name(), "v")
	})
	if err := c.Ctx().Err(); !errors.Is(err, context.Canceled) {
		t.Fatalf("client context after subtest cleanup: got %v, want %v", err, context.Canceled)
	}
	// The server outlives the subtest's client.
	put(t, srv.Client(t), t.Name(), "v")
}

func TestCloseClosesClients(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client(t)
	pc, _ := srv.ProxiedClient(t)
	srv.Close()
	for name, cli := range map[string]*clientv3.Client{"client": c, "proxied client": pc} {
		if err := cli.Ctx().Err(); !errors.Is(err, context.Canceled) {
			t.Errorf("%s context after Close: got %v, want %v", name, err, context.Canceled)
		}
	}
}

func TestCloseTwice(t *testing.T) {
	srv := etcdtest.Start(t)
	put(t, srv.Client(t), t.Name(), "v")
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(srv.Close)
	}
	wg.Wait()
	srv.Close()
}

// TestCloseWithOpenStreams closes a server while a client it does not own
// holds a watch and a lease keep-alive stream open.
func TestCloseWithOpenStreams(t *testing.T) {
	srv := etcdtest.Start(t)
	c := singleClient(t, srv.Endpoints()[0], nil)
	wch := c.Watch(t.Context(), t.Name())
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	lease, err := c.Grant(ctx, 5)
	if err != nil {
		t.Fatalf("grant: got %v, want nil", err)
	}
	if _, err := c.KeepAlive(t.Context(), lease.ID); err != nil {
		t.Fatalf("keep-alive: got %v, want nil", err)
	}
	put(t, c, t.Name(), "v")
	if resp := <-wch; len(resp.Events) != 1 {
		t.Fatalf("watch events: got %d, want 1", len(resp.Events))
	}
	srv.Close()
}

func TestTLS(t *testing.T) {
	testflags.Parallel(t)
	srv := etcdtest.Start(t, etcdtest.WithTLS())
	ep := srv.Endpoints()[0]
	if !strings.HasPrefix(ep, "https://127.0.0.1:") {
		t.Fatalf("endpoint: got %q, want https://127.0.0.1:PORT", ep)
	}
	files := srv.TLS()
	if files == nil || files.Config == nil {
		t.Fatalf("TLS: got %+v, want files and a config", files)
	}

	put(t, srv.Client(t), t.Name(), "v")

	plain := singleClient(t, "http://"+strings.TrimPrefix(ep, "https://"), nil)
	if err := getErr(t, plain, t.Name(), time.Second); err == nil {
		t.Fatalf("get over plain http: got nil error, want a failure")
	}

	// The files alone make a working client, as they would for etcdctl.
	info := transport.TLSInfo{CertFile: files.CertFile, KeyFile: files.KeyFile, TrustedCAFile: files.CAFile}
	cfg, err := info.ClientConfig()
	if err != nil {
		t.Fatalf("client config from files: got %v, want nil", err)
	}
	fromFiles := singleClient(t, ep, &etcdtest.TLSFiles{Config: cfg})
	if got := get(t, fromFiles, t.Name()); got != "v" {
		t.Fatalf("value: got %q, want %q", got, "v")
	}
}

func TestClientCertAuth(t *testing.T) {
	testflags.Parallel(t)
	srv := etcdtest.Start(t, etcdtest.WithClientCertAuth())
	put(t, srv.Client(t), t.Name(), "v")

	noCert := srv.TLS()
	noCert.Config.Certificates = nil
	anon := singleClient(t, srv.Endpoints()[0], noCert)
	if err := getErr(t, anon, t.Name(), time.Second); err == nil {
		t.Fatalf("get without a client certificate: got nil error, want a failure")
	}

	if got := get(t, singleClient(t, srv.Endpoints()[0], srv.TLS()), t.Name()); got != "v" {
		t.Fatalf("value: got %q, want %q", got, "v")
	}
}

func TestProxiedClientBlackhole(t *testing.T) {
	testflags.Parallel(t)
	srv := etcdtest.Start(t)
	c, p := srv.ProxiedClient(t)
	if got, want := p.Endpoints(), srv.Endpoints(); len(got) != 1 || slices.Equal(got, want) {
		t.Fatalf("proxy endpoints: got %q, want one endpoint other than %q", got, want)
	}
	put(t, c, t.Name(), "v")

	p.Blackhole()
	if err := getErr(t, c, t.Name(), 300*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("get while blackholed: got %v, want %v", err, context.DeadlineExceeded)
	}
	// The proxy holds up this client only.
	if got := get(t, srv.Client(t), t.Name()); got != "v" {
		t.Fatalf("value through a direct client: got %q, want %q", got, "v")
	}

	p.Unblackhole()
	if got := get(t, c, t.Name()); got != "v" {
		t.Fatalf("value after Unblackhole: got %q, want %q", got, "v")
	}
}

func TestProxiedClientDelay(t *testing.T) {
	testflags.Parallel(t)
	srv := etcdtest.Start(t)
	c, p := srv.ProxiedClient(t)
	put(t, c, t.Name(), "v")

	// Each direction waits 500 ms, so a 200 ms deadline cannot be met.
	p.Delay(500 * time.Millisecond)
	if err := getErr(t, c, t.Name(), 200*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("get under delay: got %v, want %v", err, context.DeadlineExceeded)
	}
	if got := get(t, c, t.Name()); got != "v" {
		t.Fatalf("value under delay: got %q, want %q", got, "v")
	}

	p.Undelay()
	if got := get(t, c, t.Name()); got != "v" {
		t.Fatalf("value after Undelay: got %q, want %q", got, "v")
	}
}

func TestProxiedClientPause(t *testing.T) {
	testflags.Parallel(t)
	srv := etcdtest.Start(t)
	c, p := srv.ProxiedClient(t)
	put(t, c, t.Name(), "v")

	p.Pause()
	if err := getErr(t, c, t.Name(), 300*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("get while paused: got %v, want %v", err, context.DeadlineExceeded)
	}
	p.Unpause()
	if got := get(t, c, t.Name()); got != "v" {
		t.Fatalf("value after Unpause: got %q, want %q", got, "v")
	}
}

func TestProxiedClientTLS(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.WithClientCertAuth())
	c, p := srv.ProxiedClient(t)
	if ep := p.Endpoints()[0]; !strings.HasPrefix(ep, "https://127.0.0.1:") {
		t.Fatalf("proxy endpoint: got %q, want https://127.0.0.1:PORT", ep)
	}
	put(t, c, t.Name(), "v")
	if got := get(t, c, t.Name()); got != "v" {
		t.Fatalf("value: got %q, want %q", got, "v")
	}
}

func TestCluster(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	if got := c.Members(); got != 3 {
		t.Fatalf("members: got %d, want 3", got)
	}
	eps := c.Endpoints()
	if len(eps) != 3 {
		t.Fatalf("endpoints: got %q, want 3", eps)
	}

	put(t, singleClient(t, eps[0], nil), t.Name(), "v")
	if got := get(t, singleClient(t, eps[1], nil), t.Name()); got != "v" {
		t.Fatalf("value through another member: got %q, want %q", got, "v")
	}

	lead := c.Leader()
	if lead < 0 || lead >= 3 {
		t.Fatalf("leader: got %d, want 0, 1 or 2", lead)
	}

	cli := c.Client(t)
	c.Stop(lead)
	c.Stop(lead) // a no-op
	next := c.Leader()
	if next < 0 || next == lead {
		t.Fatalf("leader after Stop(%d): got %d, want another member", lead, next)
	}
	putRetry(t, cli, t.Name(), "after stop")

	c.Restart(lead)
	if got := get(t, singleClient(t, eps[lead], nil), t.Name()); got != "after stop" {
		t.Fatalf("value on the restarted member: got %q, want %q", got, "after stop")
	}

	victim := (c.Leader() + 1) % 3
	c.Kill(victim)
	putRetry(t, cli, t.Name(), "after kill")
	c.Restart(victim)
	if got := get(t, singleClient(t, eps[victim], nil), t.Name()); got != "after kill" {
		t.Fatalf("value on the member restarted after Kill: got %q, want %q", got, "after kill")
	}
	if got := c.Leader(); got < 0 {
		t.Fatalf("leader after restarts: got %d, want a member", got)
	}
}

func TestClusterQuorumLoss(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	cli := c.Client(t)
	put(t, cli, t.Name(), "v")

	c.Kill(0)
	c.Kill(1)
	if got := c.Leader(); got != -1 {
		t.Fatalf("leader without quorum: got %d, want -1", got)
	}
	if err := getErr(t, cli, t.Name(), 300*time.Millisecond); err == nil {
		t.Fatalf("linearizable get without quorum: got nil error, want a failure")
	}

	c.Restart(0) // restores the quorum: returns once members 0 and 2 serve
	if got := get(t, cli, t.Name()); got != "v" {
		t.Fatalf("value after quorum is back: got %q, want %q", got, "v")
	}
	c.Restart(1)
}

// TestClusterWatchSurvivesStop stops the only member a watch can use: the
// stream ends as it would on a dropped connection, and the watch resumes,
// without losing events, once the member is back.
func TestClusterWatchSurvivesStop(t *testing.T) {
	embeddedOnly(t) // its watch is outside the prefix of c's clients there
	c := etcdtest.StartCluster(t, 3)
	w := singleClient(t, c.Endpoints()[0], nil)
	wch := w.Watch(t.Context(), t.Name(), clientv3.WithPrefix())
	cli := c.Client(t)
	put(t, cli, t.Name()+"/1", "v")
	if resp := <-wch; len(resp.Events) != 1 {
		t.Fatalf("watch events before Stop: got %d, want 1", len(resp.Events))
	}

	c.Stop(0)
	putRetry(t, cli, t.Name()+"/2", "v")
	c.Restart(0)

	select {
	case resp, ok := <-wch:
		if !ok || resp.Err() != nil || len(resp.Events) != 1 || string(resp.Events[0].Kv.Key) != t.Name()+"/2" {
			t.Fatalf("watch after Restart: got %+v (open %v), want the event for %s/2", resp, ok, t.Name())
		}
	case <-time.After(opTimeout):
		t.Fatalf("watch after Restart: got nothing in %v, want the event for %s/2", opTimeout, t.Name())
	}
}

func TestClusterProxiedClient(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	cli, p := c.ProxiedClient(t)
	if got := len(p.Endpoints()); got != 3 {
		t.Fatalf("proxy endpoints: got %d, want 3", got)
	}
	put(t, cli, t.Name(), "v")

	p.Blackhole()
	if err := getErr(t, cli, t.Name(), 300*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("get while blackholed: got %v, want %v", err, context.DeadlineExceeded)
	}
	p.Unblackhole()
	if got := get(t, cli, t.Name()); got != "v" {
		t.Fatalf("value after Unblackhole: got %q, want %q", got, "v")
	}
}

func TestClusterTLS(t *testing.T) {
	c := etcdtest.StartCluster(t, 3, etcdtest.WithClientCertAuth())
	for _, ep := range c.Endpoints() {
		if !strings.HasPrefix(ep, "https://127.0.0.1:") {
			t.Fatalf("endpoint: got %q, want https://127.0.0.1:PORT", ep)
		}
	}
	put(t, c.Client(t), t.Name(), "v")
	if got := get(t, singleClient(t, c.Endpoints()[2], c.TLS()), t.Name()); got != "v" {
		t.Fatalf("value: got %q, want %q", got, "v")
	}
}

func TestClusterCloseTwice(t *testing.T) {
	c := etcdtest.StartCluster(t, 1)
	put(t, c.Client(t), t.Name(), "v")
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(c.Close)
	}
	wg.Wait()
	c.Close()
	c.Stop(0) // a no-op once closed
}

// BenchmarkStart measures Start until the server is ready; ms/start-median
// is the median over the iterations.
func BenchmarkStart(b *testing.B) {
	var took []time.Duration
	for b.Loop() {
		tb := &scopedTB{TB: b}
		start := time.Now()
		etcdtest.Start(tb)
		took = append(took, time.Since(start))
		tb.cleanup()
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2])/float64(time.Millisecond), "ms/start-median")
}

func TestNewAndNewClient(t *testing.T) {
	srv, err := etcdtest.New()
	if err != nil {
		t.Fatalf("New: got %v, want nil", err)
	}
	cli, err := srv.NewClient()
	if err != nil {
		t.Fatalf("NewClient: got %v, want nil", err)
	}
	if _, err := cli.Put(t.Context(), "k", "v"); err != nil {
		t.Fatalf("put: got %v, want nil", err)
	}
	srv.Close()
	srv.Close()
	if _, err := srv.NewClient(); err == nil {
		t.Error("NewClient after Close: got nil error, want one")
	}
}

// walFsyncs returns how many times the etcd servers of this process have
// fsynced their write-ahead logs, from the
// etcd_disk_wal_fsync_duration_seconds histogram on srv's /metrics. etcd
// counts only the fsyncs it makes: none under UnsafeNoFsync.
func walFsyncs(t *testing.T, srv *etcdtest.Server) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.Endpoints()[0]+"/metrics", nil)
	if err != nil {
		t.Fatalf("metrics request: got %v, want nil", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET /metrics: got %v, want nil", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read /metrics: got %v, want nil", err)
	}
	const name = "etcd_disk_wal_fsync_duration_seconds_count "
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("%s%s: got %v, want a count", name, v, err)
			}
			return n
		}
	}
	t.Fatalf("GET /metrics: no %q line", name)
	return 0
}

// TestWithFsync checks that a server started with WithFsync fsyncs its
// write-ahead log on every write and that the default one never does. The
// fsync counter is shared by every server of the process, so the two run one
// after the other and this test is not parallel.
func TestWithFsync(t *testing.T) {
	if os.Getenv(etcdtest.EnvEndpoints) != "" {
		t.Skip("counts the WAL fsyncs of an embedded member")
	}
	const puts = 20
	for _, tc := range []struct {
		name string
		opts []etcdtest.Option
		min  int64 // fewest fsyncs over the puts
		max  int64 // most
	}{
		{"default", nil, 0, 0},
		{"WithFsync", []etcdtest.Option{etcdtest.WithFsync()}, puts, math.MaxInt64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := etcdtest.Start(t, tc.opts...)
			c := srv.Client(t)
			before := walFsyncs(t, srv)
			for i := range puts {
				put(t, c, fmt.Sprintf("%s/%d", t.Name(), i), "v")
			}
			got := walFsyncs(t, srv) - before
			if got < tc.min || got > tc.max {
				t.Fatalf("WAL fsyncs over %d sequential puts: got %d, want %d to %d", puts, got, tc.min, tc.max)
			}
		})
	}
}

func TestNewProxiedClient(t *testing.T) {
	testflags.Parallel(t)
	srv, err := etcdtest.New()
	if err != nil {
		t.Fatalf("New: got %v, want nil", err)
	}
	defer srv.Close()
	c, p, err := srv.NewProxiedClient()
	if err != nil {
		t.Fatalf("NewProxiedClient: got %v, want nil", err)
	}
	put(t, c, t.Name(), "v")
	p.Blackhole()
	if err := getErr(t, c, t.Name(), 300*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("get while blackholed: got %v, want %v", err, context.DeadlineExceeded)
	}
	p.Unblackhole()
	if got := get(t, c, t.Name()); got != "v" {
		t.Fatalf("value after Unblackhole: got %q, want %q", got, "v")
	}
	srv.Close()
	if _, err := c.Get(t.Context(), t.Name()); err == nil {
		t.Error("get after Close: got nil error, want the client closed")
	}
	if _, _, err := srv.NewProxiedClient(); err == nil {
		t.Error("NewProxiedClient after Close: got nil error, want one")
	}
}

// TestClusterKillUnderReads kills a member again and again while clients
// read from it as fast as they can: etcd's HardStop closes the backend under
// reads still running, which crashes the whole process unless Kill lets
// them finish first (unanswered, as a crash leaves them). etcd #17223.
func TestClusterKillUnderReads(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	const victim = 0
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := c.Client(t).Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	var reads, failed atomicCount
	for range 4 {
		cl, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints()[victim : victim+1], DialTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		wg.Go(func() {
			for ctx.Err() == nil {
				rctx, rcancel := context.WithTimeout(ctx, time.Second)
				_, err := cl.Txn(rctx).If(clientv3.Compare(clientv3.Version("k"), ">", 0)).
					Then(clientv3.OpGet("k", clientv3.WithSerializable())).Commit()
				rcancel()
				if err != nil {
					failed.add()
					time.Sleep(time.Millisecond)
				} else {
					reads.add()
				}
			}
		})
	}
	for range 8 {
		time.Sleep(100 * time.Millisecond)
		c.Kill(victim)
		time.Sleep(50 * time.Millisecond)
		c.Restart(victim)
	}
	cancel()
	wg.Wait()
	t.Logf("8 kills: %d reads answered, %d not", reads.load(), failed.load())
	if reads.load() == 0 {
		t.Error("no read answered: the test read nothing")
	}
}

type atomicCount struct {
	mu sync.Mutex
	n  int
}

func (a *atomicCount) add() { a.mu.Lock(); a.n++; a.mu.Unlock() }
func (a *atomicCount) load() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n
}
