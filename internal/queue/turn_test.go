package queue

import (
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A waiter near the head counts its turn from the queue's events, without
// etcd: which events admit it, which say nothing, and which make it read.

func put(key string, create, mod int64) *clientv3.Event {
	return &clientv3.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte(key), CreateRevision: create, ModRevision: mod}}
}

func del(key string, mod int64) *clientv3.Event {
	return &clientv3.Event{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: []byte(key), ModRevision: mod}}
}

func TestFollow(t *testing.T) {
	const rev, seen = 20, 25
	// Limit 2: a and b hold; c (weight 1) waits ahead of ours.
	older := func() []olderKey {
		return []olderKey{{"l/a", 5, 1}, {"l/b", 6, 1}, {"l/c", 7, 1}}
	}
	for _, tc := range []struct {
		name   string
		weight int
		limit  Limit
		events []*clientv3.Event
		want   verdict // or unread: stale, read the place
		next   bool
	}{
		{"one holder leaves: c is admitted, ours waits", 1, Limit{N: 2}, []*clientv3.Event{del("l/a", 26)}, unchanged, false},
		{"two holders leave: ours is admitted", 1, Limit{N: 2}, []*clientv3.Event{del("l/a", 26), del("l/b", 27)}, held, false},
		{"the waiter ahead leaves, then a holder: admitted", 1, Limit{N: 2}, []*clientv3.Event{del("l/c", 26), del("l/a", 27)}, held, false},
		{"weight 2 needs both permits: one holder and c leaving is not enough", 2, Limit{N: 2}, []*clientv3.Event{del("l/c", 26), del("l/a", 27)}, unchanged, false},
		{"deletes the read saw count for nothing", 1, Limit{N: 2}, []*clientv3.Event{del("l/a", 24), del("l/b", seen)}, unchanged, false},
		{"our key deleted", 1, Limit{N: 2}, []*clientv3.Event{del("l/me", 26), del("l/a", 27), del("l/b", 28)}, gone, false},
		{"our key put again: SetLimit's touch", 1, Limit{N: 2}, []*clientv3.Event{put("l/me", rev, 26), del("l/a", 27), del("l/b", 28)}, unread, false},
		{"a waiting older key put again: SetLimit's touch", 1, Limit{N: 2}, []*clientv3.Event{put("l/c", 7, 26), del("l/a", 27), del("l/b", 28)}, unread, false},
		{"a holding older key put again: its wake-up write", 1, Limit{N: 2}, []*clientv3.Event{put("l/a", 5, 26)}, unchanged, false},
		{"an older key the read did not see", 1, Limit{N: 2}, []*clientv3.Event{put("l/z", 8, 26)}, unread, false},
		{"a key queued behind ours", 1, Limit{N: 2}, []*clientv3.Event{put("l/n", 26, 26), del("l/a", 27), del("l/b", 28)}, held, true},
		{"a nested lock's keys are no permits", 1, Limit{N: 2}, []*clientv3.Event{put("l/x/y", 3, 26), del("l/x/a", 27), del("l/a", 28), del("l/b", 29)}, held, false},
		{"kept keys above a lowered limit: all must leave", 1, Limit{N: 1, Keep: 6}, []*clientv3.Event{del("l/a", 26), del("l/c", 27)}, unchanged, false},
		{"kept keys gone, c gone: admitted at limit 1", 1, Limit{N: 1, Keep: 6}, []*clientv3.Event{del("l/a", 26), del("l/c", 27), del("l/b", 28)}, held, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tk := NewTicket(&Conn{}, Semaphore("l", 2, tc.weight, rejectLimit), "l/me", "")
			tk.set(keyPut, rev)
			u := &turn{seen: seen, limit: tc.limit, recRev: 1000, older: older()}
			got, stale := tk.follow(u, tc.events)
			switch {
			case tc.want == unread && !stale:
				t.Fatalf("follow = %+v; want stale: read the place", got)
			case tc.want == unread:
				return
			case stale:
				t.Fatalf("follow: stale; want %v", tc.want)
			case got.verdict != tc.want || got.next != tc.next:
				t.Fatalf("follow = %+v; want %v, next %v", got, tc.want, tc.next)
			case got.verdict == held && got.seen != tc.events[len(tc.events)-1].Kv.ModRevision:
				t.Errorf("held at %d; want the last event's revision", got.seen)
			}
		})
	}
}
