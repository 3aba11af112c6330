package etcdlock

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Lead runs f whenever this process leads name, until ctx ends: the
// primary/backup duty of a long-running service.
//
// It campaigns in FIFO order on the Mutex queue of name (so Inspect,
// etcdlock holders, concurrency.Mutex and etcdctl lock see the leader), runs
// f as Mutex.Do does while it leads, and after f returns campaigns again.
// f's context is cancelled when ctx ends or the lead is lost or about to be
// (our key deleted, the lease revoked or expired, keep-alives silent for 2/3
// of the TTL): f must then return promptly. Lead never releases the lock
// while f runs, so two processes' f never run while both their keys are the
// oldest, and a process's f stops before the lease can expire.
//
// f returning nil, or returning after its context was cancelled by a loss,
// is not a failure: Lead releases the lock (if still held) and campaigns
// again, on a new Session when the old lease is gone. It pauses before each
// new campaign, so that an f that returns at once does not make Lead spin
// against etcd: 50 ms, doubling to 1 s while terms keep ending within 1 s of
// their campaign, and 50 ms again after a longer one.
//
// Lead returns ctx.Err() when ctx ends, or f's error when f fails for a
// reason other than the loss of the lock. If f panics, Lead releases the
// lock, closes its Session and panics again. The Session it made is closed
// on every way out.
//
// A Session that cannot be made (etcd unreachable, say) is tried again with
// backoff (50 ms doubling to 1 s); each failure is reported to the
// observers of WithObserver and WithLogger as a SessionFailed event, from
// Lead's own goroutine (there is no Session to deliver it). Campaigns that
// fail on a Session are reported as every acquisition is.
//
// The options are those of NewSession (WithTTL, WithIdentity, ...), except
// two that Lead refuses with ErrInvalidArgument, before it runs f: WithLease,
// since Lead makes a new Session on a new lease when the lease is gone and
// a lease of the caller's is gone after one term; and WithContext, since
// the end of that context would revoke the lease while f still runs (end
// ctx instead: Lead waits for f).
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

// Lead runs f whenever this process leads name, until ctx ends, as the
// function Lead does, but on s: its lease, identity, logger and observers,
// shared with the process's other locks. A Session made WithRenewal
// outlives its leases: when one is lost, f's context is cancelled and Lead
// campaigns again on the next. On a Session without WithRenewal, Lead
// returns ErrSessionExpired once the lease is gone.
//
// Lead returns ctx.Err() when ctx ends, f's error when f fails for a reason
// other than the loss of the lock, ErrSessionExpired when s has ended, and
// ErrInvalidArgument or ErrInvalidName for bad input. Failed campaigns
// (etcd unreachable) are retried with backoff, and reported to the
// observers as every acquisition is; terms are paced as the function Lead
// paces them. It does not close s. If f panics, Lead releases the lock and
// panics again.
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
		o := m.do(ctx, f)
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
		case o.err != nil && !o.lost:
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
