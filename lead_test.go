package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/syncbuf"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// A leaderLog records the terms of candidates' f, and checks the rule that
// matters: never two f running at once.
type leaderLog struct {
	t *testing.T
	// overlap: a deposed leader's f may still run when the next one's
	// starts, as when an operator deletes the leader's key (the next one
	// holds at once; the deposed one learns of it within Done's bound).
	overlap bool

	mu      sync.Mutex
	running map[string]int64 // candidate → token of its running f
	terms   []term
	changed chan struct{} // closed and replaced on every start and end
}

type term struct {
	who        string
	token      int64
	start, end time.Time
}

func newLeaderLog(t *testing.T) *leaderLog {
	return &leaderLog{t: t, running: make(map[string]int64), changed: make(chan struct{})}
}

// f returns a candidate's duty: it records its term and runs until its
// context ends.
func (l *leaderLog) f(who string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		h, ok := etcdlock.HoldFrom(ctx)
		if !ok || h.Token <= 0 || h.Lease == 0 || h.Key != keyOf(h.Name, h.Lease) {
			l.t.Errorf("%s: HoldFrom(f's context): got %+v, %v, want a token and the lease of the key", who, h, ok)
		}
		l.mu.Lock()
		for other := range l.running {
			if !l.overlap {
				l.t.Errorf("%s leads (token %d) while %s's f still runs", who, h.Token, other)
			}
		}
		for _, prev := range l.terms {
			if prev.token >= h.Token {
				l.t.Errorf("%s leads with token %d, not above %s's earlier %d", who, h.Token, prev.who, prev.token)
			}
		}
		l.running[who] = h.Token
		l.terms = append(l.terms, term{who: who, token: h.Token, start: time.Now()})
		i := len(l.terms) - 1
		l.notify()
		l.mu.Unlock()

		<-ctx.Done()

		l.mu.Lock()
		delete(l.running, who)
		l.terms[i].end = time.Now()
		l.notify()
		l.mu.Unlock()
		return ctx.Err()
	}
}

func (l *leaderLog) notify() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// leader waits until some candidate other than not leads, and returns it.
func (l *leaderLog) leader(not string) (string, term) {
	deadline := time.After(testTimeout)
	for {
		l.mu.Lock()
		for who := range l.running {
			if who != not {
				tm := l.terms[len(l.terms)-1]
				l.mu.Unlock()
				return who, tm
			}
		}
		ch := l.changed
		l.mu.Unlock()
		select {
		case <-ch:
		case <-deadline:
			l.t.Fatalf("no leader other than %q after %v", not, testTimeout)
		}
	}
}

// ended returns when who's last term ended.
func (l *leaderLog) ended(who string) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.terms) - 1; i >= 0; i-- {
		if l.terms[i].who == who {
			return l.terms[i].end
		}
	}
	return time.Time{}
}

// A candidate runs Lead in a goroutine until stopped.
type candidate struct {
	cancel context.CancelFunc
	result chan error
}

func campaign(ctx context.Context, client *clientv3.Client, name string, f func(context.Context) error, opts ...etcdlock.SessionOption) *candidate {
	ctx, cancel := context.WithCancel(ctx)
	c := &candidate{cancel: cancel, result: make(chan error, 1)}
	go func() { c.result <- etcdlock.Lead(ctx, client, name, f, opts...) }()
	return c
}

// stop cancels the candidate and returns Lead's result.
func (c *candidate) stop(t *testing.T) error {
	t.Helper()
	c.cancel()
	return waitErr(t, c.result)
}

