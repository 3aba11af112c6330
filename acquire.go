package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock/internal/queue"
)

// The one acquisition path of every primitive, and the cleanup policy of
// its key: the queue (internal/queue) puts, waits and deletes; this file
// decides when, on which context, and what a failure means to the caller.

const (
	// abortTimeout bounds the cleanup of a call that returns without the
	// lock. With the queue's reply grace (250 ms), LockContext returns
	// within its deadline + 1 s.
	abortTimeout = 500 * time.Millisecond
	// unlockTimeout bounds the delete of a release.
	unlockTimeout = 3 * time.Second
	// retryTimeout bounds each background retry of a delete.
	retryTimeout = 2 * time.Second
)

// How long an acquisition waits for the holders to leave.
const (
	waitForever = queue.WaitForever // until held, or ctx ends
	tryOnly     = queue.TryOnly     // not at all, and write nothing if blocked
)

// A ticket is one acquisition's key in a lock's queue, as the Session sees
// it: the queue's ticket, the Session whose lease it is put with, and the
// lock's name and kind, for observers and errors.
type ticket struct {
	*queue.Ticket
	s    *Session
	lock string
	kind Kind
}

// newTicket returns a ticket for key, with value, in the queue of the lock
// name, of kind kind (KindMutex...), under rule r.
func (s *Session) newTicket(name string, kind Kind, r *queue.Rule, key, value string) *ticket {
	marker := fmt.Sprintf("%s\x00etcdlock/%x-%x", name, s.Lease(), s.seq.Add(1))
	return &ticket{Ticket: queue.NewTicket(s.conn, r, key, value, marker), s: s, lock: name, kind: kind}
}

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
	a := s.events.startAcquire(c.t.kind, c.t.lock)
	opCtx, cancel := s.opContext(ctx, c.wait)
	defer cancel()
	fail := func(t *ticket, contended bool, err error) (*hold, error) {
		err = failure(ctx, opCtx, s, c.t.lock, err)
		reported := err
		if errors.Is(err, errBusy) {
			reported = nil
		}
		a.end(t, false, contended, c.wait, reported)
		return nil, err
	}
	var queued bool
	if c.turn != nil {
		h, contended, err := c.turn(opCtx)
		switch {
		case err != nil:
			return fail(nil, contended, err)
		case h != nil:
			if c.grant != nil {
				c.grant(h)
			}
			a.end(h.t, true, contended, c.wait, nil)
			return h, nil
		}
		queued = contended
	}
	t := c.t
	if err := t.Acquire(opCtx, c.wait); err != nil {
		t.abort(opCtx, c.then)
		return fail(t, queued || t.Contended(), err)
	}
	h := t.newHold()
	if c.grant != nil {
		c.grant(h)
	}
	a.end(t, true, queued || t.Contended(), c.wait, nil)
	return h, nil
}

// startable returns the error that ends an acquisition before it starts:
// ctx's, or ErrSessionExpired.
func startable(ctx context.Context, s *Session) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.expired() {
		return ErrSessionExpired
	}
	return nil
}

// failure returns the error of an acquisition of the lock name that did not
// take the lock: errBusy where a try or the wait (opCtx's own deadline) ran
// out, which each primitive reports its own way; else the caller's context's
// error; else ErrSessionExpired; else err, wrapped with the lock's name
// unless it is ErrLimitMismatch. An etcd error that came as the wait ran out
// is that error: only the end of opCtx itself is the wait running out.
func failure(ctx, opCtx context.Context, s *Session, name string, err error) error {
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case s.expired() || errors.Is(err, rpctypes.ErrLeaseNotFound):
		return ErrSessionExpired
	case errors.Is(err, errBusy),
		errors.Is(opCtx.Err(), context.DeadlineExceeded) && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)):
		return errBusy
	case errors.Is(err, ErrLimitMismatch):
		return err
	}
	return errorf("lock", name, err)
}

// abort removes our key after a failed acquisition, if it may be in etcd, on
// a context detached from ctx and bounded; then runs when that is done. Where
// etcd does not confirm the delete, it is retried in the background, and then
// runs only after it succeeded or the Session ended.
func (t *ticket) abort(ctx context.Context, then func()) {
	if t.MayBeInEtcd() && !t.s.expired() {
		if _, err := t.release(ctx, abortTimeout); err != nil {
			t.releaseLater(then)
			return
		}
	}
	if then != nil {
		then()
	}
}

// release deletes our key (queue.Ticket.Delete) on a context detached from
// ctx and bounded by timeout. It reports whether a key was deleted.
func (t *ticket) release(ctx context.Context, timeout time.Duration) (bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	return t.Delete(ctx)
}

// releaseLater retries the delete of our key in the background, with
// backoff, until it succeeds or the Session ends (which ends an attempt
// under way too: the revoke deletes the key anyway), then runs then (which
// may be nil).
func (t *ticket) releaseLater(then func()) {
	sctx := t.s.cs.Ctx()
	ok := t.s.goBackground(func() {
		if then != nil {
			defer then()
		}
		for b := newBackoff(); b.wait(sctx) == nil; {
			ctx, cancel := context.WithTimeout(sctx, retryTimeout)
			_, err := t.Delete(ctx)
			cancel()
			if err == nil {
				return
			}
		}
	})
	if !ok && then != nil {
		then()
	}
}

// unlock releases the key of hold h (ended already): it returns nil when it
// was deleted, ErrSessionExpired or ErrLockLost when it was already gone, and
// etcd's error, wrapped, when etcd did not confirm the delete; the delete is
// then retried in the background, and then runs after it. Otherwise then
// runs before unlock returns.
func (t *ticket) unlock(ctx context.Context, h *hold, then func()) error {
	h.reportEnd()
	if t.s.expired() {
		t.released(false, nil)
		if then != nil {
			then()
		}
		return ErrSessionExpired
	}
	deleted, err := t.release(ctx, unlockTimeout)
	t.released(deleted, err)
	if err != nil {
		t.releaseLater(then)
		return errorf("unlock", t.lock, err)
	}
	if then != nil {
		then()
	}
	if !deleted {
		if t.s.expired() {
			return ErrSessionExpired
		}
		return ErrLockLost
	}
	return nil
}

// ownerCmp returns a comparison for a clientv3 Txn that is true only while
// key exists with create revision rev; with rev 0 (nothing held), one that is
// always false.
func ownerCmp(key string, rev int64) clientv3.Cmp {
	if key == "" || rev == 0 {
		// No key has a negative create revision.
		key, rev = "\x00etcdlock/not-held", -1
	}
	return clientv3.Compare(clientv3.CreateRevision(key), "=", rev)
}
