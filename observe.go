package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/etcdlock/etcdlock/internal/queue"
	"github.com/petermattis/goid"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// An Observer receives a Session's Events in order, one at a time, off the
// locks' path: a slow one delays later events; past 1,024 waiting, some drop
// (EventsDropped). Close delivers those queued, then SessionClosed; if Observe
// calls Close, it does not wait.
type Observer interface {
	Observe(Event)
}

// ObserverFunc makes an Observer of a function.
type ObserverFunc func(Event)

// Observe calls f(e).
func (f ObserverFunc) Observe(e Event) { f(e) }

// An EventKind says what an Event reports.
type EventKind string

// Kinds of Event.
const (
	AcquireStarted EventKind = "acquire_started" // a lock call goes to etcd, or waits for a goroutine of this process
	AcquireEnded   EventKind = "acquire_ended"   // it ended: Outcome, Wait, Contended, Token
	HoldEnded      EventKind = "hold_ended"      // the last unlock (or a permit's release): HeldFor
	HoldLost       EventKind = "hold_lost"       // Done closed while held: Reason
	Released       EventKind = "released"        // the release's delete: Err, FencedMiss
	KeptAlive      EventKind = "kept_alive"      // a keep-alive round trip: RTT, Margin, TTL, Err
	EventsDropped  EventKind = "events_dropped"  // Dropped events were lost: the Observer was too slow
	SessionClosed  EventKind = "session_closed"  // Close was called, or the WithContext context ended: the Session's holds have ended; the last event
	SessionFailed  EventKind = "session_failed"  // a lease could not be had (etcd unreachable, say) and will be tried again: by Lead (Lock, Err) or a Session made WithRenewal (Err)
	LeaseRenewed   EventKind = "lease_renewed"   // a Session made WithRenewal has a new lease after losing one: Lease, OldLease, TTL
	TermStarted    EventKind = "term_started"    // Lead holds the lock and is about to run f: Key, Token, Term; Err (and Term 0) where etcd refused the term count
	HandedOver     EventKind = "handed_over"     // Lead's f returned HandOver: Target, the key handed over to; "" when none was (then Err if etcd failed)
	SteppedAside   EventKind = "stepped_aside"   // Lead held the lock handed over to another, and releases it without running f: Target
)

// An Outcome is how an acquisition ended.
type Outcome string

// Outcomes of AcquireEnded.
const (
	OutcomeAcquired Outcome = "acquired"  // the call holds: Key and Token are set
	OutcomeBusy     Outcome = "busy"      // a try found the lock held
	OutcomeTimedOut Outcome = "timed_out" // TryLockFor's or TryAcquire's wait ran out
	OutcomeCanceled Outcome = "canceled"  // the caller's context ended
	OutcomeError    Outcome = "error"     // any other failure: Err
)

// A LossReason is why a hold was lost.
type LossReason string

// Reasons of HoldLost.
const (
	LossKeyDeleted      LossReason = "key_deleted"      // our key was deleted while its lease lived: by hand, or by another client
	LossLeaseGone       LossReason = "lease_gone"       // the lease was revoked or expired, which deletes our key too
	LossKeepAliveSilent LossReason = "keepalive_silent" // 2/3 of the TTL since the last acknowledged keep-alive was sent: the lease may expire
	LossSessionClosed   LossReason = "session_closed"   // Close was called, or the WithContext context ended
	LossMaxHold         LossReason = "max_hold"         // the hold reached its cap (WithMaxHold): its key is deleted next
)

// An Event is one thing that happened to a lock of a Session, or to its
// lease; fields that do not apply to its Kind are zero. Events are for
// adapters (logs, metrics such as package etcdlock/prometheus, traces): a
// lock's user needs none of it to lock.
type Event struct {
	Kind      EventKind        // what happened; it says which other fields are set
	Context   context.Context  // the lock call's (for HoldEnded and HoldLost, the acquiring call's), for traces; nil for other kinds
	Time      time.Time        // when it happened
	Lease     clientv3.LeaseID // the lease it happened on: the Session's, or WithRenewal the one of the hold or call
	OldLease  clientv3.LeaseID // LeaseRenewed: the lease lost
	Lock      string           // the lock's name; a MultiMutex's names, sorted, joined by commas
	Primitive Kind             // KindMutex, KindRead, KindWrite, KindSemaphore or KindMulti
	Key       string           // our key, once known; a MultiMutex's first (the others: its other names', same lease and token)
	Token     int64            // the hold's fencing token, once known

	Outcome    Outcome       // AcquireEnded
	Contended  bool          // AcquireEnded: it had to wait for another holder
	Wait       time.Duration // AcquireEnded: from the call to its end
	HeldFor    time.Duration // HoldEnded: from the acquisition to the release
	Reason     LossReason    // HoldLost
	Err        error         // AcquireEnded with OutcomeError, Released, KeptAlive
	FencedMiss bool          // Released: the key was already gone (ErrLockLost or ErrSessionExpired)
	RTT        time.Duration // KeptAlive: the renewal's round trip
	Margin     time.Duration // KeptAlive: how long the lease still had when the renewal was answered or gave up (docs/observability.md)
	TTL        time.Duration // KeptAlive: the lease's TTL, which Margin counts down from
	Dropped    int           // EventsDropped
	Term       int64         // TermStarted: the term's count (TermFrom)
	Target     string        // HandedOver, SteppedAside: the key of the candidate handed over to
}

