package etcdlockotel

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/etcdlock/etcdlock"
)

// Values of the attribute etcdlock.release.result.
const (
	resultOK         = "ok"
	resultFencedMiss = "fenced_miss"
	resultError      = "error"
)

// measuring keeps the metrics: the instruments, and which holds and
// acquisitions the up-down counters count now, so that an end is counted
// only once its start was.
type measuring struct {
	lockAttr bool

	wait         metric.Float64Histogram
	acquisitions metric.Int64Counter
	active       metric.Int64UpDownCounter
	hold         metric.Float64Histogram
	holds        metric.Int64UpDownCounter
	losses       metric.Int64Counter
	releases     metric.Int64Counter
	rtt          metric.Float64Histogram
	margin       metric.Float64Gauge
	ttl          metric.Float64Gauge
	failures     metric.Int64Counter
	dropped      metric.Int64Counter

	counted live[attribute.Set] // the holds counted in holds, with their attributes
}

// Histogram bounds, in seconds, as package etcdlock/prometheus's.
var (
	waitBounds = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}
	holdBounds = []float64{.001, .01, .1, .5, 1, 5, 10, 30, 60, 300, 900, 3600, 14400, 86400}
	rttBounds  = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}
)

func newMeasuring(mp metric.MeterProvider, lockAttr bool) (*measuring, error) {
	m := &measuring{lockAttr: lockAttr}
	meter := mp.Meter(scope)
	var errs []error
	keep := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	var err error
	m.wait, err = meter.Float64Histogram("etcdlock.acquire.duration", metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(waitBounds...),
		metric.WithDescription("Time from a lock call to its end (acquired, busy, timed_out, canceled or error)."))
	keep(err)
	m.acquisitions, err = meter.Int64Counter("etcdlock.acquisitions", metric.WithUnit("{acquisition}"),
		metric.WithDescription("Lock calls that went to etcd or waited for a local holder, by outcome, and whether they found the lock held by another holder."))
	keep(err)
	m.active, err = meter.Int64UpDownCounter("etcdlock.acquisitions.active", metric.WithUnit("{acquisition}"),
		metric.WithDescription("Lock calls of this process that have started and not ended: waiting, or talking to etcd."))
	keep(err)
	m.hold, err = meter.Float64Histogram("etcdlock.hold.duration", metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(holdBounds...),
		metric.WithDescription("Time from an acquisition to its release."))
	keep(err)
	m.holds, err = meter.Int64UpDownCounter("etcdlock.holds", metric.WithUnit("{hold}"),
		metric.WithDescription("Holds of this process, neither released nor known lost: one per etcd key held."))
	keep(err)
	m.losses, err = meter.Int64Counter("etcdlock.losses", metric.WithUnit("{hold}"),
		metric.WithDescription("Holds lost before their release, by reason; counted only for holds whose Done channel was asked for."))
	keep(err)
	m.releases, err = meter.Int64Counter("etcdlock.releases", metric.WithUnit("{release}"),
		metric.WithDescription("Releases of a held key, by result: ok, fenced_miss (the key was already gone) or error (retried in the background)."))
	keep(err)
	m.rtt, err = meter.Float64Histogram("etcdlock.keepalive.rtt", metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(rttBounds...),
		metric.WithDescription("Round trip of the lease renewals that succeeded."))
	keep(err)
	m.margin, err = meter.Float64Gauge("etcdlock.keepalive.margin", metric.WithUnit("s"),
		metric.WithDescription("At the last lease renewal, how long the lease still had before it could expire."))
	keep(err)
	m.ttl, err = meter.Float64Gauge("etcdlock.lease.ttl", metric.WithUnit("s"),
		metric.WithDescription("The TTL of the lease last renewed: what the keep-alive margin counts down from."))
	keep(err)
	m.failures, err = meter.Int64Counter("etcdlock.keepalive.failures", metric.WithUnit("{renewal}"),
		metric.WithDescription("Lease renewals that failed."))
	keep(err)
	m.dropped, err = meter.Int64Counter("etcdlock.events.dropped", metric.WithUnit("{event}"),
		metric.WithDescription("Events that Sessions dropped because their observers were too slow: the up-down counters may be off."))
	keep(err)
	if len(errs) > 0 {
		return nil, fmt.Errorf("etcdlockotel: %w", errors.Join(errs...))
	}
	return m, nil
}

