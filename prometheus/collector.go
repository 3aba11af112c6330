package etcdlockprom

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
)

// Label names.
const (
	labelPrimitive = "primitive"
	labelLock      = "lock"
	labelOutcome   = "outcome"
	labelContended = "contended"
	labelReason    = "reason"
	labelResult    = "result"
)

// Values of the label result of the releases counter.
const (
	resultOK         = "ok"
	resultFencedMiss = "fenced_miss"
	resultError      = "error"
)

// A Collector is an etcdlock.Observer that keeps metrics of the events it
// is given, and a prometheus.Collector that exports them. Give it to the
// Sessions to observe with etcdlock.WithObserver, and register it once.
// It is safe for use by many Sessions at once.
type Collector struct {
	err       error // from the options: Describe reports it, Observe does nothing
	lockLabel bool

	wait         *prometheus.HistogramVec
	acquisitions *prometheus.CounterVec
	inProgress   *prometheus.GaugeVec
	hold         *prometheus.HistogramVec
	holds        *prometheus.GaugeVec
	losses       *prometheus.CounterVec
	releases     *prometheus.CounterVec
	rtt          prometheus.Histogram
	margin       prometheus.Gauge
	ttl          prometheus.Gauge
	failures     prometheus.Counter
	dropped      prometheus.Counter

	mu       sync.Mutex
	live     map[holdID][]string   // the holds counted in holds, with their labels
	inflight map[flightID]int      // acquisitions counted in inProgress, by Session and labels
	labels   map[flightID][]string // the labels of a flightID
}

// holdID names one hold: its Session's lease, its key and fencing token.
type holdID struct {
	lease clientv3.LeaseID
	key   string
	token int64
}

// flightID names the acquisitions of one Session with one set of labels.
type flightID struct {
	lease  clientv3.LeaseID
	labels string
}

// New returns a Collector. Invalid options (buckets out of order, a
// namespace or constant label that makes an invalid metric) do not panic:
// registering the Collector returns the error, and it observes nothing.
func New(opts ...Option) *Collector {
	o := options{
		namespace: "etcdlock",
		wait:      defaultWaitBuckets,
		hold:      defaultHoldBuckets,
		rtt:       defaultRTTBuckets,
	}
	for _, opt := range opts {
		if opt == nil {
			o.invalid(errors.New("etcdlockprom: nil Option"))
			continue
		}
		opt.apply(&o)
	}
	if _, ok := o.constLabels["le"]; ok {
		// A histogram panics with this label.
		o.invalid(errors.New(`etcdlockprom: WithConstLabels: "le" is reserved for histogram buckets`))
	}
	if o.err != nil {
		return &Collector{err: o.err}
	}

	c := &Collector{lockLabel: o.lockLabel, live: make(map[holdID][]string), inflight: make(map[flightID]int), labels: make(map[flightID][]string)}
	labels := func(extra ...string) []string {
		l := []string{labelPrimitive}
		if o.lockLabel {
			l = append(l, labelLock)
		}
		return append(l, extra...)
	}
	c.wait = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: o.namespace, Name: "acquire_wait_seconds", ConstLabels: o.constLabels, Buckets: o.wait,
		Help: "Time from a lock call to its end (acquired, busy, timed_out, canceled or error), in seconds.",
	}, labels(labelOutcome))
	c.acquisitions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: o.namespace, Name: "acquisitions_total", ConstLabels: o.constLabels,
		Help: "Lock calls that went to etcd or waited for a local holder, by outcome, and whether they found the lock held by another holder.",
	}, labels(labelOutcome, labelContended))
	c.inProgress = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: o.namespace, Name: "acquisitions_in_progress", ConstLabels: o.constLabels,
		Help: "Lock calls of this process that have started and not ended: waiting, or talking to etcd.",
	}, labels())
	c.hold = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: o.namespace, Name: "hold_duration_seconds", ConstLabels: o.constLabels, Buckets: o.hold,
		Help: "Time from an acquisition to its release, in seconds.",
	}, labels())
	c.holds = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: o.namespace, Name: "holds", ConstLabels: o.constLabels,
		Help: "Holds of this process, neither released nor known lost: one per etcd key held (two readers of one RWMutex are two).",
	}, labels())
	c.losses = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: o.namespace, Name: "losses_total", ConstLabels: o.constLabels,
		Help: "Holds lost before their release, by reason; counted only for holds whose Done channel was asked for.",
	}, labels(labelReason))
	c.releases = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: o.namespace, Name: "releases_total", ConstLabels: o.constLabels,
		Help: "Releases of a held key, by result: ok, fenced_miss (the key was already gone) or error (retried in the background).",
	}, labels(labelResult))
	c.rtt = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: o.namespace, Name: "keepalive_rtt_seconds", ConstLabels: o.constLabels, Buckets: o.rtt,
		Help: "Round trip of the lease renewals that succeeded, in seconds.",
	})
	c.margin = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: o.namespace, Name: "keepalive_margin_seconds", ConstLabels: o.constLabels,
		Help: "At the last lease renewal, how long the lease still had before it could expire, in seconds.",
	})
	c.ttl = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: o.namespace, Name: "lease_ttl_seconds", ConstLabels: o.constLabels,
		Help: "The TTL of the lease last renewed, in seconds: what the keep-alive margin counts down from.",
	})
	c.failures = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: o.namespace, Name: "keepalive_failures_total", ConstLabels: o.constLabels,
		Help: "Lease renewals that failed.",
	})
	c.dropped = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: o.namespace, Name: "events_dropped_total", ConstLabels: o.constLabels,
		Help: "Events that Sessions dropped because their observers were too slow: the gauges may be off.",
	})

	// Registering reports what makes a metric invalid (a bad namespace or
	// label name) now, not at the first event.
	if err := prometheus.NewRegistry().Register(c); err != nil {
		return &Collector{err: fmt.Errorf("etcdlockprom: %w", err)}
	}
	return c
}

