package etcdlock

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/etcdlock/etcdlock/internal/queue"
)

// The one acquisition path of every primitive: what it reports, how long it
// may take, and what a failure means to the caller. The key's own cleanup is
// the ticket's (ticket.go).

// How long an acquisition waits for the holders to leave.
const (
	waitForever = queue.WaitForever // until held, or ctx ends
	tryOnly     = queue.TryOnly     // not at all, and write nothing if blocked
)

// A claim is what a primitive asks of the acquisition path.
type claim struct {
	t    *ticket
	wait time.Duration // waitForever, tryOnly, or at most that long
	// turn, if not nil, runs first, bounded as the acquisition is: a
	// Mutex's turn among the goroutines of its process. It returns a hold
	// handed on by another goroutine (t is then not used), or errBusy, or
	// (nil, nil) to go on with t; contended says whether it waited.
	turn func(ctx context.Context) (h *keyHold, contended bool, err error)
	// then runs once a failed acquisition's key is gone from etcd, or its
	// delete has given up (a Mutex passes its turn on); may be nil.
	then func()
	// grant records the new hold before the call is reported; may be nil.
	grant func(*keyHold)
}

// acquire is the acquisition path of every primitive: it reports the call
// to the observers from its start to its end, bounds it by its lease term,
// runs c.turn, acquires c.t, and returns the new hold. c.wait bounds only
// the time spent waiting for others (in this process, then in etcd), not
// the requests to etcd, which ctx bounds. On failure it leaves no key of c.t
// in etcd, or hands its delete to a background retry, and returns errBusy
// where the try or the wait ran out while others held or waited ahead (each
// primitive says that its own way), else the error failure maps.
func (s *Session) acquire(ctx context.Context, c claim) (*keyHold, error) {
	c.t.capBy(ctx)
	a := s.events.startAcquire(ctx, c.t.kind, c.t.lock, c.t.term.id)
	opCtx, cancel := opContext(ctx, c.t.term)
	defer cancel()
	fail := func(contended bool, err error) (*keyHold, error) {
		err = failure(ctx, c.t.term, c.t.lock, err)
		reported := err
		if errors.Is(err, errBusy) {
			reported = nil
		}
		a.end("", 0, false, contended, c.wait, reported)
		return nil, err
	}
	var queued bool
	wait := c.wait
	if c.turn != nil {
		start := time.Now()
		tctx, tcancel := opCtx, context.CancelFunc(func() {})
		if wait > 0 {
			tctx, tcancel = context.WithTimeout(opCtx, wait)
		}
		h, contended, err := c.turn(tctx)
		tcancel()
		if wait > 0 {
			wait = max(wait-time.Since(start), time.Nanosecond)
		}
		switch {
		case err != nil:
			return fail(contended, err)
		case h != nil:
			h.acquired(ctx)
			if c.grant != nil {
				c.grant(h)
			}
			a.end(h.t.Key(), h.token(), true, contended, c.wait, nil)
			return h, nil
		}
		queued = contended
	}
	t := c.t
	if err := t.Acquire(opCtx, wait); err != nil {
		t.abort(opCtx, c.then)
		return fail(queued || t.Contended(), err)
	}
	h := t.newHold()
	h.acquired(ctx)
	if err := t.lockDelay(opCtx, h); err != nil {
		h.end()
		t.abort(opCtx, c.then)
		return fail(true, err)
	}
	if c.grant != nil {
		c.grant(h)
	}
	a.end(t.Key(), t.Rev(), true, queued || t.Contended(), c.wait, nil)
	return h, nil
}

// failure returns the error of an acquisition of the lock name that did not
// take the lock: the caller's context's error where it ended; else
// ErrSessionExpired where the lease tm is gone; else errBusy where a try
// found others ahead, or the wait ran out while others held or waited
// ahead, which each primitive reports its own way; else err, wrapped with
// the lock's name unless it is ErrLimitMismatch.
func failure(ctx context.Context, tm *leaseTerm, name string, err error) error {
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case tm.Expired() || errors.Is(err, rpctypes.ErrLeaseNotFound):
		return ErrSessionExpired
	case errors.Is(err, errBusy):
		return errBusy
	case errors.Is(err, ErrLimitMismatch):
		return err
	}
	return errorf("lock", name, err)
}
