package queue

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

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
// own. Where a put is unsure, one Txn writes the marker, which fails every
// put of the ticket that etcd has yet to apply, and deletes the keys by
// name: only this ticket uses them meanwhile (a Mutex's key is its
// process's turn, and a group holds the turn of each of its locks). The
// marker makes that Txn act once: a retry, or a copy of it applied late, can
// never delete a later key of the same name. With nothing put, it does
// nothing.
func (t *Ticket) Delete(ctx context.Context) (bool, error) {
	dels := make([]clientv3.Op, len(t.group))
	for i, m := range t.group {
		dels[i] = clientv3.OpDelete(m.key)
	}
	txn := t.c.KV.Txn(ctx)
	switch t.state {
	case keyAbsent:
		return false, nil
	case keyPut:
		ours := t.Ours()
		txn = txn.If(ours...).Then(dels...)
		if len(t.group) > 1 {
			each := make([]clientv3.Op, len(t.group))
			for i := range t.group {
				each[i] = clientv3.OpTxn([]clientv3.Cmp{ours[i]}, []clientv3.Op{dels[i]}, nil)
			}
			txn = txn.Else(each...)
		}
	default:
		txn = txn.If(t.mayPut()).Then(append([]clientv3.Op{clientv3.OpPut(t.marker, "", clientv3.WithLease(t.c.Lease.ID()))}, dels...)...)
	}
	resp, err := txn.Commit()
	switch {
	case t.state == keyUnsure && errors.Is(err, rpctypes.ErrLeaseNotFound):
		// The lease is gone, and every key with it: no put of ours can
		// succeed.
		return false, nil
	case err != nil:
		return false, err
	case resp == nil:
		return false, ErrMalformed
	case t.state == keyPut || !resp.Succeeded:
		return resp.Succeeded, nil
	}
	if len(resp.Responses) != 1+len(t.group) {
		return false, ErrMalformed
	}
	deleted := false
	for _, reply := range resp.Responses[1:] {
		d := reply.GetResponseDeleteRange()
		if d == nil {
			return false, ErrMalformed
		}
		deleted = deleted || d.Deleted > 0
	}
	return deleted, nil
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
