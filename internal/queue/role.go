package queue

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// What a role may not touch. Under etcd's authentication, a role with read
// and write on a lock's own prefix (name/, what concurrency.Mutex and
// etcdctl lock need) is enough for the queue: the keys beside it that the
// protocol also reads and writes are done without where etcd refuses them.
//
//   - The lease's fence (Conn.FenceKey). Without it the lease's puts go as
//     concurrency.Mutex's do: an unsure put is cleaned up by reading our
//     keys and deleting what is there, fenced on its create revision. A put
//     etcd applies after that read (held up in the network, or in a
//     member's queue) then leaves its key in etcd, with the lease: in the
//     queue, as a holder or a waiter that nobody serves, until the lease
//     ends (a Session's Close revokes it), or until a ticket of the lease
//     puts the same key again, which adopts it. Exclusion, the limit and
//     the tokens' order hold all the same: the key is one more holder that
//     holds nothing.
//   - A semaphore's limit record (Rule.limitKey). Without it, the rule
//     counts with its own limit, as a version that knows no record does:
//     exact while no limit is recorded for the name; once one is, a role
//     that may not read it counts with the limit its Semaphore was made
//     with, and refuses an older key of another limit.
//
// Each is found refused (a lease's fence, a rule's record) by the refusal
// of a Txn that read or wrote it: one read of it, or a Txn that may put it
// and our key but applies nothing, then tells whether it was the one
// refused. A refused Txn was not applied, so it is sent again without it.
// The lease and the rule go without it for a TTL, then try it again: a
// refusal while an operator changes the role's grants does not take the
// fence, or a recorded limit, away for good.

// narrow is told that etcd refused a Txn of the ticket with err (the Txn
// read the fence where fenced). Where err is "permission denied", it reads
// the fence and the ticket's limit records, all in one Txn and, if that is
// refused, each alone: those the role may not read the lease and the rules
// go without for a TTL. It reports whether it found one, so that the
// refused Txn, sent again without, may succeed; false otherwise, and for
// any other error.
func (t *Ticket) narrow(ctx context.Context, err error, fenced bool) bool {
	if !errors.Is(err, rpctypes.ErrPermissionDenied) {
		return false
	}
	fence := fenced && !t.c.fenceRead.recent(t.c.TTL)
	var keys []string
	if fence {
		keys = append(keys, t.c.FenceKey)
	}
	var rules []*Ticket
	for _, m := range t.group {
		if m.rule.recorded() && !m.rule.recordRead.recent(t.c.TTL) {
			keys = append(keys, m.rule.limitKey)
			rules = append(rules, m)
		}
	}
	readable := func() {
		if fence {
			t.c.fenceRead.now()
		}
		for _, m := range rules {
			m.rule.recordRead.now()
		}
	}
	if len(keys) == 0 {
		return false // all read lately: the refusal is of our keys
	}
	if len(keys) > 1 {
		switch refused, known := t.c.refuses(ctx, keys...); {
		case !known:
			return false // the read failed: nothing learned, the refusal stands
		case !refused:
			readable()
			return false
		}
	}
	found := false
	if fence {
		switch refused, known := t.c.refuses(ctx, t.c.FenceKey); {
		case refused:
			t.c.fenceOff.now()
			found = true
		case known:
			t.c.fenceRead.now()
		}
	}
	for _, m := range rules {
		refused, known := t.c.refuses(ctx, m.rule.limitKey)
		if !refused {
			if known {
				m.rule.recordRead.now()
			}
			continue
		}
		m.rule.recordOff.now()
		m.rule = m.rule.bare
		found = true
	}
	return found
}

// A readAt is when a key was last found readable by the role (Unix ns; 0:
// never): a refusal within a TTL of that is taken for one of our keys, and
// costs no read of it (a role refused its own keys pays nothing more a
// call). A grant revoked meanwhile is found at the first refusal after.
type readAt struct{ at atomic.Int64 }

func (r *readAt) now() { r.at.Store(time.Now().UnixNano()) }

// recent reports whether the key was found readable within d.
func (r *readAt) recent(d time.Duration) bool {
	at := r.at.Load()
	return at != 0 && time.Since(time.Unix(0, at)) < d
}

// fenceRefused is told that etcd refused the write of the fence: it reports
// whether the role may not write the fence but may write our keys. A role
// that may write neither (write revoked for now) keeps the fence: its
// cleanup is refused, and retried.
func (t *Ticket) fenceRefused(ctx context.Context) bool {
	return t.c.refusesPut(ctx, t.c.FenceKey) && !t.c.refusesPut(ctx, t.key)
}

// refuses reports whether etcd refuses the role a read of keys, in one
// Txn (of one of them, at least), and whether it knows: a read that failed
// otherwise (a lost reply, etcd unreachable) tells nothing, and must not
// mark the keys readable.
func (c *Conn) refuses(ctx context.Context, keys ...string) (refused, known bool) {
	ops := make([]clientv3.Op, len(keys))
	for i, key := range keys {
		ops[i] = clientv3.OpGet(key, clientv3.WithKeysOnly())
	}
	_, err := c.KV.Txn(ctx).Then(ops...).Commit()
	refused = errors.Is(err, rpctypes.ErrPermissionDenied)
	return refused, err == nil || refused
}

// refusesPut reports whether etcd refuses the role a put of key, by a Txn
// whose compare is never true: etcd checks the permission of every Op of a
// Txn, and applies none of these.
func (c *Conn) refusesPut(ctx context.Context, key string) bool {
	_, err := c.KV.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "<", 0)).Then(clientv3.OpPut(key, "")).Commit()
	return errors.Is(err, rpctypes.ErrPermissionDenied)
}
