package etcdlockotel_test

import (
	"context"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	etcdlockotel "github.com/etcdlock/etcdlock/otel"
)

// BenchmarkLockUnlock: an uncontended lock and unlock on an in-process
// etcd, without an observer, with one that does nothing (the cost of
// delivering events), and with this package's, making spans (kept in
// memory) and metrics (read by a manual reader) of every call:
//
//	go test -run '^$' -bench LockUnlock -count 10 ./otel | benchstat -col /observer -
func BenchmarkLockUnlock(b *testing.B) {
	srv := etcdtest.Start(b)
	client := srv.Client(b)
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	for _, c := range []struct {
		name string
		opts []etcdlock.SessionOption
	}{
		{"observer=none", nil},
		{"observer=noop", []etcdlock.SessionOption{etcdlock.WithObserver(etcdlock.ObserverFunc(func(etcdlock.Event) {}))}},
		{"observer=otel", []etcdlock.SessionOption{etcdlock.WithObserver(etcdlockotel.New(etcdlockotel.WithTracerProvider(tp), etcdlockotel.WithMeterProvider(mp)))}},
	} {
		b.Run(c.name, func(b *testing.B) {
			s, err := etcdlock.NewSession(client, c.opts...)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			m := etcdlock.NewMutex(s, "bench/"+c.name)
			ctx := context.Background()
			for b.Loop() {
				if err := m.LockContext(ctx); err != nil {
					b.Fatal(err)
				}
				if err := m.UnlockContext(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
