package etcdlock

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The options of NewSession (and of Lead, which makes its Session with
// them).

// DefaultTTL is the lease TTL of a Session made without WithTTL.
const DefaultTTL = 60 * time.Second

// A SessionOption configures NewSession; an invalid one (a duration or count
// out of range) makes NewSession return ErrInvalidArgument.
type SessionOption interface {
	apply(*sessionOptions)
}

type sessionOptions struct {
	ttl       time.Duration
	lease     clientv3.LeaseID
	ctx       context.Context
	handoffs  int
	identity  string
	renew     bool
	maxHold   time.Duration
	watchdog  time.Duration
	lockDelay time.Duration
	observers []Observer
	err       error
}

type sessionOptionFunc func(*sessionOptions)

func (f sessionOptionFunc) apply(o *sessionOptions) { f(o) }

func (o *sessionOptions) invalid(format string, args ...any) {
	if o.err == nil {
		o.err = fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
	}
}

// WithTTL sets the lease TTL in whole seconds (etcd may raise it): how long a
// lock outlives a dead or cut-off holder, who may believe it holds it.
func WithTTL(ttl time.Duration) SessionOption {
	return positive("TTL", ttl, func(o *sessionOptions) *time.Duration { return &o.ttl })
}

// positive returns an option that sets the duration that field points to
// to d, or, where d is not positive, makes the options invalid, naming what.
func positive(what string, d time.Duration, field func(*sessionOptions) *time.Duration) SessionOption {
	return sessionOptionFunc(func(o *sessionOptions) {
		if d <= 0 {
			o.invalid("%s must be positive, got %v", what, d)
			return
		}
		*field(o) = d
	})
}

// WithLease adopts a lease, to take back after a restart a lock on it (gone:
// ErrSessionExpired). Never share a lease between processes.
func WithLease(id clientv3.LeaseID) SessionOption {
	return sessionOptionFunc(func(o *sessionOptions) {
		if id <= 0 {
			o.invalid("lease ID must be positive, got %d", id)
			return
		}
		o.lease = id
	})
}

// WithContext ties the Session to ctx: NewSession's RPCs; Close at its end.
func WithContext(ctx context.Context) SessionOption {
	return sessionOptionFunc(func(o *sessionOptions) {
		if ctx == nil {
			o.invalid("nil context")
			return
		}
		o.ctx = ctx
	})
}

// WithLocalHandoff lets a lock pass to the Session's next waiting goroutine,
// key and token too, without etcd, n times in a row at most (default 0).
func WithLocalHandoff(n int) SessionOption {
	return sessionOptionFunc(func(o *sessionOptions) {
		if n < 0 {
			o.invalid("hand-off count must not be negative, got %d", n)
			return
		}
		o.handoffs = n
	})
}

// WithIdentity sets every key's value (default ""), for Inspect: no secret.
func WithIdentity(id string) SessionOption {
	return sessionOptionFunc(func(o *sessionOptions) { o.identity = id })
}

// WithRenewal makes a Session that outlives its leases: a lost lease loses its
// holds, and lock calls wait for the next (TryLock: false; ErrSessionExpired
// for a try, a call under way on the lost lease, or none within ctx or wait).
// Its Done closes only at Close, WithContext's end or its client's close.
func WithRenewal() SessionOption {
	return sessionOptionFunc(func(o *sessionOptions) { o.renew = true })
}

// WithMaxHold caps the Session's holds at d (package doc: For the people on
// call), for holders that may hang; safe only with fencing.
func WithMaxHold(d time.Duration) SessionOption {
	return positive("max hold", d, func(o *sessionOptions) *time.Duration { return &o.maxHold })
}

// WithWatchdog makes Do and Lead watch f (package doc, For jobs), as client-go's
// HealthzAdaptor: Do returns ErrStalled; Lead campaigns again, or returns it if
// it closed the Session. A period starts with f.
func WithWatchdog(period time.Duration) SessionOption {
	return positive("watchdog period", period, func(o *sessionOptions) *time.Duration { return &o.watchdog })
}

// WithLockDelay makes an acquisition that waited behind a key gone with its
// lease (a crash, not an unlock or delete) hold d more, as Chubby's lock-delay,
// for a holder cut off to see its loss (in doubt, it delays: docs/design.md
// §11). A cap counts from the hold; a loss or ctx's end (not TryLockFor's
// wait) ends it: ErrLockLost, wrapped, or ctx.Err().
func WithLockDelay(d time.Duration) SessionOption {
	return positive("lock delay", d, func(o *sessionOptions) *time.Duration { return &o.lockDelay })
}

// WithObserver adds o to the Session's observers (etcdlock/prometheus).
func WithObserver(o Observer) SessionOption {
	return sessionOptionFunc(func(so *sessionOptions) {
		if o == nil {
			so.invalid("nil Observer")
			return
		}
		so.observers = append(so.observers, o)
	})
}

// WithLogger logs the events to l (losses, failures at Warn or Error, the rest
// at Debug), without the keys' values (identities).
func WithLogger(l *slog.Logger) SessionOption {
	return sessionOptionFunc(func(so *sessionOptions) {
		if l == nil {
			so.invalid("nil Logger")
			return
		}
		so.observers = append(so.observers, logObserver{l})
	})
}

// options applies opts to the defaults. The context is nil unless
// WithContext set one.
func options(opts []SessionOption) sessionOptions {
	o := sessionOptions{ttl: DefaultTTL}
	for _, opt := range opts {
		if opt == nil {
			o.invalid("nil SessionOption")
			continue
		}
		opt.apply(&o)
	}
	return o
}
