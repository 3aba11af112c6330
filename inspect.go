package etcdlock

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/etcdlock/etcdlock/internal/queue"
	"go.etcd.io/etcd/api/v3/mvccpb"
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
}

// Inspect reads the queue of the lock called name, in one read that writes
// nothing: the keys of any lock of this package, concurrency.Mutex, etcdctl
// lock or etcd's recipe RWMutex, holders first, by token, then waiters in the
// order they will be served; empty if none. Nested locks' keys are not.
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
	switch {
	case ctx == nil:
		return nil, 0, fmt.Errorf("%w: nil context", ErrInvalidArgument)
	case client == nil:
		return nil, 0, fmt.Errorf("%w: nil client", ErrInvalidArgument)
	case name == "":
		return nil, 0, ErrInvalidName
	}
	pfx := name + "/"
	resp, err := client.Get(ctx, pfx, clientv3.WithPrefix())
	if err != nil {
		return nil, 0, errorf(op, name, err)
	}
	if resp == nil || resp.Header == nil {
		return nil, 0, errorf(op, name, errMalformed)
	}
	return queueOf(pfx, resp.Kvs), resp.Header.Revision, nil
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
// it, from keys under pfx in any order; keys not inQueue are left out. It
// never returns nil, and does not change kvs.
func queueOf(pfx string, kvs []*mvccpb.KeyValue) []QueueEntry {
	// By create revision: the order of the queue. One Txn can put two keys
	// at one revision; the key then decides, so that every read of one
	// state gives one order.
	kvs = slices.Clone(kvs)
	slices.SortFunc(kvs, func(a, b *mvccpb.KeyValue) int {
		return cmp.Or(cmp.Compare(a.CreateRevision, b.CreateRevision), bytes.Compare(a.Key, b.Key))
	})
	var plain, rw []QueueEntry
	holders := 1 // a Mutex's holder is its oldest key; a Semaphore's, its limit oldest
	for _, kv := range kvs {
		e := QueueEntry{Key: string(kv.Key), Lease: clientv3.LeaseID(kv.Lease), Token: kv.CreateRevision, Identity: string(kv.Value)}
		switch {
		case queue.IsMember(pfx, kv.Key):
			e.Kind = KindMutex
			if n, ok := limitOf(kv.Value); ok {
				e.Kind = KindSemaphore
				_, e.Identity, _ = strings.Cut(e.Identity, "\n")
				if len(plain) == 0 {
					holders = n
				}
			}
			plain = append(plain, e)
		case queue.IsMember(pfx+"read/", kv.Key):
			e.Kind = KindRead
			rw = append(rw, e)
		case queue.IsMember(pfx+"write/", kv.Key):
			e.Kind = KindWrite
			rw = append(rw, e)
		}
	}

	for i := range plain {
		plain[i].Holds = i < holders
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
