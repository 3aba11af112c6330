package etcdlockprom_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/etcdlock/etcdlock"
	etcdlockprom "github.com/etcdlock/etcdlock/prometheus"
)

// TestNewBadInput checks that invalid options make registration fail with
// a clear error, and that New and Observe never panic.
func TestNewBadInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  etcdlockprom.Option
		want string
	}{
		{"nil option", nil, "nil Option"},
		{"no wait buckets", etcdlockprom.WithWaitBuckets(), "WithWaitBuckets: no bucket bounds"},
		{"hold buckets not increasing", etcdlockprom.WithHoldBuckets(1, 1), "WithHoldBuckets: bounds must increase"},
		{"NaN RTT bucket", etcdlockprom.WithRTTBuckets(1, math.NaN()), "WithRTTBuckets: bound 1 is NaN"},
		{"namespace with a digit first", etcdlockprom.WithNamespace("1x"), `WithNamespace: "1x"`},
		{"namespace with a dot", etcdlockprom.WithNamespace("a.b"), `WithNamespace: "a.b"`},
		{"le label", etcdlockprom.WithConstLabels(prometheus.Labels{"le": "1"}), `"le" is reserved`},
		{"label of ours", etcdlockprom.WithConstLabels(prometheus.Labels{"primitive": "x"}), "duplicate label names"},
		{"reserved label", etcdlockprom.WithConstLabels(prometheus.Labels{"__x": "x"}), "is not a valid label name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := etcdlockprom.New(tc.opt)
			err := prometheus.NewRegistry().Register(c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Register: got %v, want an error containing %q", err, tc.want)
			}
			c.Observe(etcdlock.Event{Kind: etcdlock.AcquireEnded, Primitive: etcdlock.KindMutex, Outcome: etcdlock.OutcomeAcquired, Wait: time.Millisecond})
		})
	}
}

// TestOptions checks the options' values where they show: buckets, and
// that a caller's later change to its labels does not reach the Collector.
func TestOptions(t *testing.T) {
	labels := prometheus.Labels{"job": "a"}
	c := etcdlockprom.New(
		etcdlockprom.WithWaitBuckets(1, 2, math.Inf(1)),
		etcdlockprom.WithConstLabels(labels),
	)
	labels["job"] = "b"
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatalf("Register: got %v, want nil", err)
	}
	c.Observe(etcdlock.Event{Kind: etcdlock.AcquireEnded, Primitive: etcdlock.KindMutex, Outcome: etcdlock.OutcomeAcquired, Wait: 1500 * time.Millisecond})
	m := metric(t, reg, "etcdlock_acquire_wait_seconds", "job", "a", "primitive", "mutex", "outcome", "acquired")
	if m == nil {
		t.Fatal(`etcdlock_acquire_wait_seconds{job="a"}: no such series`)
	}
	var bounds []float64
	var counts []uint64
	for _, b := range m.GetHistogram().GetBucket() {
		bounds = append(bounds, b.GetUpperBound())
		counts = append(counts, b.GetCumulativeCount())
	}
	if len(bounds) != 2 || bounds[0] != 1 || bounds[1] != 2 || counts[0] != 0 || counts[1] != 1 {
		t.Errorf("buckets: got bounds %v, counts %v; want [1 2], [0 1]", bounds, counts)
	}
}
