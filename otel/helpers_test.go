package etcdlockotel_test

// Helpers of the package's tests: an etcd, Sessions observed by an
// Observer whose spans and metrics are kept in memory, and waiting.

import (
	"context"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	etcdlockotel "github.com/etcdlock/etcdlock/otel"
)

// testTimeout bounds every wait of a test: generous, since CI machines are
// shared and run with -race.
const testTimeout = 30 * time.Second

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// lockName returns a lock name of the test's own.
func lockName(t *testing.T) string {
	return "test/" + strings.ReplaceAll(t.Name(), "/", "_")
}

// recorded is an Observer whose spans and metrics stay in memory.
type recorded struct {
	o      *etcdlockotel.Observer
	tp     *sdktrace.TracerProvider
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
}

func newRecorded(t *testing.T, opts ...etcdlockotel.Option) *recorded {
	r := &recorded{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	r.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(r.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	t.Cleanup(func() {
		_ = r.tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	r.o = etcdlockotel.New(append([]etcdlockotel.Option{etcdlockotel.WithTracerProvider(r.tp), etcdlockotel.WithMeterProvider(mp)}, opts...)...)
	if err := r.o.Err(); err != nil {
		t.Fatal(err)
	}
	return r
}

// ended returns the spans ended so far called name.
func (r *recorded) ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range r.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// wait waits until the ended spans called name are n at least, and
// returns them.
func (r *recorded) wait(t *testing.T, name string, n int) []sdktrace.ReadOnlySpan {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for {
		if got := r.ended(name); len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %d spans %q: got %d", n, name, len(r.ended(name)))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// attr returns the value of the attribute key of s.
func attr(s sdktrace.ReadOnlySpan, key string) attribute.Value {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// metrics collects the metrics, by name.
func (r *recorded) metrics(t *testing.T) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

// newSession returns a Session of client observed by o, closed by
// t.Cleanup.
func newSession(t *testing.T, client *clientv3.Client, o etcdlock.Observer, opts ...etcdlock.SessionOption) *etcdlock.Session {
	t.Helper()
	s, err := etcdlock.NewSession(client, append(opts, etcdlock.WithObserver(o))...)
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// startServer returns an etcd and a client of it, closed by t.Cleanup.
func startServer(t *testing.T) (*etcdtest.Server, *clientv3.Client) {
	srv := etcdtest.Start(t)
	return srv, srv.Client(t)
}
