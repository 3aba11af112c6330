package etcdlockotel

import (
	"errors"
	"strconv"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/attribute"

	"github.com/etcdlock/etcdlock"
)

// The name of the instrumentation scope of the spans and metrics.
const scope = "github.com/etcdlock/etcdlock/otel"

// Attribute keys.
const (
	keyLock     = attribute.Key("etcdlock.lock.name")
	keyKind     = attribute.Key("etcdlock.lock.kind")
	keyOutcome  = attribute.Key("etcdlock.outcome")
	keyContend  = attribute.Key("etcdlock.contended")
	keyWait     = attribute.Key("etcdlock.wait")
	keyKey      = attribute.Key("etcdlock.key")
	keyToken    = attribute.Key("etcdlock.token")
	keyLease    = attribute.Key("etcdlock.lease")
	keyReason   = attribute.Key("etcdlock.loss.reason")
	keyResult   = attribute.Key("etcdlock.release.result")
	keyTerm     = attribute.Key("etcdlock.term")
	keyTarget   = attribute.Key("etcdlock.handover.target")
	keyHeldFor  = attribute.Key("etcdlock.held_for")
	keyLeaseOld = attribute.Key("etcdlock.lease.old")
)

// An Observer is an etcdlock.Observer that makes OpenTelemetry spans and
// metrics of the events it is given (the package's doc lists them). Give
// it to Sessions with etcdlock.WithObserver. It is safe for use by many
// Sessions at once.
type Observer struct {
	err error // from the options or the meter: Observe then does nothing
	tr  *tracing
	me  *measuring
}

// New returns an Observer with opts. Invalid options (a nil provider) and
// a meter that refuses an instrument do not panic: the Observer then
// observes nothing, and Err says why.
func New(opts ...Option) *Observer {
	var o options
	for _, opt := range opts {
		if opt == nil {
			return &Observer{err: errors.New("etcdlockotel: nil Option")}
		}
		opt.apply(&o)
	}
	if o.nilOption {
		return &Observer{err: errors.New("etcdlockotel: nil provider")}
	}
	ob := &Observer{}
	if o.tp != nil {
		ob.tr = newTracing(o.tp)
	}
	if o.mp != nil {
		me, err := newMeasuring(o.mp, o.lockAttr)
		if err != nil {
			return &Observer{err: err}
		}
		ob.me = me
	}
	return ob
}

// Err returns why the Observer observes nothing, or nil.
func (o *Observer) Err() error { return o.err }

// Observe makes spans and metrics of e. Sessions call it.
func (o *Observer) Observe(e etcdlock.Event) {
	if o.err != nil {
		return
	}
	if o.tr != nil {
		o.tr.observe(e)
	}
	if o.me != nil {
		o.me.observe(e)
	}
}

// leaseHex writes a lease as etcdctl does.
func leaseHex(id clientv3.LeaseID) string { return strconv.FormatInt(int64(id), 16) }

// holdID names one hold: its Session's lease, its key and fencing token.
type holdID struct {
	lease clientv3.LeaseID
	key   string
	token int64
}

func holdOf(e etcdlock.Event) holdID { return holdID{e.Lease, e.Key, e.Token} }

// live is a set of holds of one kind of state, with a value each, by the
// lease they are on: what a lost lease or a closed Session ends.
type live[T any] struct {
	mu    sync.Mutex
	holds map[holdID]T
}

func (l *live[T]) put(id holdID, v T) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.holds == nil {
		l.holds = make(map[holdID]T)
	}
	l.holds[id] = v
}

// take removes the hold id, and returns its value.
func (l *live[T]) take(id holdID) (T, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v, ok := l.holds[id]
	delete(l.holds, id)
	return v, ok
}

// get returns the value of the hold id.
func (l *live[T]) get(id holdID) (T, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v, ok := l.holds[id]
	return v, ok
}

// takeLease removes every hold on lease, and returns their values.
func (l *live[T]) takeLease(lease clientv3.LeaseID) []T {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []T
	for id, v := range l.holds {
		if id.lease == lease {
			out = append(out, v)
			delete(l.holds, id)
		}
	}
	return out
}
