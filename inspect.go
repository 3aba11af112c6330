package etcdlock

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/etcdlock/etcdlock/internal/queue"
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

// Inspect reads the queue of the lock called name: the keys of a Mutex, an
// RWMutex or a Semaphore of that name, or of concurrency.Mutex, etcdctl lock
// and etcd's recipe RWMutex. It returns the holders first, by token, then
// the waiters in the order they will be served; an empty slice when nobody
// holds or waits. It is one consistent read, and writes nothing.
//
// Where keys of a Mutex (or Semaphore) and of an RWMutex share the name,
// they are two locks: both queues are listed, holders first. Keys of locks
// nested under the name ("name/sub") are not listed.
func Inspect(ctx context.Context, client *clientv3.Client, name string) ([]QueueEntry, error) {
	switch {
	case ctx == nil:
		return nil, fmt.Errorf("%w: nil context", ErrInvalidArgument)
	case client == nil:
		return nil, fmt.Errorf("%w: nil client", ErrInvalidArgument)
	case name == "":
		return nil, ErrInvalidName
	}
	pfx := name + "/"
	resp, err := client.Get(ctx, pfx, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, errorf("inspect", name, err)
	}
	if resp == nil {
		return nil, errorf("inspect", name, errMalformed)
	}
	var plain, rw []QueueEntry
	holders := 1 // a Mutex's holder is its oldest key; a Semaphore's, its limit oldest
	for _, kv := range resp.Kvs {
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
	return entries, nil
}
