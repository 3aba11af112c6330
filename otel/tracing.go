package etcdlockotel

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/etcdlock/etcdlock"
)

// tracing makes the spans: an acquisition's at its end, and a hold's from
// its acquisition to its release or loss.
type tracing struct {
	tracer trace.Tracer
	holds  live[trace.Span]
}

func newTracing(tp trace.TracerProvider) *tracing {
	return &tracing{tracer: tp.Tracer(scope)}
}

func (t *tracing) observe(e etcdlock.Event) {
	at := trace.WithTimestamp(e.Time)
	switch e.Kind {
	case etcdlock.AcquireEnded:
		t.acquired(e)
	case etcdlock.HoldEnded:
		if sp, ok := t.holds.take(holdOf(e)); ok {
			sp.SetAttributes(keyHeldFor.Float64(e.HeldFor.Seconds()))
			sp.End(at)
		}
	case etcdlock.HoldLost:
		if sp, ok := t.holds.take(holdOf(e)); ok {
			sp.AddEvent("etcdlock.hold.lost", at, trace.WithAttributes(keyReason.String(string(e.Reason))))
			sp.SetStatus(codes.Error, "lock lost: "+string(e.Reason))
			sp.End(at)
		}
	case etcdlock.TermStarted:
		if sp, ok := t.holds.get(holdOf(e)); ok {
			sp.SetAttributes(keyTerm.Int64(e.Term))
			sp.AddEvent("etcdlock.term.started", at, trace.WithAttributes(keyTerm.Int64(e.Term)))
		}
	case etcdlock.HandedOver, etcdlock.SteppedAside:
		if sp, ok := t.holds.get(holdOf(e)); ok {
			sp.AddEvent("etcdlock."+string(e.Kind), at, trace.WithAttributes(keyTarget.String(e.Target)))
		}
	case etcdlock.LeaseRenewed:
		// Every hold on the lost lease is lost; those whose Done nobody
		// asked for have no HoldLost.
		for _, sp := range t.holds.takeLease(e.OldLease) {
			sp.AddEvent("etcdlock.hold.lost", at, trace.WithAttributes(keyReason.String(string(etcdlock.LossLeaseGone))))
			sp.SetStatus(codes.Error, "lock lost: "+string(etcdlock.LossLeaseGone))
			sp.End(at)
		}
	case etcdlock.SessionClosed:
		for _, sp := range t.holds.takeLease(e.Lease) {
			sp.AddEvent("etcdlock.session.closed", at)
			sp.End(at)
		}
	}
}

// acquired makes the span of the acquisition that e ended, a child of the
// span in its call's context, and, if it holds, starts its hold's.
func (t *tracing) acquired(e etcdlock.Event) {
	parent := e.Context
	if parent == nil {
		parent = context.Background()
	}
	held := e.Outcome == etcdlock.OutcomeAcquired
	lock := []attribute.KeyValue{keyLock.String(e.Lock), keyKind.String(string(e.Primitive)), keyLease.String(leaseHex(e.Lease))}
	if held {
		lock = append(lock, keyKey.String(e.Key), keyToken.Int64(e.Token))
	}
	_, sp := t.tracer.Start(parent, "etcdlock.acquire", trace.WithTimestamp(e.Time.Add(-e.Wait)), trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(lock...), trace.WithAttributes(keyOutcome.String(string(e.Outcome)), keyContend.Bool(e.Contended), keyWait.Float64(e.Wait.Seconds())))
	if e.Outcome == etcdlock.OutcomeError && e.Err != nil {
		sp.RecordError(e.Err, trace.WithTimestamp(e.Time))
		sp.SetStatus(codes.Error, e.Err.Error())
	}
	sp.End(trace.WithTimestamp(e.Time))
	if held {
		_, hold := t.tracer.Start(parent, "etcdlock.hold", trace.WithTimestamp(e.Time), trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithAttributes(lock...), trace.WithLinks(trace.Link{SpanContext: sp.SpanContext()}))
		t.holds.put(holdOf(e), hold)
	}
}
