package etcdlock

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"slices"

	"github.com/etcdlock/etcdlock/internal/queue"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A QueueEntry is one key in the queue of a lock: a holder or a waiter.
type QueueEntry struct {
	Key      string           // the etcd key
	Lease    clientv3.LeaseID // the lease the key is attached to
	Token    int64            // the key's create revision: its place in the queue, the holder's fencing token
	Holds    bool             // holds the lock now (an RWMutex's readers and a Semaphore's permits: several)
	Identity string           // the holder's WithIdentity, "" if none
	Kind     Kind             // KindMutex (also concurrency.Mutex and etcdctl lock), KindRead, KindWrite or KindSemaphore
	Weight   int              // a Semaphore key's permits (1, or n from AcquireN); 0 for other kinds
}

// Inspect reads, writing nothing, the queue of name at one revision: any
// lock's keys (concurrency.Mutex's, etcdctl lock's, recipe RWMutex's too, not
// nested names'), holders first by token, then waiters in turn.
func Inspect(ctx context.Context, client *clientv3.Client, name string) ([]QueueEntry, error) {
	entries, _, err := inspectAt(ctx, client, name)
	return entries, err
}

// inspectAt is Inspect, and also returns the revision etcd read the queue
// at: a watch of the prefix name+"/" from rev+1 misses no change that came
// after the read. It returns the errors Inspect does, with rev 0.
func inspectAt(ctx context.Context, client *clientv3.Client, name string) (entries []QueueEntry, rev int64, err error) {
	return readQueue(ctx, client, name, "inspect")
}

// readQueue is inspectAt for the operation op, which its errors name.
func readQueue(ctx context.Context, client *clientv3.Client, name, op string) (entries []QueueEntry, rev int64, err error) {
	if err := validateClient(ctx, client, name); err != nil {
		return nil, 0, err
	}
	kvs, rec, rev, err := readKeys(ctx, client, name, false)
	if err != nil {
		return nil, 0, errorf(op, name, err)
	}
	return queueOf(name+"/", kvs, rec), rev, nil
}

// readKeys reads the keys under name's prefix, and the revision of the
// read. Where they are a Semaphore's, it also reads the limit record at
// that revision, unless etcd refuses it to the role (rec is then nil);
// withLimit, it reads both in one Txn, and a refusal is an error that names
// them. The read of a Mutex's queue is one Range, and needs no permission
// on the record's key.
func readKeys(ctx context.Context, client *clientv3.Client, name string, withLimit bool) (kvs []*mvccpb.KeyValue, rec *mvccpb.KeyValue, rev int64, err error) {
	pfx := name + "/"
	if !withLimit {
		resp, err := client.Get(ctx, pfx, clientv3.WithPrefix())
		switch {
		case err != nil:
			return nil, nil, 0, err
		case resp == nil || resp.Header == nil:
			return nil, nil, 0, errMalformed
		case !hasPermits(pfx, resp.Kvs):
			return resp.Kvs, nil, resp.Header.Revision, nil
		}
		rev := resp.Header.Revision
		rr, err := client.Get(ctx, queue.LimitKey(name), clientv3.WithRev(rev))
		switch {
		case errors.Is(err, rpctypes.ErrPermissionDenied):
			// A role with read on name/ alone, as 1.0.0's Inspect needed:
			// the holders are counted as 1.0.0 counted them, with the
			// oldest key's limit.
			return resp.Kvs, nil, rev, nil
		case err != nil:
			return nil, nil, 0, err
		case rr == nil || len(rr.Kvs) > 1:
			return nil, nil, 0, errMalformed
		case len(rr.Kvs) == 1:
			rec = rr.Kvs[0]
		}
		return resp.Kvs, rec, rev, nil
	}
	resp, err := client.Txn(ctx).Then(clientv3.OpGet(pfx, clientv3.WithPrefix()), clientv3.OpGet(queue.LimitKey(name))).Commit()
	if err != nil {
		return nil, nil, 0, needs(err, "read on "+pfx+" and on "+queue.LimitKey(name))
	}
	kvs, rec, err = queueReply(resp)
	if err != nil {
		return nil, nil, 0, err
	}
	return kvs, rec, resp.Header.Revision, nil
}