// eventBuffer is how many events may wait for slow observers.
const eventBuffer = 1024

// A dispatch hands a Session's events to its observers: a bounded queue,
// and the goroutine that empties it, in order. A nil *dispatch (no
// observers) reports nothing.
type dispatch struct {
	observers []Observer
	lease     atomic.Int64 // the Session's lease in use, for events that name none
	events    chan Event
	dropped   atomic.Int64
	over      atomic.Bool  // delivery has stopped: events are not queued
	gid       atomic.Int64 // the delivering goroutine's id, once it runs
	stopOnce  sync.Once
	stop      chan struct{}
	done      sync.WaitGroup
}

// newDispatch starts delivering to observers, or returns nil if there are
// none.
func newDispatch(observers []Observer, lease clientv3.LeaseID) *dispatch {
	if len(observers) == 0 {
		return nil
	}
	d := &dispatch{observers: observers, events: make(chan Event, eventBuffer), stop: make(chan struct{})}
	d.setLease(lease)
	d.done.Go(d.deliver)
	return d
}

// setLease makes id the lease of the events that name none.
func (d *dispatch) setLease(id clientv3.LeaseID) {
	if d != nil {
		d.lease.Store(int64(id))
	}
}

func (d *dispatch) leaseInUse() clientv3.LeaseID { return clientv3.LeaseID(d.lease.Load()) }

