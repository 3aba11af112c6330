package etcdlock

import (
	"context"
	"strings"
	"time"

	"github.com/etcdlock/etcdlock/internal/queue"
)

// A ticket is the Session's side of one key in a lock's queue: the queue
// (internal/queue) puts, waits and deletes; this file decides on which
// context a delete runs, how long it may take, and when it is retried in
// the background.

const (
	// abortTimeout bounds the cleanup of a call that returns without the
	// lock. With the queue's reply grace (250 ms), LockContext returns
	// within its deadline + 1 s.
	abortTimeout = 500 * time.Millisecond
	// unlockTimeout bounds the delete of a release.
	unlockTimeout = 3 * time.Second
)

// A ticket is one acquisition's key in a lock's queue, as the Session sees
// it: the queue's ticket, the Session whose lease it is put with, and the
// lock's name and kind, for observers and errors.
type ticket struct {
	*queue.Ticket
	s    *Session
	term *leaseTerm // the lease our key is put with
	lock string
	kind Kind
	// turn, if not nil, is the turn of this process that our key is (a
	// Mutex's, a MultiMutex's), which waits for the key's delete.
	turn turnKeeper
	// maxHold caps the holds of our key (maxhold.go): the Session's
	// WithMaxHold, or a lesser CapHold of the acquisition's context; 0, no
	// cap. Set before the acquisition starts.
	maxHold time.Duration
}

// A turnKeeper is a turn of this process that waits for the delete of a
// key: told when the delete goes on in the background, so that a call that
// finds the turn taken can tell that wait from another holder.
type turnKeeper interface {
	retrying(err error)
}

// newTicket returns a ticket for key, put with the lease of tm, with value,
// in the queue of the lock name, of kind kind (KindMutex...), under rule r.
func (s *Session) newTicket(tm *leaseTerm, name string, kind Kind, r *queue.Rule, key, value string) *ticket {
	return &ticket{Ticket: queue.NewTicket(tm.conn, r, key, value), s: s, term: tm, lock: name, kind: kind, maxHold: s.maxHold}
}

// newGroupTicket returns one ticket for the Mutex keys of names (sorted),
// with the lease of tm, in the queues of rules (one per name): a
// MultiMutex's acquisition.
func (s *Session) newGroupTicket(tm *leaseTerm, names []string, rules []*queue.Rule) *ticket {
	slots := make([]queue.Slot, len(names))
	for i, name := range names {
		slots[i] = queue.Slot{Rule: rules[i], Key: mutexKey(name, tm.id), Value: s.identity}
	}
	return &ticket{Ticket: queue.NewGroup(tm.conn, slots...), s: s, term: tm, lock: strings.Join(names, ","), kind: KindMulti, maxHold: s.maxHold}
}

// abort removes our key after a failed acquisition, if it may be in etcd, on
// a context detached from ctx and bounded; then runs when that is done. Where
// etcd does not confirm the delete, it is retried in the background, and then
// runs only after it succeeded or the lease ended.
func (t *ticket) abort(ctx context.Context, then func()) {
	if t.MayBeInEtcd() && !t.term.Expired() {
		if _, err := t.release(ctx, abortTimeout); err != nil {
			t.releaseLater(err, then)
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
// backoff, until it succeeds or its lease ends (which ends an attempt under
// way too: the revoke of the lease, by Close or renew, or its expiry deletes
// the key anyway), then runs then (which may be nil). The retries of a
// Session share one goroutine, however many deletes wait. err is why the
// delete was not confirmed.
func (t *ticket) releaseLater(err error, then func()) {
	if t.turn != nil {
		t.turn.retrying(err)
	}
	t.deleteLater(then)
}

// deleteLater is releaseLater without telling the turn: for a delete while
// the holder still has the turn (a capped hold's), whose unlock ends it.
func (t *ticket) deleteLater(then func()) {
	t.s.retries.add(t.s, retry{term: t.term, del: func(ctx context.Context) error {
		_, err := t.Delete(ctx)
		return err
	}, then: then})
}

// released reports the delete of our key in t: deleted, or found gone, or
// failed with err.
func (t *ticket) released(deleted bool, err error) {
	if t.s.events != nil {
		t.s.events.emit(Event{Kind: Released, Lock: t.lock, Primitive: t.kind, Lease: t.term.id, Key: t.Key(), Token: t.Rev(), Err: err, FencedMiss: err == nil && !deleted})
	}
}
