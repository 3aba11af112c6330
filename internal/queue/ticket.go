// Package queue is the wait queue in etcd that every lock of etcdlock
// shares. A queue is the keys under one prefix, ordered by create revision:
// first come, first served. A lock puts one key of its own per hold, and
// says which older keys block it (a Rule); the queue does the rest: the
// enqueue Txn, the reads, the watches, the wake-up of a semaphore's next
// waiter, and the fenced delete.
//
// The package knows etcd's KV and Watcher and the lease its keys are put
// with, and nothing of sessions, holds, observers or goroutines: a caller
// decides when a delete is retried, and what a failure means to its users.
package queue

import (
	"context"
	"errors"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// replyGrace is how long the acquire Txn may still run after the call's
// context ends, so that its outcome is known and not left to chance (D3).
const replyGrace = 250 * time.Millisecond

// How long an acquisition waits for the holders to leave.
const (
	WaitForever time.Duration = -1 // until held, or ctx ends
	TryOnly     time.Duration = 0  // not at all, and write nothing if blocked
)

// A Lease is the lease a queue's keys are put with, as the protocol needs
// it.
type Lease interface {
	// ID returns the lease's ID.
	ID() clientv3.LeaseID
	// Expired reports whether the lease is known to be gone.
	Expired() bool
	// Gone is told that etcd answered a put with "lease not found".
	Gone()
}

// A Conn is what a ticket talks to: etcd, the lease of its keys, and the
// period of the reads that catch a lost watch event.
type Conn struct {
	KV      clientv3.KV
	Watcher clientv3.Watcher
	Lease   Lease
	// TTL is how often a wait reads its place, whatever its watches say:
	// a lost event costs at most that.
	TTL time.Duration
}

// A Ticket is one key of ours in a queue, from its enqueue to its release.
//
// What the ticket knows of its key in etcd (state and rev) and the marker
// that fences its late puts are owned together: they decide which key, if
// any, a delete removes, and how.
type Ticket struct {
	c     *Conn
	rule  *Rule
	key   string
	value string
	// marker is a key of this ticket's own, outside every lock's prefix,
	// that every Txn of the ticket that may put its key requires absent;
	// the delete of an unsure put writes it, so that a put applied after
	// the delete fails (a request held up in the network, or sent to a
	// member that applies it late).
	marker    string
	state     keyState
	rev       int64 // the key's create revision, the fencing token, while state is keyPut
	contended bool  // the acquisition waited for another holder
}

// A keyState is what a ticket knows of its key in etcd.
type keyState int

const (
	keyAbsent keyState = iota // not put, or deleted: nothing to delete
	keyPut                    // put at rev, which fences its delete
	// keyUnsure: a Txn that may put the key got no reply; it may have been
	// applied, or may be yet. Only a delete that writes the marker ends it.
	keyUnsure
)

// NewTicket returns a ticket for key, with value, in the queue of rule r.
// marker must be a key of this ticket alone, outside every lock's prefix.
func NewTicket(c *Conn, r *Rule, key, value, marker string) *Ticket {
	return &Ticket{c: c, rule: r, key: key, value: value, marker: marker}
}

// Held returns a ticket for key, known to be in etcd with create revision
// rev: its delete is fenced on rev.
func Held(c *Conn, r *Rule, key string, rev int64) *Ticket {
	return &Ticket{c: c, rule: r, key: key, state: keyPut, rev: rev}
}

// Key returns the ticket's key.
func (t *Ticket) Key() string { return t.key }

// Rev returns the key's create revision, the fencing token, once the key
// is known to be put; 0 otherwise.
func (t *Ticket) Rev() int64 { return t.rev }

// Contended reports whether the acquisition found another holder first.
func (t *Ticket) Contended() bool { return t.contended }

// MayBeInEtcd reports whether the key is, or may yet be, in etcd: a failed
// acquisition must then delete it.
func (t *Ticket) MayBeInEtcd() bool { return t.state != keyAbsent }

// mayPut returns the compare every Txn that may put our key carries: our
// marker is absent, so no delete has run yet.
func (t *Ticket) mayPut() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(t.marker), "=", 0)
}

// sent records that a Txn that may put our key is about to be sent: until
// its reply comes, the key may be put.
func (t *Ticket) sent() { t.state, t.rev = keyUnsure, 0 }

// put is the Op that puts our key with the lease.
func (t *Ticket) put() clientv3.Op {
	return clientv3.OpPut(t.key, t.value, clientv3.WithLease(t.c.Lease.ID()))
}

