package etcdlock

import (
	"context"
	"errors"
	"fmt"

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
// again at once, on a new Session when the old lease is gone. Lead returns
// ctx.Err() when ctx ends, or f's error when f fails for a reason other
// than the loss of the lock; the Session it made is closed by then. The
// options are those of NewSession (WithTTL, WithIdentity, ...).
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
	backoff := newBackoff()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		// Not WithContext(ctx): its cancel would revoke the lease, and so
		// release the lock, while f may still run.
		s, err := newSession(ctx, client, opts...)
		switch {
		case errors.Is(err, ErrInvalidArgument):
			return err
		case err != nil:
			if err := backoff.wait(ctx); err != nil {
				return err
			}
			continue
		}
		err = leadOn(ctx, s, name, f)
		_ = s.Close()
		if err != nil {
			return err
		}
		backoff.reset()
	}
}

// leadOn campaigns and leads on s until s ends (it returns nil: campaign
// again on a new Session), ctx ends, or f fails.
func leadOn(ctx context.Context, s *Session, name string, f func(ctx context.Context) error) error {
	m := NewMutex(s, name)
	backoff := newBackoff()
	for {
		o := m.do(ctx, f)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case s.expired():
			return nil
		case !o.ran:
			// etcd unreachable, or a malformed reply: campaign again soon.
			if err := backoff.wait(ctx); err != nil {
				return err
			}
			continue
		case o.err != nil && !o.lost:
			return o.err
		}
		backoff.reset()
	}
}
