package queue

import (
	"strings"
	"sync/atomic"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// window is how many older keys a lock's reads of its place bring: the
// predecessor, and one more if there is one, which says whether the
// predecessor is the holder.
const window = 2

// A Rule says which keys of a queue block a key: the only part of the
// protocol that differs between primitives.
//
//   - Mutex: any older key of the lock (limit 0, blocking = the prefix);
//   - RWMutex writer: any older reader or writer (limit 0);
//   - RWMutex reader: any older writer (limit 0, blocking = the writers' prefix);
//   - Semaphore: limit or more older keys (limit n).
type Rule struct {
	// blocking is the prefix under which lies every key that can block us.
	blocking string
	// member reports whether a key under blocking takes part in the queue,
	// and is not a key of a lock nested under it (D11).
	member func(key []byte) bool
	// limit is 0 for a lock and the number of holders for a semaphore.
	limit int
	// accept checks an older key's value (a semaphore's limit); nil: values
	// are not read.
	accept func(value []byte) error
	// busy: the last try with this rule found the queue blocked.
	busy atomic.Bool
}

// Lock returns the rule of a lock whose keys lie directly under each of
// prefixes, and which waits for the keys under blocking (a prefix of them
// all) that lie directly under one of them: any older such key blocks.
func Lock(blocking string, prefixes ...string) *Rule {
	return &Rule{blocking: blocking, member: func(key []byte) bool {
		for _, pfx := range prefixes {
			if IsMember(pfx, key) {
				return true
			}
		}
		return false
	}}
}

// Semaphore returns the rule of a semaphore of limit holders whose keys lie
// directly under pfx: limit older keys block. accept checks each older
// key's value, and its error ends the acquisition.
func Semaphore(pfx string, limit int, accept func(value []byte) error) *Rule {
	return &Rule{blocking: pfx, limit: limit, accept: accept, member: func(key []byte) bool { return IsMember(pfx, key) }}
}

// IsMember reports whether key is a waiter's or holder's key of the lock
// with prefix pfx, and not a key of a lock nested under it (D11): a name
// like "a/b" must not block "a".
func IsMember(pfx string, key []byte) bool {
	rest, ok := strings.CutPrefix(string(key), pfx)
	return ok && !strings.Contains(rest, "/")
}

// newest returns the Ops that read, in the acquire Txn, the keys that tell
// the place of a key just put.
func (r *Rule) newest() []clientv3.Op {
	if r.limit > 0 {
		return r.all(0)
	}
	// Our new key is the newest in etcd, so the newest keys under the
	// prefix are ours, usually our predecessor, and the one before it, if
	// any.
	return []clientv3.Op{clientv3.OpGet(r.blocking, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(window+1),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend))}
}

// oldest returns the Op that reads what blocks a key put now, when a try
// finds the queue not empty: for a lock, the oldest key; for a semaphore,
// every key.
func (r *Rule) oldest() clientv3.Op {
	if r.limit > 0 {
		return r.all(0)[0]
	}
	return clientv3.OpGet(r.blocking, append(clientv3.WithFirstCreate(), clientv3.WithKeysOnly())...)
}

// all returns the Op that reads every key under the prefix created before
// rev (rev 0: every key), oldest first, with values only where the rule
// reads them.
func (r *Rule) all(rev int64) []clientv3.Op {
	return []clientv3.Op{clientv3.OpGet(r.blocking, r.allOptions(rev)...)}
}

// allOptions returns the options of all's read.
func (r *Rule) allOptions(rev int64) []clientv3.OpOption {
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)}
	if r.accept == nil {
		opts = append(opts, clientv3.WithKeysOnly())
	}
	if rev > 0 {
		opts = append(opts, clientv3.WithMaxCreateRev(rev-1))
	}
	return opts
}

// older returns the Ops that read what blocks the key at rev: for a lock,
// the two newest older keys (or, if full, every older key, to skip nested
// keys); for a semaphore, every older key, and the key behind ours, if any.
func (r *Rule) older(rev int64, full bool) []clientv3.Op {
	switch {
	case r.limit > 0:
		return append(r.all(rev), clientv3.OpGet(r.blocking, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
			clientv3.WithMinCreateRev(rev+1), clientv3.WithLimit(1)))
	case full:
		return r.all(rev)
	}
	return []clientv3.Op{clientv3.OpGet(r.blocking, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(window),
		clientv3.WithMaxCreateRev(rev-1), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend))}
}