// Describe sends the descriptions of the metrics, or an invalid one when
// New's options were invalid, which makes registration fail.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	if c.err != nil {
		ch <- prometheus.NewInvalidDesc(c.err)
		return
	}
	for _, m := range c.metrics() {
		m.Describe(ch)
	}
}

// Collect sends the current values of the metrics.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	if c.err != nil {
		ch <- prometheus.NewInvalidMetric(prometheus.NewInvalidDesc(c.err), c.err)
		return
	}
	for _, m := range c.metrics() {
		m.Collect(ch)
	}
}

func (c *Collector) metrics() []prometheus.Collector {
	return []prometheus.Collector{
		c.wait, c.acquisitions, c.inProgress, c.hold, c.holds, c.losses, c.releases,
		c.rtt, c.margin, c.ttl, c.failures, c.dropped,
	}
}

// Observe updates the metrics with e. Sessions call it; a Collector made
// with invalid options ignores it.
func (c *Collector) Observe(e etcdlock.Event) {
	if c.err != nil {
		return
	}
	switch e.Kind {
	case etcdlock.AcquireStarted:
		c.flying(e, 1)
	case etcdlock.AcquireEnded:
		c.flying(e, -1)
		c.wait.WithLabelValues(c.values(e, string(e.Outcome))...).Observe(e.Wait.Seconds())
		// A busy try found the lock held: contended, though it did not wait.
		contended := e.Contended || e.Outcome == etcdlock.OutcomeBusy
		c.acquisitions.WithLabelValues(c.values(e, string(e.Outcome), strconv.FormatBool(contended))...).Inc()
		if e.Outcome == etcdlock.OutcomeAcquired {
			c.held(e)
		}
	case etcdlock.HoldEnded:
		c.hold.WithLabelValues(c.values(e)...).Observe(e.HeldFor.Seconds())
		c.ended(e)
	case etcdlock.HoldLost:
		c.losses.WithLabelValues(c.values(e, string(e.Reason))...).Inc()
		c.ended(e)
	case etcdlock.Released:
		result := resultOK
		switch {
		case e.Err != nil:
			result = resultError
		case e.FencedMiss:
			result = resultFencedMiss
		}
		c.releases.WithLabelValues(c.values(e, result)...).Inc()
	case etcdlock.KeptAlive:
		c.margin.Set(e.Margin.Seconds())
		c.ttl.Set(e.TTL.Seconds())
		if e.Err != nil {
			c.failures.Inc()
		} else {
			c.rtt.Observe(e.RTT.Seconds())
		}
	case etcdlock.EventsDropped:
		c.dropped.Add(float64(e.Dropped))
	case etcdlock.SessionClosed:
		c.closed(e.Lease)
	case etcdlock.LeaseRenewed:
		// The holds and acquisitions of the lost lease are over, whether
		// or not their ends were reported.
		c.closed(e.OldLease)
	}
}

// flying counts an acquisition of e's Session in or out of inProgress.
func (c *Collector) flying(e etcdlock.Event, n int) {
	lv := c.values(e)
	id := flightID{e.Lease, strings.Join(lv, "\x00")}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inflight[id]+n < 0 {
		return // its start was dropped
	}
	c.inflight[id] += n
	c.labels[id] = lv
	if c.inflight[id] == 0 {
		delete(c.inflight, id)
		delete(c.labels, id)
	}
	c.inProgress.WithLabelValues(lv...).Add(float64(n))
}

// closed stops counting the holds and acquisitions of a closed Session:
// whatever it reports after its close is not delivered.
func (c *Collector) closed(lease clientv3.LeaseID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, lv := range c.live {
		if id.lease == lease {
			delete(c.live, id)
			c.holds.WithLabelValues(lv...).Dec()
		}
	}
	for id, n := range c.inflight {
		if id.lease == lease {
			c.inProgress.WithLabelValues(c.labels[id]...).Sub(float64(n))
			delete(c.inflight, id)
			delete(c.labels, id)
		}
	}
}

// values returns the values of the labels of e's metric: primitive, lock if
// asked for, then extra. The slice is new: a metric may keep it.
func (c *Collector) values(e etcdlock.Event, extra ...string) []string {
	lv := make([]string, 0, 2+len(extra))
	lv = append(lv, string(e.Primitive))
	if c.lockLabel {
		lv = append(lv, e.Lock)
	}
	return append(lv, extra...)
}

// held counts the hold that e acquired, unless it is counted already (a
// hold lost and then released is ended once, whichever is reported first).
func (c *Collector) held(e etcdlock.Event) {
	id := holdID{e.Lease, e.Key, e.Token}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.live[id]; ok {
		return
	}
	lv := c.values(e)
	c.live[id] = lv
	c.holds.WithLabelValues(lv...).Inc()
}

// ended stops counting the hold of e, if it is counted: a hold ends once,
// when it is released or when it is known lost, whichever comes first.
func (c *Collector) ended(e etcdlock.Event) {
	id := holdID{e.Lease, e.Key, e.Token}
	c.mu.Lock()
	defer c.mu.Unlock()
	lv, ok := c.live[id]
	if !ok {
		return
	}
	delete(c.live, id)
	c.holds.WithLabelValues(lv...).Dec()
}
