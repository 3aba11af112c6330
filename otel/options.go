package etcdlockotel

import (
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// An Option configures an Observer.
type Option interface {
	apply(*options)
}

type options struct {
	tp        trace.TracerProvider
	mp        metric.MeterProvider
	lockAttr  bool
	nilOption bool
}

type optionFunc func(*options)

func (f optionFunc) apply(o *options) { f(o) }

// WithTracerProvider makes the Observer's spans with a tracer of tp
// (default: none, no span). A nil tp is an error (Observer.Err).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(o *options) {
		o.tp = tp
		o.nilOption = o.nilOption || tp == nil
	})
}

// WithMeterProvider makes the Observer's metrics with a meter of mp
// (default: none, no metric). A nil mp is an error (Observer.Err).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(o *options) {
		o.mp = mp
		o.nilOption = o.nilOption || mp == nil
	})
}

// WithLockAttribute adds the lock's name, etcdlock.lock.name, to the
// metrics that have etcdlock.lock.kind (default: not, since names made at
// run time make a series each). Spans always have it.
func WithLockAttribute() Option {
	return optionFunc(func(o *options) { o.lockAttr = true })
}