// emit queues e for the observers, never blocking: when the queue is full,
// e is dropped and counted. After close, nothing is queued.
func (d *dispatch) emit(e Event) {
	if d == nil || d.over.Load() {
		return
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	if e.Lease == clientv3.NoLease {
		e.Lease = d.leaseInUse()
	}
	select {
	case d.events <- e:
	default:
		d.dropped.Add(1)
	}
}

// close has delivery end after what is queued, then SessionClosed, and
// waits for it, unless an Observer calls it: delivery then ends once the
// Observer returns, and a later close waits for it. Safe to call more than
// once.
func (d *dispatch) close() {
	if d == nil {
		return
	}
	d.stopOnce.Do(func() { close(d.stop) })
	if goid.Get() == d.gid.Load() {
		return
	}
	d.done.Wait()
}

// deliver hands the queued events to the observers until stop is closed,
// then delivers what is still queued, and SessionClosed.
func (d *dispatch) deliver() {
	d.gid.Store(goid.Get())
	defer d.over.Store(true)
	for {
		select {
		case e := <-d.events:
			d.observe(e)
		case <-d.stop:
			for {
				select {
				case e := <-d.events:
					d.observe(e)
				default:
					d.observe(Event{Kind: SessionClosed, Time: time.Now(), Lease: d.leaseInUse()})
					return
				}
			}
		}
	}
}

func (d *dispatch) observe(e Event) {
	if n := d.dropped.Swap(0); n > 0 {
		// Before e: the events dropped came before it.
		drop := Event{Kind: EventsDropped, Time: e.Time, Lease: d.leaseInUse(), Dropped: int(n)}
		for _, o := range d.observers {
			o.Observe(drop)
		}
	}
	for _, o := range d.observers {
		o.Observe(e)
	}
}

// An acquisition reports one lock call to the observers: its start, then
// its end.
type acquisition struct {
	d     *dispatch
	start time.Time
	e     Event
}

// startAcquire reports the start of an acquisition, with the caller's ctx,
// of the lock name, of kind primitive, with lease; a no-op without
// observers.
func (d *dispatch) startAcquire(ctx context.Context, primitive Kind, name string, lease clientv3.LeaseID) acquisition {
	if d == nil {
		return acquisition{}
	}
	a := acquisition{d: d, start: time.Now(), e: Event{Context: ctx, Lock: name, Primitive: primitive, Lease: lease}}
	e := a.e
	e.Kind, e.Time = AcquireStarted, a.start
	d.emit(e)
	return a
}

// end reports how the acquisition ended: with key and token when held;
// err is the call's error; held false with a nil err is a try or a wait
// that ran out.
func (a acquisition) end(key string, token int64, held, contended bool, wait time.Duration, err error) {
	if a.d == nil {
		return
	}
	e := a.e
	e.Kind, e.Time = AcquireEnded, time.Now()
	e.Wait, e.Contended = e.Time.Sub(a.start), contended
	if held {
		e.Key, e.Token = key, token
	}
	switch {
	case held:
		e.Outcome = OutcomeAcquired
	case err == nil || errors.Is(err, ErrNoPermit):
		e.Outcome = OutcomeTimedOut
		if wait == queue.TryOnly {
			e.Outcome = OutcomeBusy
		}
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		e.Outcome = OutcomeCanceled
	default:
		e.Outcome, e.Err = OutcomeError, err
	}
	a.d.emit(e)
}

// logObserver is the Observer of WithLogger.
type logObserver struct{ l *slog.Logger }

func (o logObserver) Observe(e Event) {
	ctx := context.Background()
	attrs := []slog.Attr{slog.String("lock", e.Lock), slog.String("primitive", string(e.Primitive))}
	if e.Key != "" {
		attrs = append(attrs, slog.String("key", e.Key), slog.Int64("token", e.Token))
	}
	switch e.Kind {
	case AcquireStarted:
		o.l.LogAttrs(ctx, slog.LevelDebug, "etcdlock: acquiring", attrs...)
	case AcquireEnded:
		attrs = append(attrs, slog.String("outcome", string(e.Outcome)), slog.Duration("wait", e.Wait), slog.Bool("contended", e.Contended))
		level := slog.LevelDebug
		if e.Outcome == OutcomeError {
			level = slog.LevelWarn
			attrs = append(attrs, slog.String("error", e.Err.Error()))
		}
		o.l.LogAttrs(ctx, level, "etcdlock: acquire ended", attrs...)
	case HoldEnded:
		o.l.LogAttrs(ctx, slog.LevelDebug, "etcdlock: hold ended", append(attrs, slog.Duration("held", e.HeldFor))...)
	case HoldLost:
		o.l.LogAttrs(ctx, slog.LevelWarn, "etcdlock: hold lost", append(attrs, slog.String("reason", string(e.Reason)))...)
	case Released:
		switch {
		case e.Err != nil:
			o.l.LogAttrs(ctx, slog.LevelError, "etcdlock: release failed; retrying in the background", append(attrs, slog.String("error", e.Err.Error()))...)
		case e.FencedMiss:
			o.l.LogAttrs(ctx, slog.LevelWarn, "etcdlock: released a hold already lost", attrs...)
		default:
			o.l.LogAttrs(ctx, slog.LevelDebug, "etcdlock: released", attrs...)
		}
	case KeptAlive:
		attrs = []slog.Attr{slog.Duration("rtt", e.RTT), slog.Duration("margin", e.Margin)}
		if e.Err != nil {
			o.l.LogAttrs(ctx, slog.LevelWarn, "etcdlock: keep-alive failed", append(attrs, slog.String("error", e.Err.Error()))...)
			return
		}
		o.l.LogAttrs(ctx, slog.LevelDebug, "etcdlock: kept alive", attrs...)
	case EventsDropped:
		o.l.LogAttrs(ctx, slog.LevelWarn, "etcdlock: events dropped: an observer is too slow", slog.Int("dropped", e.Dropped))
	case SessionFailed:
		if e.Lock != "" {
			o.l.LogAttrs(ctx, slog.LevelWarn, "etcdlock: lead: no session; retrying", slog.String("lock", e.Lock), slog.String("error", e.Err.Error()))
			return
		}
		o.l.LogAttrs(ctx, slog.LevelWarn, "etcdlock: no new lease yet; retrying", slog.String("lost", fmt.Sprintf("%x", e.Lease)), slog.String("error", e.Err.Error()))
	case LeaseRenewed:
		o.l.LogAttrs(ctx, slog.LevelInfo, "etcdlock: new lease", slog.String("lease", fmt.Sprintf("%x", e.Lease)), slog.String("lost", fmt.Sprintf("%x", e.OldLease)))
	case TermStarted:
		if e.Err != nil {
			o.l.LogAttrs(ctx, slog.LevelWarn, "etcdlock: leading, uncounted", append(attrs, slog.String("error", e.Err.Error()))...)
			return
		}
		o.l.LogAttrs(ctx, slog.LevelInfo, "etcdlock: leading", append(attrs, slog.Int64("term", e.Term))...)
	case HandedOver:
		if e.Target == "" {
			if e.Err != nil {
				attrs = append(attrs, slog.String("error", e.Err.Error()))
			}
			o.l.LogAttrs(ctx, slog.LevelWarn, "etcdlock: hand-over to nobody: stepped down", attrs...)
			return
		}
		o.l.LogAttrs(ctx, slog.LevelInfo, "etcdlock: handed over", append(attrs, slog.String("to", e.Target))...)
	case SteppedAside:
		o.l.LogAttrs(ctx, slog.LevelDebug, "etcdlock: stepped aside", append(attrs, slog.String("for", e.Target))...)
	case SessionClosed:
		o.l.LogAttrs(ctx, slog.LevelDebug, "etcdlock: session closed", slog.String("lease", fmt.Sprintf("%x", e.Lease)))
	default:
		o.l.LogAttrs(ctx, slog.LevelDebug, fmt.Sprintf("etcdlock: %s", e.Kind), attrs...)
	}
}
