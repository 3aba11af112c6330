package etcdlockotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/etcdlock/etcdlock"
)

// TestTraceHandOff: a lock handed from one Session's holder to a waiting
// Session's: each call's acquisition and hold are spans, children of the
// span of the caller's context; the waiter's acquisition span covers its
// wait, found the lock contended, and carries its token; the first hold's
// span ends at its release, before the second acquisition ends.
func TestTraceHandOff(t *testing.T) {
	_, client := startServer(t)
	r := newRecorded(t)
	tracer := r.tp.Tracer("test")
	name := lockName(t)
	a := etcdlock.NewMutex(newSession(t, client, r.o), name)
	b := etcdlock.NewMutex(newSession(t, client, r.o), name)

	actx, aWork := tracer.Start(testContext(t), "a-work")
	if err := a.LockContext(actx); err != nil {
		t.Fatal(err)
	}
	bctx, bRequest := tracer.Start(testContext(t), "b-request")
	var token int64
	locked := make(chan error, 1)
	go func() {
		if err := b.LockContext(bctx); err != nil {
			locked <- err
			return
		}
		token = b.Token()
		locked <- b.UnlockContext(bctx)
	}()
	for deadline := time.Now().Add(testTimeout); ; time.Sleep(5 * time.Millisecond) {
		resp, err := client.Get(actx, name+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("b's key: %v", err)
		}
		if resp.Count == 2 {
			break // b waits
		}
	}
	time.Sleep(50 * time.Millisecond)
	if err := a.UnlockContext(actx); err != nil {
		t.Fatal(err)
	}
	aWork.End()
	if err := <-locked; err != nil {
		t.Fatal(err)
	}
	bRequest.End()

	acq := r.wait(t, "etcdlock.acquire", 2)
	holds := r.wait(t, "etcdlock.hold", 2)
	byParent := func(spans []sdktrace.ReadOnlySpan, parent string) sdktrace.ReadOnlySpan {
		t.Helper()
		for _, s := range spans {
			if (parent == "a-work" && s.Parent().SpanID() == aWork.SpanContext().SpanID()) ||
				(parent == "b-request" && s.Parent().SpanID() == bRequest.SpanContext().SpanID()) {
				return s
			}
		}
		t.Fatalf("no span under %s among %d", parent, len(spans))
		return nil
	}
	aAcq, bAcq := byParent(acq, "a-work"), byParent(acq, "b-request")
	aHold, bHold := byParent(holds, "a-work"), byParent(holds, "b-request")
	for _, s := range []sdktrace.ReadOnlySpan{aAcq, bAcq, aHold, bHold} {
		if s.SpanContext().TraceID() != s.Parent().TraceID() {
			t.Errorf("%s: trace %s, its parent's %s", s.Name(), s.SpanContext().TraceID(), s.Parent().TraceID())
		}
		if got := attr(s, "etcdlock.lock.name").AsString(); got != name {
			t.Errorf("%s: etcdlock.lock.name %q, want %q", s.Name(), got, name)
		}
	}
	if attr(aAcq, "etcdlock.contended").AsBool() || !attr(bAcq, "etcdlock.contended").AsBool() {
		t.Errorf("contended: a %v, b %v; want false, true", attr(aAcq, "etcdlock.contended").AsBool(), attr(bAcq, "etcdlock.contended").AsBool())
	}
	if got := attr(bAcq, "etcdlock.outcome").AsString(); got != "acquired" {
		t.Errorf("b's outcome: got %q, want acquired", got)
	}
	if got := attr(bAcq, "etcdlock.token").AsInt64(); got != token {
		t.Errorf("b's token: got %d, want %d", got, token)
	}
	if got := attr(bAcq, "etcdlock.wait").AsFloat64(); got < 0.05 || bAcq.EndTime().Sub(bAcq.StartTime()).Seconds() < 0.05 {
		t.Errorf("b's wait: attribute %v s, span %v; want at least the 50 ms it waited", got, bAcq.EndTime().Sub(bAcq.StartTime()))
	}
	if aHold.EndTime().After(bAcq.EndTime()) {
		t.Errorf("a's hold ended at %v, after b's acquisition ended at %v", aHold.EndTime(), bAcq.EndTime())
	}
	if aHold.StartTime().Before(aAcq.EndTime()) {
		t.Errorf("a's hold began at %v, before its acquisition ended at %v", aHold.StartTime(), aAcq.EndTime())
	}
	if len(bHold.Links()) != 1 || bHold.Links()[0].SpanContext.SpanID() != bAcq.SpanContext().SpanID() {
		t.Errorf("b's hold: links %v, want its acquisition's span", bHold.Links())
	}
}

// TestTraceLostHold: a hold whose key is deleted by hand ends its span at
// the loss, with the event etcdlock.hold.lost (reason key_deleted) and the
// status Error.
func TestTraceLostHold(t *testing.T) {
	_, client := startServer(t)
	r := newRecorded(t)
	ctx, parent := r.tp.Tracer("test").Start(testContext(t), "work")
	defer parent.End()
	m := etcdlock.NewMutex(newSession(t, client, r.o), lockName(t))
	if err := m.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	done := m.Done()
	if _, err := client.Delete(ctx, m.Key()); err != nil {
		t.Fatal(err)
	}
	<-done
	hold := r.wait(t, "etcdlock.hold", 1)[0]
	if hold.Status().Code != codes.Error {
		t.Errorf("status: got %v, want Error", hold.Status())
	}
	events := hold.Events()
	if len(events) != 1 || events[0].Name != "etcdlock.hold.lost" || len(events[0].Attributes) != 1 || events[0].Attributes[0].Value.AsString() != "key_deleted" {
		t.Errorf("events: got %+v, want etcdlock.hold.lost with reason key_deleted", events)
	}
	if err := m.UnlockContext(ctx); !errors.Is(err, etcdlock.ErrLockLost) {
		t.Errorf("unlock: got %v, want ErrLockLost", err)
	}
}

// TestTraceCanceledWait: a wait whose context is cancelled is an
// acquisition span with the outcome canceled, and no hold span.
func TestTraceCanceledWait(t *testing.T) {
	_, client := startServer(t)
	r := newRecorded(t)
	name := lockName(t)
	holder := etcdlock.NewMutex(newSession(t, client, r.o), name)
	if err := holder.LockContext(testContext(t)); err != nil {
		t.Fatal(err)
	}
	ctx, parent := r.tp.Tracer("test").Start(testContext(t), "request")
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := etcdlock.NewMutex(newSession(t, client, r.o), name).LockContext(wctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("lock: got %v, want context.DeadlineExceeded", err)
	}
	parent.End()
	acq := r.wait(t, "etcdlock.acquire", 2)
	var waited sdktrace.ReadOnlySpan
	for _, s := range acq {
		if s.Parent().SpanID() == parent.SpanContext().SpanID() {
			waited = s
		}
	}
	if waited == nil {
		t.Fatal("no acquisition span under the request's")
	}
	if got := attr(waited, "etcdlock.outcome").AsString(); got != "canceled" {
		t.Errorf("outcome: got %q, want canceled", got)
	}
	if !attr(waited, "etcdlock.contended").AsBool() {
		t.Error("contended: got false, want true")
	}
	if err := holder.UnlockContext(testContext(t)); err != nil {
		t.Fatal(err)
	}
	for _, s := range r.wait(t, "etcdlock.hold", 1) {
		if s.Parent().SpanID() == parent.SpanContext().SpanID() {
			t.Errorf("a hold span under the request whose wait was cancelled")
		}
	}
}
