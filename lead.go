package etcdlock

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Lead runs f whenever this process leads name, until ctx ends: it
// campaigns on the Mutex queue of name (which LeaderOf reads), runs f as
// Mutex.Do does, and campaigns again when f returns, after a pause
// (docs/design.md §6). f's context is cancelled before the lease can expire,
// and Lead never releases the lock while f runs: two processes' f never run
// while both their keys are the oldest. Lead returns ctx.Err() when ctx ends,
// or f's error when f fails for another reason than a loss. If f panics, it
// releases the lock and panics again. It closes its Session (made with opts,
// WithRenewal) on every way out, and refuses WithLease and WithContext
// (ErrInvalidArgument): end ctx instead. Failures are retried with backoff,
// and reported to the observers. WithWatchdog, an f that reports no progress
// gives up the lead: Lead campaigns again once f returns, and returns
// ErrStalled where f did not return in time and the Session was closed.
func Lead(ctx context.Context, client *clientv3.Client, name string, f func(ctx context.Context) error, opts ...SessionOption) error {
	switch {
	case ctx == nil:
		return fmt.Errorf("%w: nil context", ErrInvalidArgument)
	case client == nil:
		return fmt.Errorf("%w: nil client", ErrInvalidArgument)
	case f == nil:
		return fmt.Errorf("%w: nil function", ErrInvalidArgument)
	case name == "":
		return ErrInvalidName
	}
	o := options(opts)
	switch {
	case o.err != nil:
		return o.err
	case o.lease != clientv3.NoLease:
		return fmt.Errorf("%w: Lead does not take WithLease: it needs a new lease whenever the lease is gone, and a lease of the caller's is gone after one term", ErrInvalidArgument)
	case o.ctx != nil:
		return fmt.Errorf("%w: Lead does not take WithContext: the end of that context would revoke the lease while f still runs; end Lead's ctx instead", ErrInvalidArgument)
	}
	retry := newBackoff() // after a Session that could not be made
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		// Not WithContext(ctx): its cancel would revoke the lease, and so
		// release the lock, while f may still run.
		s, err := newSession(ctx, client, append(opts, WithRenewal())...)
		if err != nil {
			if ctx.Err() == nil {
				// No Session, so no dispatch: the observers hear it from
				// Lead's own goroutine, so that an endpoint that never
				// answers does not look like a backup never elected.
				e := Event{Kind: SessionFailed, Time: time.Now(), Lock: name, Primitive: KindMutex, Err: err}
				for _, ob := range o.observers {
					ob.Observe(e)
				}
			}
			if err := retry.wait(ctx); err != nil {
				return err
			}
			continue
		}
		defer func() { _ = s.Close() }()
		return s.lead(ctx, name, f)
	}
}

// Lead runs f whenever this process leads name, as the function Lead does,
// but on s. It does not close s, and returns ErrSessionExpired once s has
// ended (without WithRenewal, when its lease is gone).
func (s *Session) Lead(ctx context.Context, name string, f func(ctx context.Context) error) error {
	if err := validate(s != nil, name, ctx); err != nil {
		return err
	}
	if f == nil {
		return fmt.Errorf("%w: nil function", ErrInvalidArgument)
	}
	return s.lead(ctx, name, f)
}

// lead campaigns and leads on s until ctx ends, f fails, or s ends, pausing
// between campaigns: 50 ms, doubling to 1 s while terms keep ending within
// 1 s of their campaign.
func (s *Session) lead(ctx context.Context, name string, f func(ctx context.Context) error) error {
	m := NewMutex(s, name)
	pace := newBackoff()  // between campaigns
	retry := newBackoff() // after a campaign that failed
	for {
		start := time.Now()
		o := m.do(ctx, waitForever, f)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case !o.ran && !s.lockable(o.err):
			return o.err
		case !o.ran:
			// etcd unreachable, a malformed reply, or the lease lost
			// (WithRenewal: the next campaign waits for the next one):
			// campaign again soon.
			if err := retry.wait(ctx); err != nil {
				return err
			}
			continue
		case o.closed:
			return fmt.Errorf("%w: lead %q: f did not return within the period after its context was cancelled: the session was closed", ErrStalled, name)
		case o.err != nil && !o.lost && !o.stalled:
			return o.err
		}
		retry.reset()
		// A term ended. A campaign and term longer than the longest pause
		// are no spin: the next pause is the first.
		if time.Since(start) > maxBackoff {
			pace.reset()
		}
		if err := pace.wait(ctx); err != nil {
			return err
		}
		if s.ended() {
			return ErrSessionExpired
		}
	}
}