// Acquire puts our key in the queue and waits until it holds (WaitForever),
// or until ctx ends, or not at all (TryOnly: then it writes nothing when
// blocked, and returns ErrBusy). A key deleted while it waits (by hand, or
// by a revoke the lease has yet to see) is queued again, as a new key. On
// failure the key may be in etcd (MayBeInEtcd): the caller deletes it.
func (t *Ticket) Acquire(ctx context.Context, wait time.Duration) error {
	err := t.enter(ctx, wait)
	for errors.Is(err, ErrKeyGone) && ctx.Err() == nil && !t.c.Lease.Expired() {
		// A revoked lease fails the put with ErrLeaseNotFound.
		t.state, t.rev = keyAbsent, 0
		err = t.enter(ctx, wait)
	}
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.c.Lease.Gone()
	}
	return err
}

// enter puts our key in the queue and waits for its turn.
func (t *Ticket) enter(ctx context.Context, wait time.Duration) error {
	var p place
	var err error
	if wait == TryOnly {
		p, err = t.try(ctx)
	} else {
		p, err = t.enqueue(ctx)
	}
	if err != nil {
		return err
	}
	switch {
	case p.verdict == held:
		return nil
	case p.verdict == gone:
		return ErrKeyGone
	}
	t.contended = true
	if wait == TryOnly {
		return ErrBusy
	}
	// The place came from the acquire Txn: nobody was behind us.
	if p, err = t.wait(ctx, p); err != nil {
		return err
	}
	if p.verdict == gone {
		return ErrKeyGone
	}
	if p.next {
		return t.promote(ctx)
	}
	return nil
}

// enqueue puts our key, if it is not there, and reads its place, in one Txn.
// (A compare on the prefix being empty could save the read when nobody
// holds, but etcd reads every key of the range to compare it: with a long
// queue, each enqueue would read all of it.)
func (t *Ticket) enqueue(ctx context.Context) (place, error) {
	// D3: if ctx ends while etcd applies the Txn, wait a little for the
	// reply rather than guess: a known revision makes the cleanup fenced, and
	// a cleanup sent while the Txn is still in flight could be applied first.
	rctx, cancel := graceContext(ctx, replyGrace)
	defer cancel()
	t.sent()
	resp, err := t.c.KV.Txn(rctx).
		If(clientv3.Compare(clientv3.CreateRevision(t.key), "=", 0), t.mayPut()).
		Then(append([]clientv3.Op{t.put()}, t.rule.newest()...)...).
		Else(clientv3.OpGet(t.key)).
		Commit()
	if err != nil {
		// D3: the Txn may have been applied though the reply was lost, or
		// may be applied later: the key stays unsure.
		return place{}, err
	}
	p, err := t.placed(resp)
	if err != nil {
		return p, err
	}
	if err := ctx.Err(); err != nil {
		return p, err
	}
	if p.verdict == unread {
		// Our key was already there (WithLease), or the keys the Txn read
		// could not tell our place (D11): read it.
		return t.read(ctx)
	}
	return p, nil
}

// try puts our key only if it would hold at once, and writes nothing
// otherwise: the first Txn assumes the queue is empty; if it is not, its
// reply says whether the keys there block us, and the next Txn puts our key
// only if no key was added since that read. A Txn that may put goes through
// etcd's raft log even when its compare fails, so after a try of this rule
// found the queue blocked, the next one reads first (a read-only Txn, no
// raft): a lock polled while held costs one read a try.
func (t *Ticket) try(ctx context.Context) (p place, err error) {
	defer func() { t.rule.busy.Store(err == nil && p.verdict == blocked) }()
	rctx, cancel := graceContext(ctx, replyGrace)
	defer cancel()
	unchanged := clientv3.Compare(clientv3.CreateRevision(t.rule.blocking), "=", 0).WithPrefix()
	for readFirst := t.rule.busy.Load(); ; readFirst = false {
		txn := t.c.KV.Txn(rctx)
		if readFirst {
			txn = txn.Then(t.blockers()...)
		} else {
			t.sent()
			txn = txn.If(unchanged, clientv3.Compare(clientv3.CreateRevision(t.key), "=", 0), t.mayPut()).
				Then(append([]clientv3.Op{t.put()}, t.rule.newest()...)...).
				Else(t.blockers()...)
		}
		resp, err := txn.Commit()
		if err != nil {
			return place{}, err
		}
		if resp == nil || resp.Header == nil {
			return place{}, ErrMalformed
		}
		if resp.Succeeded && !readFirst {
			p, err := t.placed(resp)
			if err == nil && p.verdict == unread {
				p, err = t.read(ctx)
			}
			return p, err
		}
		if !readFirst {
			t.state = keyAbsent // the compare failed: nothing was put
		}
		p, adopt, err := t.blocked(ctx, resp)
		switch {
		case adopt:
			return t.enqueue(ctx)
		case err != nil || p.verdict != held:
			return p, err
		}
		unchanged = clientv3.Compare(clientv3.CreateRevision(t.rule.blocking), "<", p.seen+1).WithPrefix()
	}
}

