package queue

import (
	"errors"
	"fmt"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The place computation, without etcd: for every rule, what a read's keys
// say of our key.

func kv(key string, create int64) *mvccpb.KeyValue {
	return &mvccpb.KeyValue{Key: []byte(key), CreateRevision: create, ModRevision: create}
}

func ranges(kvss ...[]*mvccpb.KeyValue) []*pb.ResponseOp {
	var ops []*pb.ResponseOp
	for _, kvs := range kvss {
		ops = append(ops, &pb.ResponseOp{Response: &pb.ResponseOp_ResponseRange{ResponseRange: &pb.RangeResponse{Kvs: kvs}}})
	}
	return ops
}

func keys(kvs ...*mvccpb.KeyValue) []*mvccpb.KeyValue { return kvs }

var errLimit = errors.New("limit")

func rules() map[string]*Rule {
	return map[string]*Rule{
		"mutex":  Lock("l/", "l/"),
		"writer": Lock("l/", "l/read/", "l/write/"),
		"reader": Lock("l/write/", "l/write/"),
		"sem2": Semaphore("l/", 2, func(v []byte) error {
			if string(v) == "bad" {
				return errLimit
			}
			return nil
		}),
	}
}

func TestPlaceNew(t *testing.T) {
	const rev = 20
	for _, tc := range []struct {
		name, rule, key string
		newestFirst     []*mvccpb.KeyValue
		want            place
		err             error
	}{
		{"mutex alone", "mutex", "l/a", keys(kv("l/a", rev)), heldAt(rev), nil},
		{"mutex behind the holder: the window is complete", "mutex", "l/a", keys(kv("l/a", rev), kv("l/b", 7)),
			place{verdict: blocked, seen: rev, watch: "l/b", watchRev: 7, owner: true}, nil},
		{"mutex behind two: the window is full, the newest is watched", "mutex", "l/a", keys(kv("l/a", rev), kv("l/c", 9), kv("l/b", 7)),
			place{verdict: blocked, seen: rev, watch: "l/c", watchRev: 9}, nil},
		{"mutex: a nested lock's key in a complete window is skipped", "mutex", "l/a", keys(kv("l/a", rev), kv("l/x/b", 9)), heldAt(rev), nil},
		{"mutex: a nested key in a full window: unread", "mutex", "l/a", keys(kv("l/a", rev), kv("l/x/b", 9), kv("l/b", 7)), place{}, nil},
		{"mutex: a nested key behind the holder", "mutex", "l/a", keys(kv("l/a", rev), kv("l/b", 9), kv("l/x/b", 7)), place{}, nil},
		{"writer behind a reader", "writer", "l/write/a", keys(kv("l/write/a", rev), kv("l/read/b", 7)),
			place{verdict: blocked, seen: rev, watch: "l/read/b", watchRev: 7, owner: true}, nil},
		{"writer: a key of a lock l/read/x is no reader", "writer", "l/write/a", keys(kv("l/write/a", rev), kv("l/read/x/b", 7)), heldAt(rev), nil},
		{"reader behind a writer", "reader", "l/read/a", keys(kv("l/write/b", 7)),
			place{verdict: blocked, seen: rev, watch: "l/write/b", watchRev: 7, owner: true}, nil},
		{"reader alone among writers' keys: none", "reader", "l/read/a", keys(), heldAt(rev), nil},
		{"a key newer than ours", "mutex", "l/a", keys(kv("l/a", rev), kv("l/b", rev+1)), place{}, ErrMalformed},
		{"our key at another revision", "mutex", "l/a", keys(kv("l/a", rev-1)), place{}, ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := rules()[tc.rule].placeNew(tc.key, ranges(tc.newestFirst), rev)
			if !errors.Is(err, tc.err) || got != tc.want {
				t.Errorf("placeNew = %+v, %v; want %+v, %v", got, err, tc.want, tc.err)
			}
		})
	}
}

func TestPlaceSemaphore(t *testing.T) {
	const rev, seen = 20, 25
	for _, tc := range []struct {
		name        string
		oldestFirst []*mvccpb.KeyValue
		behind      []*mvccpb.KeyValue
		want        place
		err         error
	}{
		{"no older key", keys(), keys(), heldAt(seen), nil},
		{"one older: a permit is free", keys(kv("l/b", 7)), keys(), heldAt(seen), nil},
		{"two older: the head waiter watches every key", keys(kv("l/b", 7), kv("l/c", 8)), keys(),
			place{verdict: blocked, seen: seen, watch: "l/", prefix: true}, nil},
		{"three older: behind the head, watch the predecessor's admission", keys(kv("l/b", 7), kv("l/c", 8), kv("l/d", 9)), keys(),
			place{verdict: blocked, seen: seen, watch: "l/d", puts: true}, nil},
		{"a key behind ours", keys(kv("l/b", 7)), keys(kv("l/e", 22)), place{verdict: held, seen: seen, next: true}, nil},
		{"nested keys do not count", keys(kv("l/b", 7), kv("l/x/c", 8), kv("l/x/d", 9)), keys(), heldAt(seen), nil},
		{"another limit", keys(&mvccpb.KeyValue{Key: []byte("l/b"), Value: []byte("bad"), CreateRevision: 7}), keys(), place{}, errLimit},
		{"an older key at our revision", keys(kv("l/b", rev)), keys(), place{}, ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := rules()["sem2"].placeOlder(ranges(tc.oldestFirst, tc.behind), rev, seen, false)
			if !errors.Is(err, tc.err) || got != tc.want {
				t.Errorf("placeOlder = %+v, %v; want %+v, %v", got, err, tc.want, tc.err)
			}
		})
	}
}

