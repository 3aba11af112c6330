package queue

import (
	"errors"
	"fmt"
	"math"
	"slices"
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
		"sem2":   Semaphore("l", 2, 1, rejectLimit),
		"sem4w3": Semaphore("l", 4, 3, rejectLimit),
	}
}

func rejectLimit([]byte) error { return errLimit }

// permit returns a permit's key of a semaphore of limit, with weight.
func permit(key string, create int64, limit, weight int) *mvccpb.KeyValue {
	return &mvccpb.KeyValue{Key: []byte(key), CreateRevision: create, ModRevision: create, Value: []byte(SemaphoreValue(limit, weight, "id"))}
}

// record returns a limit record.
func record(l Limit) []*mvccpb.KeyValue {
	return keys(&mvccpb.KeyValue{Key: []byte(LimitKey("l")), CreateRevision: 3, ModRevision: 1000, Value: []byte(l.Value())})
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
	p := func(key string, create int64) *mvccpb.KeyValue { return permit(key, create, 2, 1) }
	p4 := func(key string, create int64, w int) *mvccpb.KeyValue { return permit(key, create, 4, w) }
	// A waiter near the head counts its turn from the prefix's events.
	near := func(ahead int) place {
		return place{verdict: blocked, seen: seen, watch: "l/", ahead: ahead}
	}
	head := near(0)
	// queue returns the keys of 2 holders and n waiters of limit 2.
	queue := func(n int) []*mvccpb.KeyValue {
		var kvs []*mvccpb.KeyValue
		for i := range 2 + n {
			kvs = append(kvs, p(fmt.Sprintf("l/k%02d", i), int64(1+i)))
		}
		return kvs
	}
	for _, tc := range []struct {
		name        string
		rule        string
		oldestFirst []*mvccpb.KeyValue
		behind      []*mvccpb.KeyValue
		rec         []*mvccpb.KeyValue
		want        place
		err         error
	}{
		{"no older key", "sem2", keys(), keys(), nil, heldAt(seen), nil},
		{"one older: a permit is free", "sem2", keys(p("l/b", 7)), keys(), nil, heldAt(seen), nil},
		{"two older: the head waiter watches every key", "sem2", keys(p("l/b", 7), p("l/c", 8)), keys(), nil, head, nil},
		{"three older: one waits ahead, near the head", "sem2", keys(p("l/b", 7), p("l/c", 8), p("l/d", 9)), keys(), nil, near(1), nil},
		{"7 wait ahead: near the head", "sem2", queue(7), keys(), nil, near(7), nil},
		{"8 wait ahead: watch the predecessor's admission", "sem2", queue(8), keys(), nil,
			place{verdict: blocked, seen: seen, watch: "l/k09", ahead: 8}, nil},
		{"a key behind ours", "sem2", keys(p("l/b", 7)), keys(kv("l/e", 22)), nil, place{verdict: held, seen: seen, next: true}, nil},
		{"nested keys do not count", "sem2", keys(p("l/b", 7), kv("l/x/c", 8), kv("l/x/d", 9)), keys(), nil, heldAt(seen), nil},
		{"another limit", "sem2", keys(permit("l/b", 7, 3, 1)), keys(), nil, place{}, errLimit},
		{"no permit's key", "sem2", keys(&mvccpb.KeyValue{Key: []byte("l/b"), Value: []byte("bad"), CreateRevision: 7}), keys(), nil, place{}, errLimit},
		{"an older key at our revision", "sem2", keys(p("l/b", rev)), keys(), nil, place{}, ErrMalformed},

		// Weights: 3 of 4 permits for our key.
		{"weight 3: one permit held, 3 fit", "sem4w3", keys(p4("l/b", 7, 1)), keys(), nil, heldAt(seen), nil},
		{"weight 3: two held, the head", "sem4w3", keys(p4("l/b", 7, 1), p4("l/c", 8, 1)), keys(), nil, head, nil},
		{"weight 3 behind a waiting weight 4: FIFO, behind the head", "sem4w3", keys(p4("l/b", 7, 1), p4("l/c", 8, 4)), keys(), nil, near(1), nil},
		{"a weight above the limit counts as the limit: it held alone", "sem4w3", keys(p4("l/b", 7, 9)), keys(), nil, head, nil},

		// A limit record rules, whatever the keys say.
		{"record raises 2 to 3", "sem2", keys(p("l/b", 7), p("l/c", 8)), keys(), record(Limit{N: 3}), heldAt(seen), nil},
		{"record lowers 2 to 1: the head", "sem2", keys(p("l/b", 7)), keys(), record(Limit{N: 1, Keep: 7}), head, nil},
		{"record with other limits in the keys: no mismatch", "sem2", keys(permit("l/b", 7, 5, 1)), keys(), record(Limit{N: 2}), heldAt(seen), nil},
		{"kept keys above a lowered limit hold: new ones wait at the head", "sem2", keys(p("l/b", 7), p("l/c", 8)), keys(), record(Limit{N: 1, Keep: 8}), head, nil},
		{"kept keys: behind a waiter", "sem2", keys(p("l/b", 7), p("l/c", 8), p("l/d", 9)), keys(), record(Limit{N: 1, Keep: 8}), near(1), nil},
		{"our key kept", "sem2", keys(p("l/b", 7), p("l/c", 8)), keys(), record(Limit{N: 1, Keep: rev}), heldAt(seen), nil},
		{"a malformed record", "sem2", keys(), keys(), keys(&mvccpb.KeyValue{Key: []byte(LimitKey("l")), Value: []byte("limit=x")}), place{}, ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := rules()[tc.rule].placeOlder(ranges(tc.oldestFirst, tc.behind, tc.rec), rev, seen, false)
			if (got.turn != nil) != (got.watch == "l/" && got.verdict == blocked) {
				t.Errorf("placeOlder = %+v: a turn, and a watch of the prefix, only near the head", got)
			}
			if got.turn != nil && (got.turn.seen != seen || got.turn.next != got.next) {
				t.Errorf("placeOlder's turn = %+v; want seen %d, next %v", *got.turn, seen, got.next)
			}
			got.turn = nil
			if !errors.Is(err, tc.err) || got != tc.want {
				t.Errorf("placeOlder = %+v, %v; want %+v, %v", got, err, tc.want, tc.err)
			}
		})
	}
}

