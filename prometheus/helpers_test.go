package etcdlockprom_test

// Helpers of the package's tests: servers, Sessions, registries, reads of
// gathered metrics, and waiting.

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	etcdlockprom "github.com/etcdlock/etcdlock/prometheus"
)

// testTimeout bounds every wait of a test: generous, since CI machines are
// shared and run with -race.
const testTimeout = 30 * time.Second

// testContext returns a context that ends after testTimeout or with the test.
func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// lockName returns a lock name of the test's own.
func lockName(t *testing.T, name string) string {
	return "test/" + strings.ReplaceAll(t.Name(), "/", "_") + "/" + name
}

// newSession returns a Session of client, closed by t.Cleanup.
func newSession(t *testing.T, client *clientv3.Client, opts ...etcdlock.SessionOption) *etcdlock.Session {
	t.Helper()
	s, err := etcdlock.NewSession(client, opts...)
	if err != nil {
		t.Fatalf("NewSession: got %v, want nil", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// closeSession closes s, which delivers the events still queued: the
// metrics are final when it returns.
func closeSession(t *testing.T, s *etcdlock.Session) {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatalf("Close: got %v, want nil", err)
	}
}

// newCollector returns a Collector registered in a registry of its own,
// which checks every scrape against the Collector's descriptions.
func newCollector(t *testing.T, opts ...etcdlockprom.Option) (*etcdlockprom.Collector, *prometheus.Registry) {
	t.Helper()
	c := etcdlockprom.New(opts...)
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatalf("Register: got %v, want nil", err)
	}
	return c, reg
}

// metric returns the series of the metric name whose labels are exactly
// labels (name, value pairs), or nil if there is none.
func metric(t *testing.T, reg prometheus.Gatherer, name string, labels ...string) *dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: got %v, want nil", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if hasLabels(m, labels) {
				return m
			}
		}
	}
	return nil
}

func hasLabels(m *dto.Metric, labels []string) bool {
	if len(m.GetLabel()) != len(labels)/2 {
		return false
	}
	for _, lp := range m.GetLabel() {
		found := false
		for i := 0; i+1 < len(labels); i += 2 {
			if labels[i] == lp.GetName() && labels[i+1] == lp.GetValue() {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// value returns the value of a counter or gauge series; 0 when the series
// does not exist yet.
func value(t *testing.T, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	m := metric(t, reg, name, labels...)
	switch {
	case m == nil:
		return 0
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	}
	t.Fatalf("%s%v: neither a counter nor a gauge", name, labels)
	return 0
}

// histogram returns the count and sum of a histogram series; zeros when the
// series does not exist yet.
func histogram(t *testing.T, reg prometheus.Gatherer, name string, labels ...string) (count uint64, sum float64) {
	t.Helper()
	m := metric(t, reg, name, labels...)
	if m == nil {
		return 0, 0
	}
	if m.GetHistogram() == nil {
		t.Fatalf("%s%v: not a histogram", name, labels)
	}
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

// waitFor polls cond until it holds, and fails the test if it does not
// within testTimeout. Events reach the Collector shortly after they happen:
// tests wait for the metric rather than assume.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s: never", testTimeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitClosed waits until ch is closed, and fails the test if ctx ends
// first.
func waitClosed(t *testing.T, ctx context.Context, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-ctx.Done():
		t.Fatalf("%s: never closed", what)
	}
}

// waitValue waits until the counter or gauge series is want.
func waitValue(t *testing.T, reg prometheus.Gatherer, want float64, name string, labels ...string) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for {
		got := value(t, reg, name, labels...)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s%v: got %v, want %v", testTimeout, name, labels, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// worker runs f in a goroutine of its own, which the test waits for.
func worker(t *testing.T, f func()) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	t.Cleanup(func() { <-done })
	return done
}

// A holder is a goroutine that takes a lock and holds it until released:
// locks are held per goroutine.
type holder struct {
	held    chan struct{} // closed once the lock is held
	release chan struct{}
	done    <-chan struct{}
}

// startHolder calls lock in a goroutine of its own, then unlock once the
// holder is released or ctx ends.
func startHolder(t *testing.T, ctx context.Context, lock, unlock func(context.Context) error) *holder {
	h := &holder{held: make(chan struct{}), release: make(chan struct{})}
	h.done = worker(t, func() {
		if err := lock(ctx); err != nil {
			t.Errorf("holder's lock: got %v, want nil", err)
			return
		}
		close(h.held)
		select {
		case <-h.release:
		case <-ctx.Done():
		}
		if err := unlock(ctx); err != nil {
			t.Errorf("holder's unlock: got %v, want nil", err)
		}
	})
	return h
}

// holdMutex starts a holder of the Mutex name of s.
func holdMutex(t *testing.T, ctx context.Context, s *etcdlock.Session, name string) *holder {
	m := etcdlock.NewMutex(s, name)
	return startHolder(t, ctx, m.LockContext, m.UnlockContext)
}

// waitHeld waits until the holder holds its lock; it fails the test if the
// holder ends first.
func (h *holder) waitHeld(t *testing.T) {
	t.Helper()
	select {
	case <-h.held:
	case <-h.done:
		t.FailNow()
	}
}

// stop releases the lock and waits for the holder to end.
func (h *holder) stop() {
	close(h.release)
	<-h.done
}