func TestPlaceOlder(t *testing.T) {
	const rev, seen = 20, 25
	for _, tc := range []struct {
		name string
		rule string
		full bool
		kvs  []*mvccpb.KeyValue // newest first, or oldest first if full
		want place
	}{
		{"no older key", "mutex", false, keys(), heldAt(seen)},
		{"the holder only", "mutex", false, keys(kv("l/b", 7)), place{verdict: blocked, seen: seen, watch: "l/b", watchRev: 7, owner: true}},
		{"a full window", "mutex", false, keys(kv("l/c", 9), kv("l/b", 7)), place{verdict: blocked, seen: seen, watch: "l/c", watchRev: 9}},
		{"a nested key in a full window: unread", "mutex", false, keys(kv("l/x/c", 9), kv("l/b", 7)), place{}},
		{"every key, oldest first, nested skipped: the holder", "mutex", true, keys(kv("l/b", 7), kv("l/x/c", 8), kv("l/x/d", 9)),
			place{verdict: blocked, seen: seen, watch: "l/b", watchRev: 7, owner: true}},
		{"every key: two members, the newest watched", "mutex", true, keys(kv("l/b", 7), kv("l/x/c", 8), kv("l/d", 9)),
			place{verdict: blocked, seen: seen, watch: "l/d", watchRev: 9}},
		{"every key: only nested", "mutex", true, keys(kv("l/x/c", 8)), heldAt(seen)},
		{"writer: readers and writers both block", "writer", false, keys(kv("l/write/c", 9), kv("l/read/b", 7)),
			place{verdict: blocked, seen: seen, watch: "l/write/c", watchRev: 9}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := rules()[tc.rule].placeOlder(ranges(tc.kvs), rev, seen, tc.full)
			if err != nil || got != tc.want {
				t.Errorf("placeOlder = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestPlaceFirst(t *testing.T) {
	const seen = 25
	for _, tc := range []struct {
		name, rule string
		kvs        []*mvccpb.KeyValue
		want       place
	}{
		{"empty: a key put now holds", "mutex", keys(), heldAt(seen)},
		{"the oldest is a member: blocked by it", "mutex", keys(kv("l/b", 7)), place{verdict: blocked, seen: seen, watch: "l/b"}},
		{"the oldest is nested: unread", "mutex", keys(kv("l/x/b", 7)), place{}},
		{"semaphore: one of two", "sem2", keys(kv("l/b", 7)), heldAt(seen)},
		{"semaphore: full", "sem2", keys(kv("l/b", 7), kv("l/c", 8)), place{verdict: blocked, seen: seen, watch: "l/", prefix: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := rules()[tc.rule].placeFirst(&pb.RangeResponse{Kvs: tc.kvs}, seen)
			if err != nil || got != tc.want {
				t.Errorf("placeFirst = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
	if _, err := rules()["mutex"].placeFirst(nil, seen); !errors.Is(err, ErrMalformed) {
		t.Errorf("placeFirst(nil) = %v, want ErrMalformed", err)
	}
	p, err := rules()["mutex"].placeAll(&pb.RangeResponse{Kvs: keys(kv("l/x/b", 7), kv("l/c", 8))}, seen)
	if want := (place{verdict: blocked, seen: seen, watch: "l/c", watchRev: 8, owner: true}); err != nil || p != want {
		t.Errorf("placeAll = %+v, %v; want %+v", p, err, want)
	}
}

func TestChanged(t *testing.T) {
	p := place{verdict: blocked, seen: 5, watch: "l/b", watchRev: 3, owner: true}
	same := place{verdict: blocked, seen: 9, watch: "l/b", watchRev: 3, owner: true}
	if got := changed(p, same); got.verdict != unchanged {
		t.Errorf("changed(same watch) = %+v, want unchanged", got)
	}
	for _, next := range []place{
		heldAt(9),
		{verdict: gone},
		{verdict: blocked, seen: 9, watch: "l/c"},
		{verdict: blocked, seen: 9, watch: "l/b", watchRev: 3}, // no longer the holder's only waiter
	} {
		if got := changed(p, next); got != next {
			t.Errorf("changed(%+v) = %+v, want it", next, got)
		}
	}
}

func TestAfter(t *testing.T) {
	ev := func(rev int64) *clientv3.Event { return &clientv3.Event{Kv: kv(fmt.Sprint("l/", rev), rev)} }
	events := []*clientv3.Event{ev(3), ev(5), ev(8)}
	for rev, want := range map[int64]int{0: 3, 3: 2, 4: 2, 5: 1, 8: 0, 9: 0} {
		if got := len(After(events, rev)); got != want {
			t.Errorf("After(events at 3, 5, 8; %d) has %d events, want %d", rev, got, want)
		}
	}
}
