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

// WithTTL sets the lease TTL, rounded up to whole seconds (etcd may raise
// it): how long the lock stays taken after this process dies or is cut off,
// and how long a holder may believe it holds a lock it has lost.
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

// WithLease makes the Session adopt an existing lease, to take back after a
// restart a lock whose key is still attached to it (ErrSessionExpired if it
// is gone). Never share a lease between processes: etcd sees one holder.
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
// without etcd, at most n times in a row (default 0): other processes wait
// for at most n+1 local holds. The key and token go on, so a resource fenced
// on tokens cannot tell those goroutines apart.
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

// WithRenewal makes a Session that outlives its leases, for a long-running
// service. When its lease is lost, every hold on it is lost as without
// WithRenewal (its Done closes before the lease can expire), and the Session
// revokes the old lease and grants a new one in the background, with backoff
// (docs/design.md §9). Meanwhile Lock blocks, TryLock returns false, and the
// context methods wait for the new lease (bounded by ctx and TryLockFor's
// wait), or return ErrSessionExpired where they were under way on the lost
// lease or none came (at once for a try). Its Done closes only at Close, the
// end of the WithContext context, or when the client is closed.
func WithRenewal() SessionOption {
	return sessionOptionFunc(func(o *sessionOptions) { o.renew = true })
}

// WithMaxHold caps every hold of the Session (of every kind, and Do's and
// Lead's) at d from its acquisition (default: no cap), for a holder that may
// hang: once d has passed, the hold's Done closes (HoldLost, LossMaxHold),
// and then its key is deleted, fenced on its token, so that the next in the
// queue holds; the holder's unlock returns ErrLockLost, and Do and Lead see
// f's context cancelled. A hold ended before d is not touched. d <= 0:
// NewSession returns ErrInvalidArgument.
//
// A cap makes a lock safe only with fencing: a holder that hangs past d and
// then writes is no longer alone, so the resource must refuse its token or
// the write be guarded by IsOwner. A hold handed on within the Session
// (WithLocalHandoff) counts d from the hand-off. With a cap, the lease
// term's loss watch watches the hold from its acquisition, as Done does.
func WithMaxHold(d time.Duration) SessionOption {
	return positive("max hold", d, func(o *sessionOptions) *time.Duration { return &o.maxHold })
}

// WithWatchdog makes Do and Lead on the Session watch their f (default: no
// watchdog), as client-go's HealthzAdaptor does for its elector: f reports
// progress with Progress(ctx); when it has not for period, f's context is
// cancelled, the lock is released once f returns, and Do returns
// ErrStalled; Lead campaigns again. If f has still not returned period after
// that, the Session is closed, which revokes its lease and so frees every
// lock of the Session for others; Do and Lead then return ErrStalled when f
// returns. A period starts when f does. period <= 0: NewSession and Lead
// return ErrInvalidArgument.
func WithWatchdog(period time.Duration) SessionOption {
	return positive("watchdog period", period, func(o *sessionOptions) *time.Duration { return &o.watchdog })
}

// WithLockDelay makes an acquisition of the Session that waited wait d more
// before it returns (default: none), where a key that was ahead of it in the
// queue went with its lease (expired or revoked: a holder that crashed, or
// was cut off) rather than by an unlock: a holder that was only cut off has
// that long to see its loss, as Chubby's and Consul's lock-delay give. A
// clean unlock hands off at once. The acquisition holds (its key is the
// holder's) during the delay, and its hold is made before it: a cap
// (WithMaxHold) counts from the hold, and a loss during the delay (the key
// deleted, the lease gone or silent, the cap reached) ends the acquisition
// with ErrLockLost, wrapped, its key deleted; if ctx ends meanwhile, it
// deletes its key and returns ctx.Err(). TryLockFor's wait does not bound
// the delay: ctx does.
//
// How it tells them apart: once it holds, it reads the queue as it was when
// its key was put (one read at that revision) and asks etcd whether the
// lease of each key ahead still exists (LeaseTimeToLive): an unlock deletes
// the key and leaves the lease, a crash takes the lease with it. Where it
// cannot tell (the revision compacted, etcd not answering, a holder that
// unlocked and then revoked its lease, as Close does, before the question),
// it delays: it never skips the delay after a crash it could have seen. A key
// deleted while its lease lives (an unlock, or Release by hand) is no crash. An
// acquisition that did not wait (no key ahead when it queued) is not
// delayed, even right after a crash. d <= 0: NewSession returns
// ErrInvalidArgument.
func WithLockDelay(d time.Duration) SessionOption {
	return positive("lock delay", d, func(o *sessionOptions) *time.Duration { return &o.lockDelay })
}

// WithObserver adds o to the Session's observers; package
// etcdlock/prometheus makes metrics of them.
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
