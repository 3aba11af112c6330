package etcdlock

// What the locks write in etcd, beyond the queue's rules: the kinds of keys,
// and the values they carry.

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/etcdlock/etcdlock/internal/queue"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A Kind is the kind of a key in a lock's queue, and of a lock call.
type Kind string

// The kinds of keys.
const (
	KindMutex     Kind = "mutex"     // a Mutex's key (and Lead's, Do's, concurrency.Mutex's, etcdctl lock's)
	KindRead      Kind = "read"      // an RWMutex reader's
	KindWrite     Kind = "write"     // an RWMutex writer's
	KindSemaphore Kind = "semaphore" // a permit's
	KindMulti     Kind = "multi"     // a MultiMutex's call, in events; Inspect lists its keys as KindMutex
)

// describeLimit says what limit a key value carries, for errors.
func describeLimit(value []byte) string {
	if n, _, _, ok := queue.ParseSemaphoreValue(value); ok {
		return "limit " + strconv.Itoa(n)
	}
	return "no limit (not a semaphore's key)"
}

// queueNames returns the names of the locks whose queues keys, of a lock
// call of kind on the lock called lock, are in: an RWMutex's, its name; a
// Mutex's, Semaphore's or MultiMutex's, each key's name (its key less the
// last "/" and what follows).
func queueNames(kind Kind, lock string, keys []string) []string {
	if kind == KindRead || kind == KindWrite {
		return []string{lock}
	}
	names := make([]string, 0, len(keys))
	for _, key := range keys {
		names = append(names, lockOf(key))
	}
	return names
}

// lockOf returns the name of the lock whose queue key is in: key less its
// last "/" and what follows.
func lockOf(key string) string { return strings.TrimSuffix(queue.PrefixOf(key), "/") }

// mutexKey is the key of a Mutex of name with lease id, as etcd's
// concurrency.Mutex and etcdctl lock name it: a MultiMutex's keys are its
// names' Mutex keys.
func mutexKey(name string, id clientv3.LeaseID) string {
	return fmt.Sprintf("%s/%x", name, id)
}