// blockers are the Ops of a try that read our key and what blocks a key put
// now.
func (t *Ticket) blockers() []clientv3.Op {
	return []clientv3.Op{clientv3.OpGet(t.key, clientv3.WithKeysOnly()), t.rule.oldest()}
}

// blocked reads the reply of blockers: the place a key put now would have,
// or adopt when our key is there already (WithLease: take it as it is).
func (t *Ticket) blocked(ctx context.Context, resp *clientv3.TxnResponse) (p place, adopt bool, err error) {
	if resp == nil || resp.Header == nil || len(resp.Responses) != 2 {
		return place{}, false, ErrMalformed
	}
	mine := resp.Responses[0].GetResponseRange()
	if mine == nil {
		return place{}, false, ErrMalformed
	}
	if len(mine.Kvs) > 0 {
		return place{}, true, nil
	}
	p, err = t.rule.placeFirst(resp.Responses[1].GetResponseRange(), resp.Header.Revision)
	if err == nil && p.verdict == unread {
		// A nested key came first (D11): read every key.
		p, err = t.readAll(ctx)
	}
	return p, false, err
}

// placed reads the reply of a Txn that put our key if it was absent and then
// read the rule's newest keys, or else read our key. It sets t.rev. The
// place is unread when the reply could not tell it.
func (t *Ticket) placed(resp *clientv3.TxnResponse) (place, error) {
	if resp == nil || resp.Header == nil || resp.Header.Revision <= 0 {
		return place{}, ErrMalformed
	}
	if !resp.Succeeded {
		// Our key was already there: left by an earlier process with this
		// lease (WithLease). Adopt it, as concurrency.Mutex does.
		if len(resp.Responses) != 1 {
			return place{}, ErrMalformed
		}
		mine := resp.Responses[0].GetResponseRange()
		if mine == nil || len(mine.Kvs) != 1 || mine.Kvs[0].CreateRevision <= 0 {
			return place{}, ErrMalformed
		}
		t.state, t.rev = keyPut, mine.Kvs[0].CreateRevision
		return place{}, nil
	}
	if len(resp.Responses) != 1+len(t.rule.newest()) {
		return place{}, ErrMalformed
	}
	t.state, t.rev = keyPut, resp.Header.Revision
	return t.rule.placeNew(t.key, resp.Responses[1:], t.rev)
}

// read reads our place: one linearizable read, and no write, guarded by our
// key, so that it says gone if our key is no longer in etcd (the post-wait
// check of etcd #16221 / #19597).
func (t *Ticket) read(ctx context.Context) (place, error) {
	for _, full := range []bool{false, true} {
		ops := t.rule.older(t.rev, full)
		resp, err := t.c.KV.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(t.key), "=", t.rev)).
			Then(ops...).
			Commit()
		if err != nil {
			return place{}, err
		}
		if resp == nil || resp.Header == nil {
			return place{}, ErrMalformed
		}
		if !resp.Succeeded {
			return place{verdict: gone, seen: resp.Header.Revision}, nil
		}
		if len(resp.Responses) != len(ops) {
			return place{}, ErrMalformed
		}
		p, err := t.rule.placeOlder(resp.Responses, t.rev, resp.Header.Revision, full)
		if err != nil || p.verdict != unread {
			return p, err
		}
	}
	return place{}, ErrMalformed
}

// readAll reads the place a key put now would have, from every key of the
// queue; the place's seen is the revision of the read.
func (t *Ticket) readAll(ctx context.Context) (place, error) {
	resp, err := t.c.KV.Get(ctx, t.rule.blocking, t.rule.allOptions(0)...)
	if err != nil {
		return place{}, err
	}
	if resp == nil || resp.Header == nil {
		return place{}, ErrMalformed
	}
	return t.rule.placeAll((*pb.RangeResponse)(resp), resp.Header.Revision)
}
