package etcdlockotel_test

import (
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/etcdlock/etcdlock"
	etcdlockotel "github.com/etcdlock/etcdlock/otel"
)

// sum returns the value of the data point of a sum with the attributes
// kv, and whether there is one.
func sum(a metricdata.Aggregation, kv ...attribute.KeyValue) (int64, bool) {
	s, ok := a.(metricdata.Sum[int64])
	if !ok {
		return 0, false
	}
	want := attribute.NewSet(kv...)
	for _, dp := range s.DataPoints {
		if dp.Attributes.Equals(&want) {
			return dp.Value, true
		}
	}
	return 0, false
}

// histCount returns the count of the histogram's data point with the
// attributes kv.
func histCount(a metricdata.Aggregation, kv ...attribute.KeyValue) uint64 {
	h, ok := a.(metricdata.Histogram[float64])
	if !ok {
		return 0
	}
	want := attribute.NewSet(kv...)
	for _, dp := range h.DataPoints {
		if dp.Attributes.Equals(&want) {
			return dp.Count
		}
	}
	return 0
}

// TestMetrics: after a known sequence (two lock–unlock pairs, a busy try,
// a hold lost to a delete by hand), the metrics say so: the counts of
// acquisitions by outcome, holds 0, one loss, the releases, and the
// histograms' counts. With WithLockAttribute, the lock's name is an
// attribute.
func TestMetrics(t *testing.T) {
	_, client := startServer(t)
	r := newRecorded(t, etcdlockotel.WithLockAttribute())
	ctx := testContext(t)
	name := lockName(t)
	s := newSession(t, client, r.o)
	other := newSession(t, client, r.o)
	m := etcdlock.NewMutex(s, name)
	for range 2 {
		if err := m.LockContext(ctx); err != nil {
			t.Fatal(err)
		}
		if err := m.UnlockContext(ctx); err != nil {
			t.Fatal(err)
		}
	}
	held := etcdlock.NewMutex(other, name)
	if err := held.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := m.TryLockFor(ctx, 0); ok || err != nil {
		t.Fatalf("TryLockFor on a held lock: got %v, %v", ok, err)
	}
	done := held.Done()
	if _, err := client.Delete(ctx, held.Key()); err != nil {
		t.Fatal(err)
	}
	<-done
	_ = held.UnlockContext(ctx)

	kind, lock := attribute.String("etcdlock.lock.kind", "mutex"), attribute.String("etcdlock.lock.name", name)
	outcome := func(o string) attribute.KeyValue { return attribute.String("etcdlock.outcome", o) }
	contended := func(c bool) attribute.KeyValue { return attribute.Bool("etcdlock.contended", c) }
	var got map[string]metricdata.Aggregation
	// Each Session delivers its events in order: its last ones are the
	// busy try's end (s) and the lost hold's release (other).
	settled := func() bool {
		got = r.metrics(t)
		busy, _ := sum(got["etcdlock.acquisitions"], kind, lock, outcome("busy"), contended(true))
		missed, _ := sum(got["etcdlock.releases"], kind, lock, attribute.String("etcdlock.release.result", "fenced_miss"))
		return busy == 1 && missed == 1
	}
	for deadline := time.Now().Add(testTimeout); !settled(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for the last events in the metrics: %v", got)
		}
	}
	checks := []struct {
		what string
		name string
		kv   []attribute.KeyValue
		want int64
	}{
		{"acquired", "etcdlock.acquisitions", []attribute.KeyValue{kind, lock, outcome("acquired"), contended(false)}, 3},
		{"busy", "etcdlock.acquisitions", []attribute.KeyValue{kind, lock, outcome("busy"), contended(true)}, 1},
		{"active", "etcdlock.acquisitions.active", []attribute.KeyValue{kind, lock}, 0},
		{"holds", "etcdlock.holds", []attribute.KeyValue{kind, lock}, 0},
		{"released", "etcdlock.releases", []attribute.KeyValue{kind, lock, attribute.String("etcdlock.release.result", "ok")}, 2},
		{"lost", "etcdlock.losses", []attribute.KeyValue{kind, lock, attribute.String("etcdlock.loss.reason", "key_deleted")}, 1},
	}
	for _, c := range checks {
		if n, ok := sum(got[c.name], c.kv...); !ok || n != c.want {
			t.Errorf("%s: %s%v = %d (found %v), want %d", c.what, c.name, c.kv, n, ok, c.want)
		}
	}
	if n := histCount(got["etcdlock.hold.duration"], kind, lock); n != 3 {
		t.Errorf("etcdlock.hold.duration count: got %d, want 3 (every hold's end, the lost one's unlock too)", n)
	}
	if n := histCount(got["etcdlock.acquire.duration"], kind, lock, outcome("acquired")); n != 3 {
		t.Errorf("etcdlock.acquire.duration{acquired} count: got %d, want 3", n)
	}
}

// TestNewBadInput: a nil Option or provider makes an Observer that
// observes nothing, and says why; none panics.
func TestNewBadInput(t *testing.T) {
	for _, c := range []struct {
		what string
		opts []etcdlockotel.Option
	}{
		{"nil Option", []etcdlockotel.Option{nil}},
		{"nil tracer provider", []etcdlockotel.Option{etcdlockotel.WithTracerProvider(nil)}},
		{"nil meter provider", []etcdlockotel.Option{etcdlockotel.WithMeterProvider(nil)}},
	} {
		o := etcdlockotel.New(c.opts...)
		if o.Err() == nil {
			t.Errorf("%s: Err got nil, want an error", c.what)
		}
		o.Observe(etcdlock.Event{Kind: etcdlock.AcquireEnded, Outcome: etcdlock.OutcomeAcquired})
	}
	if err := etcdlockotel.New().Err(); err != nil {
		t.Errorf("no option: got %v, want nil (an Observer that makes nothing)", err)
	}
}
