package queue

import (
	"context"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A semaphore's waiter near the head of its queue counts its own turn: it
// knows every older key and the limit record as of a read, watches every put
// and delete under the queue's prefix after it, and tells from the events
// alone when its key holds, with no read and no wake-up write
// (docs/design.md §4).

// NearHead is how many keys may wait ahead of a semaphore's key for it to
// count its turn from the prefix's events. A key further back watches its
// predecessor, which puts its key again once admitted (promote); so an event
// under the prefix reaches at most NearHead waiters, whatever the queue's
// length. A write of the limit record touches the first NearHead waiters
// (Touch).
const NearHead = 8

// A turn is what a semaphore's waiter near the head knows of its queue, as
// of revision seen: the older keys, oldest first, and the limit in force.
type turn struct {
	seen   int64
	limit  Limit
	recRev int64 // the limit record's mod revision; 0 if there is none
	older  []olderKey
	next   bool // a key was queued behind ours: promote may be owed
}

// An olderKey is a key older than ours in a semaphore's queue.
type olderKey struct {
	key    string
	rev    int64 // its create revision
	weight int
}

// judge reports whether a key created at rev with weight holds behind the
// older keys, and how many of them wait.
func (u *turn) judge(rev int64, weight int) (holds bool, waiting int) {
	t := newTally(u.limit, u.recRev)
	for _, k := range u.older {
		if !t.add(k.rev, k.weight) {
			waiting++
		}
	}
	return t.holds(rev, weight), waiting
}

// holding reports whether the older key holds; false if it is not one.
func (u *turn) holding(key string) bool {
	t := newTally(u.limit, u.recRev)
	for _, k := range u.older {
		h := t.add(k.rev, k.weight)
		if k.key == key {
			return h
		}
	}
	return false
}

// gone forgets the older key, if it is one.
func (u *turn) gone(key string) {
	for i, k := range u.older {
		if k.key == key {
			u.older = append(u.older[:i], u.older[i+1:]...)
			return
		}
	}
}

// counted reads a response of the prefix's watch of the semaphore waiter
// near the head whose place is p (p.turn is not nil), and returns the next
// place: held once the older keys left fit our key, gone if our key was
// deleted, else unchanged. It reads the place again where the events do not
// tell it: the watch created after the read (what came in between is
// unknown); a put of our own key (SetLimit's touch: the
// limit changed) or of an older key that waits (the same touch of a waiter
// ahead of ours) or that the read did not see.
//
// A put of an older key that holds is its promote, and changes nothing; a
// put of a key behind ours says that one is queued. A watch served by a
// member that lags delivers what the read already saw: only events after
// seen count.
func (t *Ticket) counted(ctx context.Context, p place, wr clientv3.WatchResponse, ok bool) (place, error) {
	u := p.turn
	stale := false
	switch {
	case !ok && ctx.Err() != nil:
		return place{}, ctx.Err()
	case !ok:
		return place{}, ErrWatchClosed
	case wr.Created:
		// Created at or before the read: every event after it comes.
		stale = wr.Header.Revision > u.seen
	}
	if !stale {
		var next place
		if next, stale = t.follow(u, wr.Events); !stale {
			return next, nil
		}
	}
	next, err := t.read(ctx)
	return changed(p, next), err
}

// follow applies the events of the prefix's watch to the turn u, and
// returns the place they give: held, gone or unchanged; or stale when they
// do not tell it, and the place must be read.
func (t *Ticket) follow(u *turn, events []*clientv3.Event) (p place, stale bool) {
	for _, ev := range After(events, u.seen) {
		key := string(ev.Kv.Key)
		switch {
		case key == t.key && ev.Type == mvccpb.DELETE:
			return place{verdict: gone, seen: ev.Kv.ModRevision}, false
		case key == t.key:
			return place{}, true
		case !t.rule.member(ev.Kv.Key):
		case ev.Type == mvccpb.DELETE:
			u.gone(key)
		case ev.Kv.CreateRevision > t.rev:
			u.next = true
		case !u.holding(key):
			return place{}, true
		}
		u.seen = ev.Kv.ModRevision
	}
	if holds, _ := u.judge(t.rev, t.rule.weight); holds {
		return place{verdict: held, seen: u.seen, next: u.next}, false
	}
	return place{verdict: unchanged}, false
}

// Touch returns the Op that a write of a semaphore's limit record carries
// for each of its first waiters: it puts the waiter's key again, with its
// value and lease, if it is still there at its create revision rev. Every
// waiter that counts its turn from the prefix's events sees the put of its
// own key, or of an older key that waits, and reads its place, with the new
// record, before any later event.
func Touch(key string, rev int64) clientv3.Op {
	return clientv3.OpTxn(
		[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", rev)},
		[]clientv3.Op{clientv3.OpPut(key, "", clientv3.WithIgnoreValue(), clientv3.WithIgnoreLease())},
		nil)
}
