package queue

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// promote tells the key behind ours that we now hold, so that it learns its
// new place (a semaphore's waiters watch their predecessor for this): it
// puts our key again, fenced on its create revision.
func (t *Ticket) promote(ctx context.Context) error {
	return guarded(t.c.KV.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(t.key), "=", t.rev)).
		Then(t.put()).
		Commit())
}

// guarded returns the error of a Txn guarded by our keys being there:
// ErrKeyGone where they were not.
func guarded(resp *clientv3.TxnResponse, err error) error {
	switch {
	case err != nil:
		return err
	case resp == nil:
		return ErrMalformed
	case !resp.Succeeded:
		return ErrKeyGone
	}
	return nil
}

// Delete deletes our keys, on ctx as it is, and reports whether it did (a
// group: all of them).
// Keys known to be put are deleted fenced on their create revision (D6): a
// group's in one Txn, and where one was lost, the others each fenced on its
// own. Where a put is unsure, one Txn first writes the fence, which fails
// every put of the lease that etcd has yet to apply, and reads our keys: what
// it finds was put by this ticket (only this ticket uses them meanwhile), and
// is then deleted fenced on its create revision. With nothing put, it does
// nothing. A retry, or a copy of any of these Txns applied late, can never
// delete a later key of the same name.
func (t *Ticket) Delete(ctx context.Context) (bool, error) {
	switch t.state {
	case keyAbsent:
		return false, nil
	case keyUnsure:
		found, err := t.fence(ctx)
		if err != nil || !found {
			return false, err
		}
	}
	dels := make([]clientv3.Op, len(t.group))
	for i, m := range t.group {
		dels[i] = clientv3.OpDelete(m.key)
	}
	ours := t.Ours()
	txn := t.c.KV.Txn(ctx).If(ours...).Then(dels...)
	if len(t.group) > 1 {
		each := make([]clientv3.Op, len(t.group))
		for i := range t.group {
			each[i] = clientv3.OpTxn([]clientv3.Cmp{ours[i]}, []clientv3.Op{dels[i]}, nil)
		}
		txn = txn.Else(each...)
	}
	resp, err := txn.Commit()
	switch {
	case err != nil:
		return false, err
	case resp == nil:
		return false, ErrMalformed
	}
	return resp.Succeeded, nil
}

// fence ends an unsure put: it writes the fence, so that no put of the lease
// sent before can be applied any more, and reads our keys at that revision.
// It reports whether a key was found: the ticket is then put, at that key's
// create revision; else absent. Where etcd refuses the fence to the role,
// it reads our keys alone, as concurrency.Mutex's cleanup does, and the
// lease goes without the fence for a TTL (role.go): a put applied after
// that read is not stopped.
func (t *Ticket) fence(ctx context.Context) (bool, error) {
	fenced := !t.c.fenceOff.recent(t.c.TTL)
	found, err := t.settle(ctx, fenced)
	if !fenced || !errors.Is(err, rpctypes.ErrPermissionDenied) || !t.fenceRefused(ctx) {
		return found, err
	}
	t.c.fenceOff.now()
	return t.settle(ctx, false)
}

// settle is fence's Txn: fenced, it writes the fence; in any case it reads
// our keys, and sets what the ticket knows of them.
func (t *Ticket) settle(ctx context.Context, fenced bool) (bool, error) {
	ops := make([]clientv3.Op, 0, 1+len(t.group))
	if fenced {
		ops = append(ops, clientv3.OpPut(t.c.FenceKey, "", clientv3.WithLease(t.c.Lease.ID())))
	}
	for _, m := range t.group {
		ops = append(ops, clientv3.OpGet(m.key, clientv3.WithKeysOnly()))
	}
	resp, err := t.c.KV.Txn(ctx).Then(ops...).Commit()
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		// The lease is gone, and every key with it: no put of ours can
		// succeed.
		t.set(keyAbsent, 0)
		return false, nil
	case err != nil:
		return false, err
	case resp == nil || resp.Header == nil || len(resp.Responses) != len(ops):
		return false, ErrMalformed
	}
	if fenced {
		t.c.fenceSeen(resp.Header.Revision)
	}
	return t.found(resp.Responses[len(ops)-len(t.group):])
}

// found reads the replies of the reads of our keys (a group's, in order)
// that end an unsure put: the ticket is then put at the create revision of
// the key found, or absent.
func (t *Ticket) found(replies []*pb.ResponseOp) (bool, error) {
	var rev int64
	for _, reply := range replies {
		r := reply.GetResponseRange()
		if r == nil || len(r.Kvs) > 1 {
			return false, ErrMalformed
		}
		// A group's keys are put by one Txn, at one revision: a key at
		// another was not put by this ticket.
		if len(r.Kvs) == 1 && rev == 0 {
			rev = r.Kvs[0].CreateRevision
		}
	}
	if rev <= 0 {
		t.set(keyAbsent, 0)
		return false, nil
	}
	t.set(keyPut, rev)
	return true, nil
}

// graceContext returns a context that ends grace after ctx ends (or when
// cancel is called), and carries ctx's values.
func graceContext(ctx context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var timer atomic.Pointer[time.Timer]
	stop := context.AfterFunc(ctx, func() { timer.Store(time.AfterFunc(grace, cancel)) })
	return rctx, func() {
		stop()
		if t := timer.Load(); t != nil {
			t.Stop()
		}
		cancel()
	}
}
