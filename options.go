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

// A SessionOption configures NewSession.
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

// WithTTL sets the lease TTL, in whole seconds (etcd may raise it): how long a
// lock stays taken after this process dies or is cut off, and how long a holder
// may believe it holds a lock it has lost.
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

// WithLease makes the Session adopt a lease, to take back after a restart a
// lock whose key is still on it (ErrSessionExpired if it is gone). Never
// share a lease between processes: etcd sees one holder.
func WithLease(id clientv3.LeaseID) SessionOption {
	return sessionOptionFunc(func(o *sessionOptions) {
		if id <= 0 {
			o.invalid("lease ID must be positive, got %d", id)
			return
		}
		o.lease = id
	})
}

// WithContext ties the Session to ctx: NewSession's RPCs use it, and its
// end ends the Session as Close does.
func WithContext(ctx context.Context) SessionOption {
	return sessionOptionFunc(func(o *sessionOptions) {
		if ctx == nil {
			o.invalid("nil context")
			return
		}
		o.ctx = ctx
	})
}

// WithLocalHandoff lets a lock pass to the Session's next waiting goroutine
// without etcd, at most n times in a row (default 0): other processes wait for
// at most n+1 local holds. Key and token go on, the same for those goroutines.
func WithLocalHandoff(n int) SessionOption {
	return sessionOptionFunc(func(o *sessionOptions) {
		if n < 0 {
			o.invalid("hand-off count must not be negative, got %d", n)
			return
		}
		o.handoffs = n
	})
}

// WithIdentity sets the value of every key the Session puts (default ""),
// which Inspect shows: name the process, and put no secret in it.
func WithIdentity(id string) SessionOption {
	return sessionOptionFunc(func(o *sessionOptions) { o.identity = id })
}

// WithRenewal makes a Session that outlives its leases: a lost lease loses its
// holds, and a new one is granted in the background (docs/design.md §9), for
// which Lock and the context methods wait (bounded by ctx and TryLockFor's
// wait; ErrSessionExpired if under way on the lost lease, or none came, or for
// a try). TryLock returns false. Its Done closes only at Close, the WithContext
// context's end or its client's close.
func WithRenewal() SessionOption {
	return sessionOptionFunc(func(o *sessionOptions) { o.renew = true })
}

// WithMaxHold caps every hold of the Session (of every kind, Do's and Lead's
// too) at d from its acquisition (default: no cap), for a holder that may
// hang, as the package doc says (For the people on call); safe only with
// fencing. d <= 0: NewSession returns ErrInvalidArgument.
func WithMaxHold(d time.Duration) SessionOption {
	return positive("max hold", d, func(o *sessionOptions) *time.Duration { return &o.maxHold })
}

// WithWatchdog makes Do and Lead on the Session watch their f with period
// (default: none), as client-go's HealthzAdaptor does for its elector and as
// the package doc says (For jobs): Do then returns ErrStalled; Lead campaigns
// again, and returns ErrStalled where it closed the Session. A period starts
// when f does. period <= 0: NewSession and Lead return ErrInvalidArgument.
func WithWatchdog(period time.Duration) SessionOption {
	return positive("watchdog period", period, func(o *sessionOptions) *time.Duration { return &o.watchdog })
}

// WithLockDelay makes an acquisition that waited behind a key gone with its
// lease (a holder crashed or cut off) hold d more before it returns, as
// Chubby's lock-delay: a holder cut off has that long to see its loss. Not
// after an unlock, a delete, or no wait; where etcd cannot tell, it delays
// (docs/design.md §11). The hold comes first: a cap counts from it; a loss,
// or ctx's end (not TryLockFor's wait), ends the delay (ErrLockLost, wrapped,
// or ctx.Err()), deleting the key. d <= 0: NewSession returns
// ErrInvalidArgument.
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

// WithLogger logs the Session's events to l (losses and failures at Warn or
// Error, the rest at Debug), without the keys' values (identities).
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