// attrs returns the attributes of e's lock, and extra.
func (m *measuring) attrs(e etcdlock.Event, extra ...attribute.KeyValue) attribute.Set {
	kv := []attribute.KeyValue{keyKind.String(string(e.Primitive))}
	if m.lockAttr {
		kv = append(kv, keyLock.String(e.Lock))
	}
	return attribute.NewSet(append(kv, extra...)...)
}

func (m *measuring) observe(e etcdlock.Event) {
	ctx := context.Background()
	switch e.Kind {
	case etcdlock.AcquireStarted:
		m.active.Add(ctx, 1, metric.WithAttributeSet(m.attrs(e)))
	case etcdlock.AcquireEnded:
		m.active.Add(ctx, -1, metric.WithAttributeSet(m.attrs(e)))
		m.wait.Record(ctx, e.Wait.Seconds(), metric.WithAttributeSet(m.attrs(e, keyOutcome.String(string(e.Outcome)))))
		// A busy try found the lock held: contended, though it did not wait.
		contended := e.Contended || e.Outcome == etcdlock.OutcomeBusy
		m.acquisitions.Add(ctx, 1, metric.WithAttributeSet(m.attrs(e, keyOutcome.String(string(e.Outcome)), keyContend.Bool(contended))))
		if e.Outcome == etcdlock.OutcomeAcquired {
			set := m.attrs(e)
			m.counted.put(holdOf(e), set)
			m.holds.Add(ctx, 1, metric.WithAttributeSet(set))
		}
	case etcdlock.HoldEnded:
		m.hold.Record(ctx, e.HeldFor.Seconds(), metric.WithAttributeSet(m.attrs(e)))
		m.uncount(ctx, e)
	case etcdlock.HoldLost:
		m.losses.Add(ctx, 1, metric.WithAttributeSet(m.attrs(e, keyReason.String(string(e.Reason)))))
		m.uncount(ctx, e)
	case etcdlock.Released:
		result := resultOK
		switch {
		case e.Err != nil:
			result = resultError
		case e.FencedMiss:
			result = resultFencedMiss
		}
		m.releases.Add(ctx, 1, metric.WithAttributeSet(m.attrs(e, keyResult.String(result))))
	case etcdlock.KeptAlive:
		m.margin.Record(ctx, e.Margin.Seconds())
		m.ttl.Record(ctx, e.TTL.Seconds())
		if e.Err != nil {
			m.failures.Add(ctx, 1)
		} else {
			m.rtt.Record(ctx, e.RTT.Seconds())
		}
	case etcdlock.EventsDropped:
		m.dropped.Add(ctx, int64(e.Dropped))
	case etcdlock.LeaseRenewed:
		m.uncountLease(ctx, e.OldLease)
	case etcdlock.SessionClosed:
		m.uncountLease(ctx, e.Lease)
	}
}

// uncount takes e's hold out of the holds, if it was counted.
func (m *measuring) uncount(ctx context.Context, e etcdlock.Event) {
	if set, ok := m.counted.take(holdOf(e)); ok {
		m.holds.Add(ctx, -1, metric.WithAttributeSet(set))
	}
}

// uncountLease takes the holds on lease out of the holds: it was lost, or
// its Session closed.
func (m *measuring) uncountLease(ctx context.Context, lease clientv3.LeaseID) {
	for _, set := range m.counted.takeLease(lease) {
		m.holds.Add(ctx, -1, metric.WithAttributeSet(set))
	}
}
