package etcdlockprom_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/testflags"
	etcdlockprom "github.com/etcdlock/etcdlock/prometheus"
)

// TestCollector runs acquisitions of every outcome, holds of every
// primitive, a loss and the release of the lost hold against a real etcd,
// then scrapes the registry: every count exactly, every duration above 0.
func TestCollector(t *testing.T) {
	testflags.Parallel(t)
	srv := etcdtest.Start(t)
	client := srv.Client(t)
	ctx := testContext(t)
	c, reg := newCollector(t)
	const ttl = 6 * time.Second
	s := newSession(t, client, etcdlock.WithTTL(ttl), etcdlock.WithObserver(c))
	other := newSession(t, srv.Client(t)) // not observed: the other holder

	// Uncontended.
	m := etcdlock.NewMutex(s, lockName(t, "uncontended"))
	lock(t, ctx, m)
	waitValue(t, reg, 1, "etcdlock_holds", "primitive", "mutex")
	unlock(t, ctx, m)
	waitValue(t, reg, 0, "etcdlock_holds", "primitive", "mutex")

	// Contended: ours waits, with its key in etcd, for the other holder.
	name := lockName(t, "contended")
	theirs := etcdlock.NewMutex(other, name)
	lock(t, ctx, theirs)
	ours := holdMutex(t, ctx, s, name)
	waitKeys(t, ctx, client, name, 2)
	waitValue(t, reg, 1, "etcdlock_acquisitions_in_progress", "primitive", "mutex")
	unlock(t, ctx, theirs)
	ours.waitHeld(t)
	waitValue(t, reg, 1, "etcdlock_holds", "primitive", "mutex")
	waitValue(t, reg, 0, "etcdlock_acquisitions_in_progress", "primitive", "mutex")
	ours.stop()

	// Busy and timed out, against the other holder.
	name = lockName(t, "held")
	theirs = etcdlock.NewMutex(other, name)
	lock(t, ctx, theirs)
	m = etcdlock.NewMutex(s, name)
	if ok, err := m.TryLockFor(ctx, 0); ok || err != nil {
		t.Fatalf("TryLockFor(0) of a held lock: got %v, %v; want false, nil", ok, err)
	}
	const wait = 500 * time.Millisecond
	if ok, err := m.TryLockFor(ctx, wait); ok || err != nil {
		t.Fatalf("TryLockFor(%v) of a held lock: got %v, %v; want false, nil", wait, ok, err)
	}
	unlock(t, ctx, theirs)

	// Cancelled, waiting for a goroutine of this process.
	name = lockName(t, "local")
	local := holdMutex(t, ctx, s, name)
	local.waitHeld(t)
	cctx, cancel := context.WithCancel(ctx)
	waiting := worker(t, func() {
		if err := etcdlock.NewMutex(s, name).LockContext(cctx); !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled LockContext: got %v, want context.Canceled", err)
		}
	})
	waitValue(t, reg, 1, "etcdlock_acquisitions_in_progress", "primitive", "mutex")
	cancel()
	<-waiting
	local.stop()

	// Lost: the key is deleted while the hold's Done is watched.
	m = etcdlock.NewMutex(s, lockName(t, "lost"))
	lock(t, ctx, m)
	lost := m.Done()
	waitValue(t, reg, 1, "etcdlock_holds", "primitive", "mutex")
	if _, err := client.Delete(ctx, m.Key()); err != nil {
		t.Fatalf("Delete: got %v, want nil", err)
	}
	waitClosed(t, ctx, lost, "Done, after the key was deleted")
	waitValue(t, reg, 1, "etcdlock_losses_total", "primitive", "mutex", "reason", "key_deleted")
	// Known lost, the hold no longer counts, though not released yet.
	waitValue(t, reg, 0, "etcdlock_holds", "primitive", "mutex")
	if err := m.UnlockContext(ctx); !errors.Is(err, etcdlock.ErrLockLost) {
		t.Fatalf("UnlockContext of a lost hold: got %v, want ErrLockLost", err)
	}

	// Two readers of one RWMutex are two holds; then a writer.
	rw := etcdlock.NewRWMutex(s, lockName(t, "rw"))
	readers := []*holder{
		startHolder(t, ctx, rw.RLockContext, rw.RUnlockContext),
		startHolder(t, ctx, rw.RLockContext, rw.RUnlockContext),
	}
	waitValue(t, reg, 2, "etcdlock_holds", "primitive", "read")
	for _, r := range readers {
		r.stop()
	}
	waitValue(t, reg, 0, "etcdlock_holds", "primitive", "read")
	if err := rw.LockContext(ctx); err != nil {
		t.Fatalf("RWMutex.LockContext: got %v, want nil", err)
	}
	waitValue(t, reg, 1, "etcdlock_holds", "primitive", "write")
	if err := rw.UnlockContext(ctx); err != nil {
		t.Fatalf("RWMutex.UnlockContext: got %v, want nil", err)
	}

	// A permit.
	p, err := etcdlock.NewSemaphore(s, lockName(t, "sem"), 2).Acquire(ctx)
	if err != nil {
		t.Fatalf("Acquire: got %v, want nil", err)
	}
	waitValue(t, reg, 1, "etcdlock_holds", "primitive", "semaphore")
	if err := p.Release(ctx); err != nil {
		t.Fatalf("Release: got %v, want nil", err)
	}

	// A keep-alive round trip, every TTL/3.
	waitFor(t, "a keep-alive round trip", func() bool {
		n, _ := histogram(t, reg, "etcdlock_keepalive_rtt_seconds")
		return n > 0
	})
	closeSession(t, s)

	const want = `
# HELP etcdlock_acquisitions_total Lock calls that went to etcd or waited for a local holder, by outcome, and whether they found the lock held by another holder.
# TYPE etcdlock_acquisitions_total counter
etcdlock_acquisitions_total{contended="false",outcome="acquired",primitive="mutex"} 3
etcdlock_acquisitions_total{contended="true",outcome="acquired",primitive="mutex"} 1
etcdlock_acquisitions_total{contended="true",outcome="busy",primitive="mutex"} 1
etcdlock_acquisitions_total{contended="true",outcome="timed_out",primitive="mutex"} 1
etcdlock_acquisitions_total{contended="true",outcome="canceled",primitive="mutex"} 1
etcdlock_acquisitions_total{contended="false",outcome="acquired",primitive="read"} 2
etcdlock_acquisitions_total{contended="false",outcome="acquired",primitive="write"} 1
etcdlock_acquisitions_total{contended="false",outcome="acquired",primitive="semaphore"} 1
# HELP etcdlock_acquisitions_in_progress Lock calls of this process that have started and not ended: waiting, or talking to etcd.
# TYPE etcdlock_acquisitions_in_progress gauge
etcdlock_acquisitions_in_progress{primitive="mutex"} 0
etcdlock_acquisitions_in_progress{primitive="read"} 0
etcdlock_acquisitions_in_progress{primitive="write"} 0
etcdlock_acquisitions_in_progress{primitive="semaphore"} 0
# HELP etcdlock_holds Holds of this process, neither released nor known lost: one per etcd key held (two readers of one RWMutex are two).
# TYPE etcdlock_holds gauge
etcdlock_holds{primitive="mutex"} 0
etcdlock_holds{primitive="read"} 0
etcdlock_holds{primitive="write"} 0
etcdlock_holds{primitive="semaphore"} 0
# HELP etcdlock_losses_total Holds lost before their release, by reason; counted only for holds whose Done channel was asked for.
# TYPE etcdlock_losses_total counter
etcdlock_losses_total{primitive="mutex",reason="key_deleted"} 1
# HELP etcdlock_releases_total Releases of a held key, by result: ok, fenced_miss (the key was already gone) or error (retried in the background).
# TYPE etcdlock_releases_total counter
etcdlock_releases_total{primitive="mutex",result="ok"} 3
etcdlock_releases_total{primitive="mutex",result="fenced_miss"} 1
etcdlock_releases_total{primitive="read",result="ok"} 2
etcdlock_releases_total{primitive="write",result="ok"} 1
etcdlock_releases_total{primitive="semaphore",result="ok"} 1
# HELP etcdlock_keepalive_failures_total Lease renewals that failed.
# TYPE etcdlock_keepalive_failures_total counter
etcdlock_keepalive_failures_total 0
# HELP etcdlock_events_dropped_total Events that Sessions dropped because their observers were too slow: the gauges may be off.
# TYPE etcdlock_events_dropped_total counter
etcdlock_events_dropped_total 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"etcdlock_acquisitions_total", "etcdlock_acquisitions_in_progress", "etcdlock_holds",
		"etcdlock_losses_total", "etcdlock_releases_total",
		"etcdlock_keepalive_failures_total", "etcdlock_events_dropped_total"); err != nil {
		t.Error(err)
	}

	// Histograms: one observation per acquisition and per hold, each above 0.
	for _, h := range []struct {
		name   string
		count  uint64
		labels []string
	}{
		{"etcdlock_acquire_wait_seconds", 4, []string{"primitive", "mutex", "outcome", "acquired"}},
		{"etcdlock_acquire_wait_seconds", 1, []string{"primitive", "mutex", "outcome", "busy"}},
		{"etcdlock_acquire_wait_seconds", 1, []string{"primitive", "mutex", "outcome", "timed_out"}},
		{"etcdlock_acquire_wait_seconds", 1, []string{"primitive", "mutex", "outcome", "canceled"}},
		{"etcdlock_acquire_wait_seconds", 2, []string{"primitive", "read", "outcome", "acquired"}},
		{"etcdlock_acquire_wait_seconds", 1, []string{"primitive", "write", "outcome", "acquired"}},
		{"etcdlock_acquire_wait_seconds", 1, []string{"primitive", "semaphore", "outcome", "acquired"}},
		{"etcdlock_hold_duration_seconds", 4, []string{"primitive", "mutex"}},
		{"etcdlock_hold_duration_seconds", 2, []string{"primitive", "read"}},
		{"etcdlock_hold_duration_seconds", 1, []string{"primitive", "write"}},
		{"etcdlock_hold_duration_seconds", 1, []string{"primitive", "semaphore"}},
	} {
		count, sum := histogram(t, reg, h.name, h.labels...)
		if count != h.count || sum <= 0 {
			t.Errorf("%s%v: got count %d, sum %v; want count %d, sum > 0", h.name, h.labels, count, sum, h.count)
		}
	}
	if _, sum := histogram(t, reg, "etcdlock_acquire_wait_seconds", "primitive", "mutex", "outcome", "timed_out"); sum < wait.Seconds() {
		t.Errorf("wait of TryLockFor(%v): got %vs, want at least %vs", wait, sum, wait.Seconds())
	}
	if n, sum := histogram(t, reg, "etcdlock_keepalive_rtt_seconds"); n == 0 || sum <= 0 {
		t.Errorf("etcdlock_keepalive_rtt_seconds: got count %d, sum %v; want count > 0, sum > 0", n, sum)
	}
	if got := value(t, reg, "etcdlock_lease_ttl_seconds"); got != ttl.Seconds() {
		t.Errorf("etcdlock_lease_ttl_seconds: got %v, want %v", got, ttl.Seconds())
	}
	if margin := value(t, reg, "etcdlock_keepalive_margin_seconds"); margin <= 0 || margin > ttl.Seconds() {
		t.Errorf("etcdlock_keepalive_margin_seconds: got %v, want in (0, %v]", margin, ttl.Seconds())
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatalf("GatherAndLint: got %v, want nil", err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// lock takes m, failing the test if it cannot.
func lock(t *testing.T, ctx context.Context, m *etcdlock.Mutex) {
	t.Helper()
	if err := m.LockContext(ctx); err != nil {
		t.Fatalf("LockContext(%s): got %v, want nil", m.Name(), err)
	}
}

// unlock releases m, failing the test if it cannot.
func unlock(t *testing.T, ctx context.Context, m *etcdlock.Mutex) {
	t.Helper()
	if err := m.UnlockContext(ctx); err != nil {
		t.Fatalf("UnlockContext(%s): got %v, want nil", m.Name(), err)
	}
}

// waitKeys waits until the Mutex name has n keys in etcd, holders and
// waiters.
func waitKeys(t *testing.T, ctx context.Context, client *clientv3.Client, name string, n int64) {
	t.Helper()
	waitFor(t, "the lock's keys", func() bool {
		resp, err := client.Get(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count == n
	})
}

var _ prometheus.Collector = (*etcdlockprom.Collector)(nil)
var _ etcdlock.Observer = (*etcdlockprom.Collector)(nil)

// TestLockLabel checks the options that name the series: WithLockLabel,
// WithNamespace and WithConstLabels.
func TestLockLabel(t *testing.T) {
	client := etcdtest.Start(t).Client(t)
	ctx := testContext(t)
	c, reg := newCollector(t, etcdlockprom.WithLockLabel(), etcdlockprom.WithNamespace("app"),
		etcdlockprom.WithConstLabels(prometheus.Labels{"session": "a"}))
	s := newSession(t, client, etcdlock.WithObserver(c))
	x, y := lockName(t, "x"), lockName(t, "y")
	for _, name := range []string{x, y, x} {
		m := etcdlock.NewMutex(s, name)
		lock(t, ctx, m)
		waitValue(t, reg, 1, "app_holds", "primitive", "mutex", "lock", name, "session", "a")
		unlock(t, ctx, m)
	}
	closeSession(t, s)

	want := strings.NewReplacer("LOCK_X", x, "LOCK_Y", y).Replace(`