// TestHolders: which keys of a semaphore hold, as Inspect shows them, for
// every record and weight; the holders are always the oldest keys.
func TestHolders(t *testing.T) {
	for _, tc := range []struct {
		name string
		kvs  []*mvccpb.KeyValue
		rec  []*mvccpb.KeyValue
		want []bool
	}{
		{"limit 2 of the keys", keys(permit("l/a", 5, 2, 1), permit("l/b", 6, 2, 1), permit("l/c", 7, 2, 1)), nil, []bool{true, true, false}},
		{"weights: 1+2 of 3, then 1 waits", keys(permit("l/a", 5, 3, 1), permit("l/b", 6, 3, 2), permit("l/c", 7, 3, 1)), nil, []bool{true, true, false}},
		{"FIFO: a weight 3 waits, the 1 behind it too", keys(permit("l/a", 5, 3, 1), permit("l/b", 6, 3, 3), permit("l/c", 7, 3, 1)), nil, []bool{true, false, false}},
		{"a Mutex's keys: the oldest holds", keys(kv("l/a", 5), kv("l/b", 6)), nil, []bool{true, false}},
		{"a record of 1 keeping two", keys(permit("l/a", 5, 2, 1), permit("l/b", 6, 2, 1), permit("l/c", 7, 2, 1)), record(Limit{N: 1, Keep: 6}), []bool{true, true, false}},
		{"a record of 3", keys(permit("l/a", 5, 2, 1), permit("l/b", 6, 2, 1), permit("l/c", 7, 2, 1)), record(Limit{N: 3}), []bool{true, true, true}},
		{"no key", keys(), record(Limit{N: 3}), []bool{}},
		{"a keep above the record's own revision is clamped to it", keys(permit("l/a", 5, 2, 1), permit("l/b", 6, 2, 1)),
			keys(&mvccpb.KeyValue{Key: []byte(LimitKey("l")), ModRevision: 5, Value: []byte(Limit{N: 1, Keep: 99}.Value())}), []bool{true, false}},
		{"weights near the largest int do not overflow", keys(permit("l/a", 5, math.MaxInt, math.MaxInt/2+1), permit("l/b", 6, math.MaxInt, math.MaxInt/2+1)), nil, []bool{true, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rec *mvccpb.KeyValue
			if len(tc.rec) == 1 {
				rec = tc.rec[0]
			}
			if got := Holders(tc.kvs, rec); !slices.Equal(got, tc.want) {
				t.Errorf("Holders = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestValues: a permit's value and a limit record read back what was
// written, and refuse what is not theirs.
func TestValues(t *testing.T) {
	for _, w := range []int{1, 2, 1000} {
		limit, weight, id, ok := ParseSemaphoreValue([]byte(SemaphoreValue(4, w, "host-1\nx")))
		if !ok || limit != 4 || weight != w || id != "host-1\nx" {
			t.Errorf("weight %d: read back %d, %d, %q, %v", w, limit, weight, id, ok)
		}
	}
	if got := SemaphoreValue(4, 1, "id"); got != "limit=4\nid" {
		t.Errorf("a single permit's value = %q, want the form every version reads", got)
	}
	for _, v := range []string{"", "limit=", "limit=0", "limit=-1", "limit=04", "limit=4;weight=0", "limit=4;weight=x", "limit=4;weight=", "weight=2", "lock"} {
		if _, _, _, ok := ParseSemaphoreValue([]byte(v)); ok {
			t.Errorf("ParseSemaphoreValue(%q) ok, want not a permit's", v)
		}
	}
	for _, l := range []Limit{{N: 1}, {N: 7, Keep: 1234}} {
		if got, ok := ParseLimit([]byte(l.Value())); !ok || got != l {
			t.Errorf("ParseLimit(%q) = %+v, %v", l.Value(), got, ok)
		}
	}
	for _, v := range []string{"", "limit=0 keep=1", "limit=2", "limit=2 keep=-1", "limit=2 keep=01", "limit=2 keep=x", "2 keep=1"} {
		if _, ok := ParseLimit([]byte(v)); ok {
			t.Errorf("ParseLimit(%q) ok, want not a record", v)
		}
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
		{"semaphore: one of two", "sem2", keys(permit("l/b", 7, 2, 1)), heldAt(seen)},
		{"semaphore: full", "sem2", keys(permit("l/b", 7, 2, 1), permit("l/c", 8, 2, 1)), place{verdict: blocked, seen: seen, watch: "l/"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			replies := ranges(tc.kvs)
			if tc.rule == "sem2" {
				replies = ranges(tc.kvs, keys()) // and no limit record
			}
			got, err := rules()[tc.rule].placeFirst(replies, seen)
			got.turn = nil
			if err != nil || got != tc.want {
				t.Errorf("placeFirst = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
	if _, err := rules()["mutex"].placeFirst(nil, seen); !errors.Is(err, ErrMalformed) {
		t.Errorf("placeFirst(nil) = %v, want ErrMalformed", err)
	}
	if _, err := rules()["sem2"].placeFirst(ranges(keys()), seen); !errors.Is(err, ErrMalformed) {
		t.Errorf("a semaphore's placeFirst without the record's reply = %v, want ErrMalformed", err)
	}
	p, err := rules()["mutex"].placeAll(ranges(keys(kv("l/x/b", 7), kv("l/c", 8))), seen)
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
