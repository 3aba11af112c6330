package queue

import (
	"math"
	"slices"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// The place of a key in its queue, computed from the keys a read brought:
// pure functions of a rule and a reply, with no etcd call.

// A verdict is what a read, or a watch response, says of our key.
type verdict int

const (
	// unread: the keys read could not tell (a nested key in the window
	// read): read every key.
	unread verdict = iota
	// held: nothing blocks our key.
	held
	// blocked: our key waits; the place says what to watch.
	blocked
	// unchanged: nothing that blocks us changed: go on waiting as before.
	unchanged
	// gone: our key is no longer in etcd.
	gone
)

func (v verdict) String() string {
	return [...]string{"unread", "held", "blocked", "unchanged", "gone"}[v]
}

// A place is where our key stands in its queue, as read at one revision.
type place struct {
	verdict verdict
	seen    int64  // the revision of the read
	watch   string // what to watch while blocked
	prefix  bool   // watch every key under watch, for deletes (a semaphore's head waiter)
	puts    bool   // also wake on a put of watch (a semaphore waiter: its predecessor's admission)
	next    bool   // a key is queued behind ours
	// A lock's waiter: owner means watch is the only key that blocks us, so
	// that its delete makes us the holder with no read; watchRev is watch's
	// create revision.
	owner    bool
	watchRev int64
}

// heldAt is the place of a key that nothing blocks, read at seen.
func heldAt(seen int64) place { return place{verdict: held, seen: seen} }

// placeNew reads the place of our key, just put at rev, from the replies of
// newest(); unread if they cannot tell.
func (r *Rule) placeNew(key string, replies []*pb.ResponseOp, rev int64) (place, error) {
	for _, reply := range replies {
		if reply.GetResponseRange() == nil {
			return place{}, ErrMalformed
		}
	}
	if len(replies) == 0 {
		return place{}, ErrMalformed
	}
	rr := replies[0].GetResponseRange()
	kvs := make([]*mvccpb.KeyValue, 0, len(rr.Kvs))
	for _, kv := range rr.Kvs {
		switch {
		case string(kv.Key) == key:
			if kv.CreateRevision != rev {
				return place{}, ErrMalformed
			}
		case kv.CreateRevision > rev || (kv.CreateRevision == rev && r.member(kv.Key)):
			// Only our Txn put keys at rev: a group's other keys, which
			// can lie under this queue's prefix only nested (D11).
			return place{}, ErrMalformed
		default:
			kvs = append(kvs, kv)
		}
	}
	if r.limit > 0 {
		return r.count(kvs, rev)
	}
	return r.lockPlace(kvs, len(rr.Kvs) < window+1, rev), nil
}

// placeOlder reads the place of the key at rev from the replies of
// older(rev, full), read at revision seen; unread if they cannot tell.
func (r *Rule) placeOlder(replies []*pb.ResponseOp, rev, seen int64, full bool) (place, error) {
	for _, reply := range replies {
		if reply.GetResponseRange() == nil {
			return place{}, ErrMalformed
		}
	}
	if len(replies) == 0 {
		return place{}, ErrMalformed
	}
	older := replies[0].GetResponseRange().Kvs
	for _, kv := range older {
		if kv.CreateRevision >= rev {
			return place{}, ErrMalformed
		}
	}
	switch {
	case r.limit > 0 && len(replies) > 1:
		p, err := r.count(older, seen)
		p.next = len(replies[1].GetResponseRange().Kvs) > 0
		return p, err
	case r.limit > 0:
		return r.count(older, seen)
	case full:
		// Every older key, oldest first.
		newestFirst := slices.Clone(older)
		slices.Reverse(newestFirst)
		return r.lockPlace(newestFirst, true, seen), nil
	}
	return r.lockPlace(older, len(older) < window, seen), nil
}

// placeFirst reads what blocks a key put now from the reply of oldest(),
// read at revision seen; unread if it cannot tell.
func (r *Rule) placeFirst(rr *pb.RangeResponse, seen int64) (place, error) {
	if rr == nil {
		return place{}, ErrMalformed
	}
	if r.limit > 0 {
		return r.count(rr.Kvs, seen)
	}
	switch {
	case len(rr.Kvs) == 0:
		return heldAt(seen), nil
	case r.member(rr.Kvs[0].Key):
		return place{verdict: blocked, seen: seen, watch: string(rr.Kvs[0].Key)}, nil
	}
	return place{}, nil
}

// placeAll reads the place a key put now would have from the reply of
// all(0), read at revision seen.
func (r *Rule) placeAll(rr *pb.RangeResponse, seen int64) (place, error) {
	reply := &pb.ResponseOp{Response: &pb.ResponseOp_ResponseRange{ResponseRange: rr}}
	return r.placeOlder([]*pb.ResponseOp{reply}, math.MaxInt64, seen, true)
}

// lockPlace reads a lock's place from the keys older than ours under the
// blocking prefix, newest first: every one if complete, else the newest
// few. We watch the newest member; when it is the only one, it holds, and
// its delete makes us the holder. A nested key in an incomplete window
// leaves the place unread: read every key.
func (r *Rule) lockPlace(newestFirst []*mvccpb.KeyValue, complete bool, seen int64) place {
	var members []*mvccpb.KeyValue
	for _, kv := range newestFirst {
		if !r.member(kv.Key) {
			if !complete {
				return place{}
			}
			continue
		}
		members = append(members, kv)
	}
	if len(members) == 0 {
		return heldAt(seen)
	}
	return place{verdict: blocked, seen: seen, watch: string(members[0].Key), watchRev: members[0].CreateRevision,
		owner: complete && len(members) == 1}
}

// count reads a semaphore's place from every key older than ours, oldest
// first, read at revision seen.
func (r *Rule) count(kvs []*mvccpb.KeyValue, seen int64) (place, error) {
	var older []*mvccpb.KeyValue
	for _, kv := range kvs {
		if !r.member(kv.Key) {
			continue
		}
		if r.accept != nil {
			if err := r.accept(kv.Value); err != nil {
				return place{}, err
			}
		}
		older = append(older, kv)
	}
	switch n := len(older); {
	case n < r.limit:
		return heldAt(seen), nil
	case n == r.limit:
		// The head waiter: any release of an older key admits us.
		return place{verdict: blocked, seen: seen, watch: r.blocking, prefix: true}, nil
	default:
		// Behind the head: our predecessor's admission, or its leaving,
		// moves us up.
		return place{verdict: blocked, seen: seen, watch: string(older[n-1].Key), puts: true}, nil
	}
}

// changed returns next if it differs from p in what to watch, and
// otherwise the unchanged verdict: nothing to do but go on waiting.
func changed(p, next place) place {
	if next.verdict == blocked && next.watch == p.watch && next.prefix == p.prefix && next.puts == p.puts && next.owner == p.owner {
		return place{verdict: unchanged}
	}
	return next
}
