package etcdlockotel_test

import (
	"context"
	"fmt"
	"log"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	etcdlockotel "github.com/etcdlock/etcdlock/otel"
)

// A request takes a lock: its trace gets the acquisition and the hold as
// spans under the request's. Here the spans are kept in memory, on an
// in-process etcd; in your code, pass the TracerProvider (and
// MeterProvider) your service exports with.
func ExampleNew() {
	srv, err := etcdtest.New()
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	client, err := srv.NewClient()
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.Background())

	s, err := etcdlock.NewSession(client, etcdlock.WithObserver(etcdlockotel.New(etcdlockotel.WithTracerProvider(tp))))
	if err != nil {
		log.Fatal(err)
	}
	ctx, request := tp.Tracer("myapp").Start(context.Background(), "nightly report")
	m := etcdlock.NewMutex(s, "jobs/nightly")
	if err := m.LockContext(ctx); err != nil {
		log.Fatal(err)
	}
	// ... the work the lock guards ...
	if err := m.UnlockContext(ctx); err != nil {
		log.Fatal(err)
	}
	request.End()
	s.Close() // delivers the Session's last events

	for _, sp := range spans.Ended() {
		if sp.Parent().SpanID() == request.SpanContext().SpanID() {
			fmt.Println(sp.Name(), "under", `"nightly report"`)
		}
	}
	// Output:
	// etcdlock.acquire under "nightly report"
	// etcdlock.hold under "nightly report"
}