# HELP app_acquisitions_total Lock calls that went to etcd or waited for a local holder, by outcome, and whether they found the lock held by another holder.
# TYPE app_acquisitions_total counter
app_acquisitions_total{contended="false",lock="LOCK_X",outcome="acquired",primitive="mutex",session="a"} 2
app_acquisitions_total{contended="false",lock="LOCK_Y",outcome="acquired",primitive="mutex",session="a"} 1
# HELP app_holds Holds of this process, neither released nor known lost: one per etcd key held (two readers of one RWMutex are two).
# TYPE app_holds gauge
app_holds{lock="LOCK_X",primitive="mutex",session="a"} 0
app_holds{lock="LOCK_Y",primitive="mutex",session="a"} 0
# HELP app_releases_total Releases of a held key, by result: ok, fenced_miss (the key was already gone) or error (retried in the background).
# TYPE app_releases_total counter
app_releases_total{lock="LOCK_X",primitive="mutex",result="ok",session="a"} 2
app_releases_total{lock="LOCK_Y",primitive="mutex",result="ok",session="a"} 1
`)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"app_acquisitions_total", "app_holds", "app_releases_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(c, "app_hold_duration_seconds"); n != 2 {
		t.Errorf("app_hold_duration_seconds: got %d series, want 2 (one per lock)", n)
	}
	if n := testutil.CollectAndCount(c, "app_keepalive_margin_seconds"); n != 1 {
		t.Errorf("app_keepalive_margin_seconds: got %d series, want 1 (no lock label)", n)
	}
}

// TestLocalHandoff checks that a hold handed from one goroutine to the
// next (WithLocalHandoff), which keeps its key and reports a second
// acquisition but one release, counts once in etcdlock_holds.
func TestLocalHandoff(t *testing.T) {
	client := etcdtest.Start(t).Client(t)
	ctx := testContext(t)
	c, reg := newCollector(t)
	s := newSession(t, client, etcdlock.WithLocalHandoff(1), etcdlock.WithObserver(c))
	name := lockName(t, "handoff")

	first := holdMutex(t, ctx, s, name)
	first.waitHeld(t)
	second := holdMutex(t, ctx, s, name)
	waitValue(t, reg, 1, "etcdlock_acquisitions_in_progress", "primitive", "mutex")
	first.stop()
	second.waitHeld(t)
	waitValue(t, reg, 1, "etcdlock_acquisitions_total", "primitive", "mutex", "outcome", "acquired", "contended", "true")
	if got := value(t, reg, "etcdlock_holds", "primitive", "mutex"); got != 1 {
		t.Errorf("etcdlock_holds after the hand-off: got %v, want 1", got)
	}
	second.stop()
	closeSession(t, s)

	if got := value(t, reg, "etcdlock_holds", "primitive", "mutex"); got != 0 {
		t.Errorf("etcdlock_holds after both unlocks: got %v, want 0", got)
	}
	if got := value(t, reg, "etcdlock_releases_total", "primitive", "mutex", "result", "ok"); got != 1 {
		t.Errorf("etcdlock_releases_total: got %v, want 1 (the key is deleted once)", got)
	}
	if n, _ := histogram(t, reg, "etcdlock_hold_duration_seconds", "primitive", "mutex"); n != 2 {
		t.Errorf("etcdlock_hold_duration_seconds: got count %d, want 2 (a hand-off ends the first goroutine's hold)", n)
	}
}

// TestEventsDropped blocks the Session's observers while the lock path
// makes more events than the Session queues: every event is either
// delivered or counted in etcdlock_events_dropped_total.
func TestEventsDropped(t *testing.T) {
	client := etcdtest.Start(t).Client(t)
	ctx := testContext(t)
	c, reg := newCollector(t)
	gate := make(chan struct{})
	var open sync.Once
	unblock := func() { open.Do(func() { close(gate) }) }
	t.Cleanup(unblock)
	var delivered, reported atomic.Int64
	// The default TTL: no keep-alive probe (every 20 s) during the test.
	s := newSession(t, client,
		etcdlock.WithObserver(etcdlock.ObserverFunc(func(etcdlock.Event) { <-gate })),
		etcdlock.WithObserver(c),
		etcdlock.WithObserver(etcdlock.ObserverFunc(func(e etcdlock.Event) {
			switch e.Kind {
			case etcdlock.EventsDropped:
				reported.Add(int64(e.Dropped))
			case etcdlock.KeptAlive:
			default:
				delivered.Add(1)
			}
		})))
	name := lockName(t, "busy")

	// A goroutine of this process holds the lock: each try is busy at
	// once, without a request to etcd, and makes two events.
	local := holdMutex(t, ctx, s, name)
	local.waitHeld(t)
	const tries = 1500
	m := etcdlock.NewMutex(s, name)
	for range tries {
		if ok, err := m.TryLockFor(ctx, 0); ok || err != nil {
			t.Fatalf("TryLockFor(0) of a held lock: got %v, %v; want false, nil", ok, err)
		}
	}
	unblock()
	// Once the queue has room, the holder's release is queued, not dropped,
	// and reports the drops before it.
	waitFor(t, "the queue drains", func() bool { return delivered.Load() >= 1024 })
	local.stop()
	closeSession(t, s)

	dropped := value(t, reg, "etcdlock_events_dropped_total")
	t.Logf("%d events delivered, %v dropped", delivered.Load(), dropped)
	const emitted = 2*tries + 5 // the tries; the holder's start, end, release and hold end; the Session's close
	switch {
	case dropped <= 0:
		t.Errorf("etcdlock_events_dropped_total: got %v, want > 0", dropped)
	case int64(dropped) != reported.Load():
		t.Errorf("etcdlock_events_dropped_total: got %v, want %d, the sum of EventsDropped", dropped, reported.Load())
	case delivered.Load()+int64(dropped) != emitted:
		t.Errorf("events delivered + dropped: got %d + %v, want %d", delivered.Load(), dropped, emitted)
	}
	if got := value(t, reg, "etcdlock_holds", "primitive", "mutex"); got != 0 {
		t.Errorf("etcdlock_holds: got %v, want 0", got)
	}
}

// TestKeepAliveSilent cuts the client off from etcd while a lock is held:
// renewals fail, the margin shrinks, and the hold is lost for silence.
func TestKeepAliveSilent(t *testing.T) {
	testflags.Parallel(t)
	srv := etcdtest.Start(t)
	client, proxy := srv.ProxiedClient(t)
	ctx := testContext(t)
	c, reg := newCollector(t)
	const ttl = 6 * time.Second
	s := newSession(t, client, etcdlock.WithTTL(ttl), etcdlock.WithObserver(c))
	m := etcdlock.NewMutex(s, lockName(t, "silent"))
	lock(t, ctx, m)
	lost := m.Done()

	proxy.Blackhole()
	t.Cleanup(proxy.Unblackhole)
	waitClosed(t, ctx, lost, "Done, while etcd was cut off")
	waitValue(t, reg, 1, "etcdlock_losses_total", "primitive", "mutex", "reason", "keepalive_silent")
	waitValue(t, reg, 0, "etcdlock_holds", "primitive", "mutex")
	// Each renewal waits 2/3 of the TTL; the first to fail was sent within
	// TTL/4 of the last acknowledged one, and fails before the term ends.
	waitFor(t, "a failed renewal", func() bool { return value(t, reg, "etcdlock_keepalive_failures_total") >= 1 })
	// A renewal that failed after waiting 2/3 of the TTL left at most 1/3 of it.
	if margin := value(t, reg, "etcdlock_keepalive_margin_seconds"); margin > (ttl / 3).Seconds() {
		t.Errorf("etcdlock_keepalive_margin_seconds after a failed renewal: got %v, want at most %v", margin, (ttl / 3).Seconds())
	}
	proxy.Unblackhole()
}

// TestSessionClosed closes a Session while it holds two locks: the hold
// whose Done is watched is reported lost; both leave etcdlock_holds, at the
// Session's close at the latest.
func TestSessionClosed(t *testing.T) {
	client := etcdtest.Start(t).Client(t)
	ctx := testContext(t)
	c, reg := newCollector(t)
	s := newSession(t, client, etcdlock.WithObserver(c))
	watched := etcdlock.NewMutex(s, lockName(t, "watched"))
	lock(t, ctx, watched)
	lost := watched.Done()
	lock(t, ctx, etcdlock.NewMutex(s, lockName(t, "unwatched")))
	waitValue(t, reg, 2, "etcdlock_holds", "primitive", "mutex")
	closeSession(t, s)
	select {
	case <-lost:
	default:
		t.Error("Done still open after Close")
	}
	if got := value(t, reg, "etcdlock_losses_total", "primitive", "mutex", "reason", "session_closed"); got != 1 {
		t.Errorf("etcdlock_losses_total{reason=session_closed}: got %v, want 1", got)
	}
	if got := value(t, reg, "etcdlock_holds", "primitive", "mutex"); got != 0 {
		t.Errorf("etcdlock_holds after Close: got %v, want 0", got)
	}
}