// hasPermits reports whether a key of kvs is a permit of the Semaphore with
// prefix pfx.
func hasPermits(pfx string, kvs []*mvccpb.KeyValue) bool {
	for _, kv := range kvs {
		if _, _, _, ok := queue.ParseSemaphoreValue(kv.Value); ok && queue.IsMember(pfx, kv.Key) {
			return true
		}
	}
	return false
}

// queueReply reads the reply of a Txn that read a queue's prefix and its
// limit record, as readQueue does: the keys, and the record (nil if none).
func queueReply(resp *clientv3.TxnResponse) (kvs []*mvccpb.KeyValue, rec *mvccpb.KeyValue, err error) {
	if resp == nil || resp.Header == nil || len(resp.Responses) != 2 {
		return nil, nil, errMalformed
	}
	keys, limit := resp.Responses[0].GetResponseRange(), resp.Responses[1].GetResponseRange()
	if keys == nil || limit == nil || len(limit.Kvs) > 1 {
		return nil, nil, errMalformed
	}
	if len(limit.Kvs) == 1 {
		rec = limit.Kvs[0]
	}
	return keys.Kvs, rec, nil
}

// inQueue reports whether key is a key of a queue of the lock with prefix
// pfx: a Mutex's or Semaphore's (pfx<id>), or an RWMutex's
// (pfx"read/"<id>, pfx"write/"<id>); not a key of a lock nested under it.
func inQueue(pfx string, key []byte) bool {
	return queue.IsMember(pfx, key) || queue.IsMember(pfx+"read/", key) || queue.IsMember(pfx+"write/", key)
}

// inQueues reports whether key is a key of the queue of one of the locks
// names.
func inQueues(names []string, key []byte) bool {
	for _, name := range names {
		if inQueue(name+"/", key) {
			return true
		}
	}
	return false
}

// queueOf returns the queue of the lock with prefix pfx, as Inspect orders
// it, from keys under pfx in any order, and its limit record rec (nil if
// none): keys not inQueue are left out. It never returns nil, and does not
// change kvs.
func queueOf(pfx string, kvs []*mvccpb.KeyValue, rec *mvccpb.KeyValue) []QueueEntry {
	// By create revision: the order of the queue. One Txn can put two keys
	// at one revision; the key then decides, so that every read of one
	// state gives one order.
	kvs = slices.Clone(kvs)
	slices.SortFunc(kvs, func(a, b *mvccpb.KeyValue) int {
		return cmp.Or(cmp.Compare(a.CreateRevision, b.CreateRevision), bytes.Compare(a.Key, b.Key))
	})
	var plain, rw []QueueEntry
	var plainKvs []*mvccpb.KeyValue
	for _, kv := range kvs {
		e := QueueEntry{Key: string(kv.Key), Lease: clientv3.LeaseID(kv.Lease), Token: kv.CreateRevision, Identity: string(kv.Value)}
		switch {
		case queue.IsMember(pfx, kv.Key):
			e.Kind = KindMutex
			if _, w, identity, ok := queue.ParseSemaphoreValue(kv.Value); ok {
				e.Kind, e.Weight, e.Identity = KindSemaphore, w, identity
			}
			plain, plainKvs = append(plain, e), append(plainKvs, kv)
		case queue.IsMember(pfx+"read/", kv.Key):
			e.Kind = KindRead
			rw = append(rw, e)
		case queue.IsMember(pfx+"write/", kv.Key):
			e.Kind = KindWrite
			rw = append(rw, e)
		}
	}

	// A Mutex's holder is its oldest key; a Semaphore's, its oldest keys
	// whose permits fit within its limit.
	if len(plain) > 0 && plain[0].Kind != KindSemaphore {
		rec = nil
	}
	for i, holds := range queue.Holders(plainKvs, rec) {
		plain[i].Holds = holds
	}
	// An RWMutex's holders are its oldest readers, or its oldest writer.
	for i := range rw {
		rw[i].Holds = i == 0 || rw[i].Kind == KindRead && rw[i-1].Holds && rw[i-1].Kind == KindRead
	}

	entries := append(plain, rw...)
	slices.SortStableFunc(entries, func(a, b QueueEntry) int {
		if a.Holds != b.Holds {
			if a.Holds {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.Token, b.Token)
	})
	if entries == nil {
		entries = []QueueEntry{}
	}
	return entries
}
