package queue

import (
	"cmp"
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
	next    bool   // a key is queued behind ours
	ahead   int    // a semaphore's: how many older keys wait
	// turn: a semaphore's waiter near the head counts its turn from the
	// events of every key under watch, its prefix (turn.go); nil for any
	// other place.
	turn *turn
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
		var rec *mvccpb.KeyValue
		if r.recorded() {
			var err error
			if rec, err = recordIn(replies, 1); err != nil {
				return place{}, err
			}
		}
		return r.count(kvs, rec, rev, rev)
	}
	return r.lockPlace(kvs, len(rr.Kvs) < window+1, rev), nil
}

// recordIn returns the limit record in the reply at i of a semaphore's
// reads, nil if there is none.
func recordIn(replies []*pb.ResponseOp, i int) (*mvccpb.KeyValue, error) {
	if i >= len(replies) {
		return nil, ErrMalformed
	}
	switch kvs := replies[i].GetResponseRange().GetKvs(); len(kvs) {
	case 0:
		return nil, nil
	case 1:
		return kvs[0], nil
	}
	return nil, ErrMalformed
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
	case r.limit > 0:
		// Every older key, the key behind ours (none for a key put now),
		// the limit record (none for a bare rule).
		n := len(replies)
		var rec *mvccpb.KeyValue
		if r.recorded() {
			var err error
			if rec, err = recordIn(replies, n-1); n < 2 || err != nil {
				return place{}, cmp.Or(err, ErrMalformed)
			}
			n--
		}
		p, err := r.count(older, rec, rev, seen)
		p.next = n > 1 && len(replies[1].GetResponseRange().Kvs) > 0
		if p.turn != nil {
			p.turn.next = p.next
		}
		return p, err
	case full:
		// Every older key, oldest first.
		newestFirst := slices.Clone(older)
		slices.Reverse(newestFirst)
		return r.lockPlace(newestFirst, true, seen), nil
	}
	return r.lockPlace(older, len(older) < window, seen), nil
}

// placeFirst reads what blocks a key put now from the replies of oldest(),
// read at revision seen; unread if they cannot tell.
func (r *Rule) placeFirst(replies []*pb.ResponseOp, seen int64) (place, error) {
	if r.limit > 0 {
		return r.placeAll(replies, seen)
	}
	if len(replies) != 1 || replies[0].GetResponseRange() == nil {
		return place{}, ErrMalformed
	}
	rr := replies[0].GetResponseRange()
	switch {
	case len(rr.Kvs) == 0:
		return heldAt(seen), nil
	case r.member(rr.Kvs[0].Key):
		return place{verdict: blocked, seen: seen, watch: string(rr.Kvs[0].Key)}, nil
	}
	return place{}, nil
}

// placeAll reads the place a key put now would have from the replies of
// every(), read at revision seen.
func (r *Rule) placeAll(replies []*pb.ResponseOp, seen int64) (place, error) {
	return r.placeOlder(replies, math.MaxInt64, seen, true)
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

// count reads the place of a semaphore's key created at rev (MaxInt64: a
// key put now) from every key older than it, oldest first, and the limit
// record rec (nil if none), read at revision seen (limit.go). A waiter with
// fewer than NearHead keys waiting ahead counts its turn from the prefix's
// events (turn.go); one further back watches its predecessor, whose
// admission, or leaving, moves it up.
func (r *Rule) count(kvs []*mvccpb.KeyValue, rec *mvccpb.KeyValue, rev, seen int64) (place, error) {
	u := &turn{seen: seen, limit: Limit{N: r.limit}}
	if rec != nil {
		var ok bool
		if u.limit, ok = ParseLimit(rec.Value); !ok {
			return place{}, ErrMalformed
		}
		u.recRev = rec.ModRevision
	}
	var last *mvccpb.KeyValue
	for _, kv := range kvs {
		if !r.member(kv.Key) {
			continue
		}
		limit, w, _, ok := ParseSemaphoreValue(kv.Value)
		if !ok || (rec == nil && limit != r.limit) {
			return place{}, r.accept(kv.Value)
		}
		u.older = append(u.older, olderKey{key: string(kv.Key), rev: kv.CreateRevision, weight: w})
		last = kv
	}
	holds, waiting := u.judge(rev, r.weight)
	switch {
	case holds:
		return heldAt(seen), nil
	case waiting < NearHead:
		return place{verdict: blocked, seen: seen, watch: r.blocking, ahead: waiting, turn: u}, nil
	default:
		return place{verdict: blocked, seen: seen, watch: string(last.Key), ahead: waiting}, nil
	}
}

// changed returns next if it differs from p in what to watch, and
// otherwise the unchanged verdict: nothing to do but go on waiting. A
// waiter that counts its turn goes on from what next read.
func changed(p, next place) place {
	if next.verdict == blocked && next.watch == p.watch && (next.turn == nil) == (p.turn == nil) && next.owner == p.owner {
		if p.turn != nil && next.turn != nil {
			*p.turn = *next.turn
		}
		return place{verdict: unchanged}
	}
	return next
}
