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
	turn func(ctx context.Context) (h *hold, contended bool, err error)
	// then runs once a failed acquisition's key is gone from etcd, or its
	// delete has given up (a Mutex passes its turn on); may be nil.
	then func()
	// grant records the new hold before the call is reported; may be nil.
	grant func(*hold)
}

// acquire is the acquisition path of every primitive: it reports the call
// to the observers from its start to its end, bounds it by c.wait and by
// the Session's life, runs c.turn, acquires c.t, and returns the new hold.
// On failure it leaves no key of c.t in etcd, or hands its delete to a
// background retry, and returns errBusy where the try or the wait ran out
// (each primitive says that its own way), else the error failure maps.
func (s *Session) acquire(ctx context.Context, c claim) (*hold, error) {
	a := s.events.startAcquire(c.t.kind, c.t.lock, c.t.term.id)
	opCtx, cancel := opContext(ctx, c.t.term, c.wait)
	defer cancel()
	fail := func(contended bool, err error) (*hold, error) {
		err = failure(ctx, opCtx, c.t.term, c.t.lock, err)
		reported := err
		if errors.Is(err, errBusy) {
			reported = nil
		}
		a.end("", 0, false, contended, c.wait, reported)
		return nil, err
	}
	var queued bool
	if c.turn != nil {
		h, contended, err := c.turn(opCtx)
		switch {
		case err != nil:
			return fail(contended, err)
		case h != nil:
			if c.grant != nil {
				c.grant(h)
			}
			a.end(h.t.Key(), h.token(), true, contended, c.wait, nil)
			return h, nil
		}
		queued = contended
	}
	t := c.t
	if err := t.Acquire(opCtx, c.wait); err != nil {
		t.abort(opCtx, c.then)
		return fail(queued || t.Contended(), err)
	}
	h := t.newHold()
	if c.grant != nil {
		c.grant(h)
	}
	a.end(t.Key(), t.Rev(), true, queued || t.Contended(), c.wait, nil)
	return h, nil
}

// failure returns the error of an acquisition of the lock name that did not
// take the lock: errBusy where a try or the wait (opCtx's own deadline) ran
// out, which each primitive reports its own way; else the caller's context's
// error; else ErrSessionExpired where the lease tm is gone; else err, wrapped with the lock's name
// unless it is ErrLimitMismatch. An etcd error that came as the wait ran out
// is that error: only the end of opCtx itself is the wait running out.
func failure(ctx, opCtx context.Context, tm *leaseTerm, name string, err error) error {
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case tm.Expired() || errors.Is(err, rpctypes.ErrLeaseNotFound):
		return ErrSessionExpired
	case errors.Is(err, errBusy),
		errors.Is(opCtx.Err(), context.DeadlineExceeded) && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)):
		return errBusy
	case errors.Is(err, ErrLimitMismatch):
		return err
	}
	return errorf("lock", name, err)
}