// TestLead: one leader at a time, in FIFO order; cancelling the leader's
// context cancels its f, waits for it, releases, and a backup leads; f's
// own error ends Lead with it; bad input gets an error.
func TestLead(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	log := newLeaderLog(t)
	candidates := map[string]*candidate{}
	for _, who := range []string{"a", "b", "c"} {
		candidates[who] = campaign(ctx, client, name, log.f(who), etcdlock.WithTTL(5*time.Second), etcdlock.WithIdentity(who))
		if who == "a" {
			log.leader("")
		}
	}
	eventually(t, "three candidates queued", func() bool { return len(lockKeys(t, client, name)) == 3 })
	for range 2 {
		who, _ := log.leader("")
		if err := candidates[who].stop(t); !errors.Is(err, context.Canceled) {
			t.Errorf("Lead of %s after its ctx was cancelled: got %v, want context.Canceled", who, err)
		}
		delete(candidates, who)
		next, _ := log.leader(who)
		t.Logf("%s stopped, %s leads", who, next)
	}
	for _, c := range candidates {
		_ = c.stop(t)
	}
	if keys := lockKeys(t, client, name); len(keys) != 0 {
		t.Errorf("keys after every candidate stopped: got %q, want none", keys)
	}

	boom := errors.New("boom")
	if err := etcdlock.Lead(ctx, client, name, func(context.Context) error { return boom }); !errors.Is(err, boom) {
		t.Errorf("Lead with f failing: got %v, want f's error", err)
	}
	if err := etcdlock.Lead(ctx, client, "", log.f("x")); !errors.Is(err, etcdlock.ErrInvalidName) {
		t.Errorf("Lead with the empty name: got %v, want ErrInvalidName", err)
	}
	if err := etcdlock.Lead(ctx, nil, name, log.f("x")); !errors.Is(err, etcdlock.ErrInvalidArgument) {
		t.Errorf("Lead with a nil client: got %v, want ErrInvalidArgument", err)
	}
	if err := etcdlock.Lead(ctx, client, name, log.f("x"), etcdlock.WithTTL(-1)); !errors.Is(err, etcdlock.ErrInvalidArgument) {
		t.Errorf("Lead with a bad option: got %v, want ErrInvalidArgument", err)
	}

	// f returning nil is a term that ended: Lead campaigns again.
	terms := make(chan int64, 3)
	lctx, cancel := context.WithCancel(ctx)
	err := etcdlock.Lead(lctx, client, name, func(fctx context.Context) error {
		h, _ := etcdlock.HoldFrom(fctx)
		terms <- h.Token
		if len(terms) == cap(terms) {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) || len(terms) != 3 {
		t.Errorf("Lead with f returning nil: got %v after %d terms, want context.Canceled after 3", err, len(terms))
	}
}

// TestLeadFailover, on a 3-member etcd cluster: a leader cut off from etcd
// has its f cancelled before a backup's f starts; a leader whose process
// dies is replaced within the TTL; a change of etcd's own leader never gives
// two leaders at once.
func TestLeadFailover(t *testing.T) {
	testflags.Parallel(t)
	cluster := etcdtest.StartCluster(t, 3)
	ctx := testContext(t)
	name := lockName(t)
	const ttl = 2 * time.Second
	log := newLeaderLog(t)
	type node struct {
		c     *candidate
		proxy *etcdtest.Proxy
		dying *clientv3.Client
	}
	nodes := map[string]*node{}
	start := func(who string) {
		pc, proxy := cluster.ProxiedClient(t)
		nodes[who] = &node{c: campaign(ctx, pc, name, log.f(who), etcdlock.WithTTL(ttl)), proxy: proxy, dying: pc}
	}
	defer func() {
		for _, n := range nodes {
			n.proxy.Unblackhole()
			_ = n.c.stop(t)
		}
	}()
	for _, who := range []string{"a", "b", "c"} {
		start(who)
	}

	// The leader is cut off: its f stops before the backup's starts (the
	// leader log fails the test otherwise).
	cut, _ := log.leader("")
	nodes[cut].proxy.Blackhole()
	cutAt := time.Now()
	next, tm := log.leader(cut)
	t.Logf("%s cut off: its f stopped %v after the cut; %s led %v after the cut",
		cut, log.ended(cut).Sub(cutAt).Round(time.Millisecond), next, tm.start.Sub(cutAt).Round(time.Millisecond))
	nodes[cut].proxy.Unblackhole()

	// The leader's process dies: its client goes, with no revoke.
	dead, _ := log.leader("")
	if err := nodes[dead].dying.Close(); err != nil {
		t.Fatal(err)
	}
	diedAt := time.Now()
	next, tm = log.leader(dead)
	took := tm.start.Sub(diedAt)
	t.Logf("%s died; %s led %v later (TTL %v)", dead, next, took.Round(time.Millisecond), ttl)
	if took > 2*(ttl+time.Second) {
		t.Errorf("backup led %v after the leader died, want within TTL + 1s (%v), with slack", took, ttl+time.Second)
	}
	_ = nodes[dead].c.stop(t)
	delete(nodes, dead)

	// etcd's own leader is killed: still one leader at a time, and one
	// leads after.
	i := cluster.Leader()
	cluster.Kill(i)
	before, _ := log.leader("")
	time.Sleep(2 * ttl)
	after, _ := log.leader("")
	t.Logf("etcd member %d killed: %s led before, %s after", i, before, after)
	cluster.Restart(i)
}

// TestLeadRefusesSessionOptions: Lead refuses WithLease (a lease of the
// caller's is gone after one term) and WithContext (its end would revoke the
// lease while f runs) with ErrInvalidArgument and a message that names the
// option, before it runs f, writing nothing and leaving the lease alone.
func TestLeadRefusesSessionOptions(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	grant, err := client.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	errRan := errors.New("f ran")
	for _, tc := range []struct {
		option string
		opt    etcdlock.SessionOption
	}{
		{"WithLease", etcdlock.WithLease(grant.ID)},
		{"WithContext", etcdlock.WithContext(ctx)},
	} {
		ran := false
		err := etcdlock.Lead(ctx, client, name, func(context.Context) error { ran = true; return errRan }, tc.opt)
		if !errors.Is(err, etcdlock.ErrInvalidArgument) || !strings.Contains(fmt.Sprint(err), tc.option) {
			t.Errorf("Lead with %s: got %v, want ErrInvalidArgument naming %s", tc.option, err, tc.option)
		}
		if ran {
			t.Errorf("Lead with %s: f ran, want refused before f", tc.option)
		}
		if keys := lockKeys(t, client, name); len(keys) != 0 {
			t.Errorf("keys after Lead with %s: got %q, want none", tc.option, keys)
		}
		if !leaseAlive(t, client, grant.ID) {
			t.Errorf("the caller's lease after Lead with %s: revoked, want alive", tc.option)
		}
	}
}

// TestLeadPanicClosesSession: f's panic reaches Lead's caller after Lead
// has released the lock and closed its Session: its lease is revoked, and
// no key is left under the name.
func TestLeadPanicClosesSession(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	var lease clientv3.LeaseID
	r := catchPanic(func() {
		_ = etcdlock.Lead(ctx, client, name, func(fctx context.Context) error {
			h, _ := etcdlock.HoldFrom(fctx)
			lease = h.Lease
			panic("f's panic")
		})
	})
	if r != "f's panic" {
		t.Fatalf("Lead with f panicking: recovered %v, want f's panic", r)
	}
	if lease == clientv3.NoLease {
		t.Fatal("f ran without a hold: no lease to check")
	}
	if leaseAlive(t, client, lease) {
		t.Errorf("Lead's lease %x after f panicked: alive, want revoked (the Session closed)", lease)
	}
	if keys := lockKeys(t, client, name); len(keys) != 0 {
		t.Errorf("keys after f panicked: got %q, want none", keys)
	}
}

// TestLeadPacesShortTerms: an f that returns at once does not make Lead
// spin against etcd: Lead backs off between terms (50 ms, doubling to 1 s:
// at most 5 terms in a second), so fewer than 20 terms start in one second.
func TestLeadPacesShortTerms(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	name := lockName(t)
	const bound = 20
	var terms atomic.Int64
	ctx, cancel := context.WithTimeout(testContext(t), time.Second)
	defer cancel()
	err := etcdlock.Lead(ctx, client, name, func(context.Context) error {
		terms.Add(1)
		return nil
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Lead until its ctx ran out: got %v, want context.DeadlineExceeded", err)
	}
	n := terms.Load()
	t.Logf("%d terms in 1s", n)
	if n == 0 || n >= bound {
		t.Errorf("terms of an f that returns at once, in 1s: got %d, want 1 to %d", n, bound-1)
	}
	if keys := lockKeys(t, client, name); len(keys) != 0 {
		t.Errorf("keys after Lead returned: got %q, want none", keys)
	}
}

// TestLeadReportsSessionFailures: with etcd unreachable, Lead cannot make a
// Session; each failure reaches the observers and the logger as
// SessionFailed, so that a wrong endpoint does not look like a backup that
// is never elected. Once etcd is back, Lead leads.
func TestLeadReportsSessionFailures(t *testing.T) {
	testflags.Parallel(t)
	_, proxied, proxy := startProxied(t)
	name := lockName(t)
	proxy.Blackhole()

	var mu sync.Mutex
	var failures []etcdlock.Event
	var logged syncbuf.Buffer
	observer := etcdlock.ObserverFunc(func(e etcdlock.Event) {
		if e.Kind == etcdlock.SessionFailed {
			mu.Lock()
			failures = append(failures, e)
			mu.Unlock()
		}
	})
	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	led := make(chan struct{}, 1)
	done := result(func() error {
		return etcdlock.Lead(ctx, proxied, name, func(ctx context.Context) error {
			select {
			case led <- struct{}{}:
			default:
			}
			<-ctx.Done()
			return nil
		}, etcdlock.WithTTL(2*time.Second), etcdlock.WithObserver(observer),
			etcdlock.WithLogger(slog.New(slog.NewTextHandler(&logged, nil))))
	})
	// One attempt is bounded by the Session's 5 s setup timeout: 2x slack.
	start := time.Now()
	eventually(t, "a SessionFailed event", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(failures) > 0 || time.Since(start) > 10*time.Second
	})
	mu.Lock()
	got := slices.Clone(failures)
	mu.Unlock()
	if len(got) == 0 {
		t.Fatal("no SessionFailed event within 10 s of Lead's start with etcd unreachable")
	}
	t.Logf("first SessionFailed %v after Lead's start: %v", got[0].Time.Sub(start).Round(time.Millisecond), got[0].Err)
	if e := got[0]; e.Lock != name || e.Primitive != etcdlock.KindMutex || e.Err == nil {
		t.Errorf("SessionFailed event %+v: want Lock %q, Primitive mutex, an Err", e, name)
	}
	// The observers hear it in turn: the logger, after ours, a moment later.
	eventually(t, "the logger's line", func() bool { return strings.Contains(logged.String(), "no session; retrying") })

	proxy.Unblackhole()
	select {
	case <-led:
	case <-time.After(testTimeout):
		t.Fatal("Lead did not lead once etcd was back")
	}
	cancel()
	if err := waitErr(t, done); !errors.Is(err, context.Canceled) {
		t.Errorf("Lead = %v, want context.Canceled", err)
	}
}
