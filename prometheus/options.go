package etcdlockprom

import (
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
)

// An Option configures New.
type Option interface {
	apply(*options)
}

type options struct {
	namespace   string
	lockLabel   bool
	constLabels prometheus.Labels
	wait        []float64
	hold        []float64
	rtt         []float64
	err         error
}

type optionFunc func(*options)

func (f optionFunc) apply(o *options) { f(o) }

// Default histogram buckets, in seconds.
var (
	// An uncontended acquisition is one or two round trips to etcd; a
	// contended one lasts as long as the hold it waits for.
	defaultWaitBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}
	// Holds last from a critical section's milliseconds to a leader's day.
	defaultHoldBuckets = []float64{.001, .01, .1, .5, 1, 5, 10, 30, 60, 300, 900, 3600, 14400, 86400}
	// A renewal slower than a third of the TTL delays the next one.
	defaultRTTBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}
)

// WithLockLabel adds the lock's name as the label lock to every metric
// that has the label primitive. The default is no lock label: each lock
// name makes a series of its own in every such metric (for the histograms,
// one per bucket), and names made of IDs or dates would grow the series
// without bound. Use it where the process uses a few fixed names, as a
// leader-elected service does. A series stays, at 0 for the gauges, after
// its lock is no longer used.
func WithLockLabel() Option {
	return optionFunc(func(o *options) { o.lockLabel = true })
}

// WithNamespace sets the prefix of every metric name: ns_acquire_wait_seconds
// and so on. The default is "etcdlock"; "" leaves the names without prefix.
// Anything but letters, digits and underscores, or a digit first, makes
// registering the Collector fail: such names need quoting in PromQL.
func WithNamespace(ns string) Option {
	return optionFunc(func(o *options) {
		if !validNamespace(ns) {
			o.invalid(fmt.Errorf("etcdlockprom: WithNamespace: %q: want letters, digits and underscores, not a digit first", ns))
			return
		}
		o.namespace = ns
	})
}

func validNamespace(ns string) bool {
	for i, r := range ns {
		switch {
		case r == '_', 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z':
		case '0' <= r && r <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// WithConstLabels adds labels with fixed values to every metric, for
// example to tell apart two Collectors that observe different Sessions of
// one process (Collectors whose metrics differ only in constant label
// values may be registered together). The default is none.
func WithConstLabels(labels prometheus.Labels) Option {
	labels = maps.Clone(labels)
	return optionFunc(func(o *options) { o.constLabels = labels })
}

// WithWaitBuckets sets the upper bounds, in seconds, of the buckets of
// the acquire wait histogram. They must be in increasing order. The
// default is .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10,
// 30, 60 and 300.
func WithWaitBuckets(bounds ...float64) Option {
	return bucketsOption("WithWaitBuckets", bounds, func(o *options) *[]float64 { return &o.wait })
}

// WithHoldBuckets sets the upper bounds, in seconds, of the buckets of the
// hold duration histogram. They must be in increasing order. The default is
// .001, .01, .1, .5, 1, 5, 10, 30, 60, 300, 900, 3600, 14400 and 86400.
func WithHoldBuckets(bounds ...float64) Option {
	return bucketsOption("WithHoldBuckets", bounds, func(o *options) *[]float64 { return &o.hold })
}

// WithRTTBuckets sets the upper bounds, in seconds, of the buckets of the
// keep-alive round-trip histogram. They must be in increasing order. The
// default is .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5 and 10.
func WithRTTBuckets(bounds ...float64) Option {
	return bucketsOption("WithRTTBuckets", bounds, func(o *options) *[]float64 { return &o.rtt })
}

// bucketsOption returns an Option that sets the buckets field returns,
// after checking bounds.
func bucketsOption(name string, bounds []float64, field func(*options) *[]float64) Option {
	bounds = slices.Clone(bounds)
	err := checkBuckets(bounds)
	return optionFunc(func(o *options) {
		if err != nil {
			o.invalid(fmt.Errorf("etcdlockprom: %s: %w", name, err))
			return
		}
		*field(o) = bounds
	})
}

func checkBuckets(bounds []float64) error {
	if len(bounds) == 0 {
		return fmt.Errorf("no bucket bounds")
	}
	for i, b := range bounds {
		switch {
		case math.IsNaN(b):
			return fmt.Errorf("bound %d is NaN", i)
		case i > 0 && b <= bounds[i-1]:
			return fmt.Errorf("bounds must increase, got %v after %v", b, bounds[i-1])
		}
	}
	return nil
}

func (o *options) invalid(err error) {
	if o.err == nil {
		o.err = err
	}
}
