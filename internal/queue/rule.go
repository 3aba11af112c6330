package queue

import (
	"strings"
	"sync/atomic"
	"time"

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
//   - Semaphore: older keys whose weights, with ours, exceed the limit in
//     force (limit.go).
type Rule struct {
	// blocking is the prefix under which lies every key that can block us.
	blocking string
	// member reports whether a key under blocking takes part in the queue,
	// and is not a key of a lock nested under it (D11).
	member func(key []byte) bool
	// limit is 0 for a lock and, for a semaphore, the limit while no limit
	// record says another.
	limit int
	// weight is how many permits our key takes (a semaphore's).
	weight int
	// limitKey is the key of a semaphore's limit record; "" for a lock,
	// and for a semaphore's bare rule.
	limitKey string
	// bare is a semaphore's rule without its limit record, for a role that
	// may not read it (role.go); recordOff: when etcd last refused the
	// record to the role, so that tickets take bare for a TTL after.
	bare       *Rule
	recordOff  readAt
	recordRead readAt // the role was last found to read the record
	// accept returns the error, never nil, of an older key's value that is
	// no permit's, or that carries another limit while no record says the
	// limit (a semaphore's); nil for a lock, whose reads bring no values.
	accept func(value []byte) error
	// busy: the last try with this rule found the queue blocked.
	busy atomic.Bool
	// nearHead: the last enqueue with this rule (a semaphore's) waited near
	// the head, counting its turn: the next one opens its watch first.
	nearHead atomic.Bool
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

// Semaphore returns the rule of a key of weight permits in the semaphore
// called name, whose keys lie directly under name + "/": older keys block
// it when their weights and its own exceed the limit in force, that of the
// record at LimitKey(name) or else limit (limit.go). accept gives the error
// of an older key that is no permit's, or carries another limit while no
// record says the limit; it ends the acquisition.
func Semaphore(name string, limit, weight int, accept func(value []byte) error) *Rule {
	pfx := name + "/"
	member := func(key []byte) bool { return IsMember(pfx, key) }
	bare := &Rule{blocking: pfx, limit: limit, weight: weight, accept: accept, member: member}
	return &Rule{blocking: pfx, limit: limit, weight: weight, limitKey: LimitKey(name), accept: accept, member: member, bare: bare}
}

// PrefixOf returns the prefix of the queue key is in: key up to its last
// "/", included.
func PrefixOf(key string) string { return key[:strings.LastIndexByte(key, '/')+1] }

// use returns the rule a new ticket takes: r, or its bare rule within ttl
// of etcd's refusal of r's limit record to the role (a grant given back is
// used from the next ticket a TTL on).
func (r *Rule) use(ttl time.Duration) *Rule {
	if r.recordOff.recent(ttl) {
		return r.bare
	}
	return r
}

// recorded reports whether the rule reads a limit record: a semaphore's,
// but for its bare rule.
func (r *Rule) recorded() bool { return r.limitKey != "" }

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
		return r.every()
	}
	// Our new key is the newest in etcd, so the newest keys under the
	// prefix are ours, usually our predecessor, and the one before it, if
	// any.
	return []clientv3.Op{clientv3.OpGet(r.blocking, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(window+1),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend))}
}

// oldest returns the Ops that read what blocks a key put now, when a try
// finds the queue not empty: for a lock, the oldest key; for a semaphore,
// every key and the limit record.
func (r *Rule) oldest() []clientv3.Op {
	if r.limit > 0 {
		return r.every()
	}
	return []clientv3.Op{clientv3.OpGet(r.blocking, append(clientv3.WithFirstCreate(), clientv3.WithKeysOnly())...)}
}

// every returns the Ops that read every key of the queue, oldest first,
// and a semaphore's limit record (but for a bare rule).
func (r *Rule) every() []clientv3.Op {
	if r.recorded() {
		return append(r.all(0), r.record())
	}
	return r.all(0)
}

// record returns the Op that reads a semaphore's limit record.
func (r *Rule) record() clientv3.Op { return clientv3.OpGet(r.limitKey) }

// unchangedSince returns the compares that nothing that decides the place
// of a key put now changed after revision seen: no key was put under the
// prefix, and (a semaphore) the limit record was not written. Keys that go
// only ever free a place.
func (r *Rule) unchangedSince(seen int64) []clientv3.Cmp {
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(r.blocking), "<", seen+1).WithPrefix()}
	if r.recorded() {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(r.limitKey), "<", seen+1))
	}
	return cmps
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
// keys); for a semaphore, every older key, the key behind ours, if any, and
// the limit record (but for a bare rule).
func (r *Rule) older(rev int64, full bool) []clientv3.Op {
	switch {
	case r.limit > 0:
		ops := append(r.all(rev), clientv3.OpGet(r.blocking, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
			clientv3.WithMinCreateRev(rev+1), clientv3.WithLimit(1)))
		if r.recorded() {
			ops = append(ops, r.record())
		}
		return ops
	case full:
		return r.all(rev)
	}
	return []clientv3.Op{clientv3.OpGet(r.blocking, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(window),
		clientv3.WithMaxCreateRev(rev-1), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend))}
}
