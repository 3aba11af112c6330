package etcdtest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// serializableRev returns the revision member cli's endpoint has applied,
// and the value of key there.
func serializableRev(t *testing.T, cli *clientv3.Client, key string) (int64, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	resp, err := cli.Get(ctx, key, clientv3.WithSerializable())
	if err != nil {
		t.Fatalf("serializable get %q: got %v, want nil", key, err)
	}
	val := ""
	if len(resp.Kvs) == 1 {
		val = string(resp.Kvs[0].Value)
	}
	return resp.Header.Revision, val
}

// TestClusterLag lags a follower while another member takes writes: the
// follower keeps answering serializable reads and its watch, from the old
// revision, and once it catches up it has every write and the watch gets
// every event, in order.
func TestClusterLag(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	lead := c.Leader()
	if lead < 0 {
		t.Fatal("leader: got -1, want a member")
	}
	lagging, other := (lead+1)%3, (lead+2)%3
	eps := c.Endpoints()
	w, r := singleClient(t, eps[other], nil), singleClient(t, eps[lagging], nil)
	key := t.Name()

	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	resp, err := w.Put(ctx, key, "before")
	if err != nil {
		t.Fatalf("put: got %v, want nil", err)
	}
	before := resp.Header.Revision
	for rev, _ := serializableRev(t, r, key); rev < before; rev, _ = serializableRev(t, r, key) {
		time.Sleep(10 * time.Millisecond)
	}
	wch := r.Watch(ctx, key, clientv3.WithRev(before+1))

	c.Lag(lagging)
	c.Lag(lagging) // a no-op
	const writes = 5
	var last int64
	for i := range writes {
		resp, err := w.Put(ctx, key, fmt.Sprint(i))
		if err != nil {
			t.Fatalf("put %d while member %d lags: got %v, want nil", i, lagging, err)
		}
		last = resp.Header.Revision
	}
	if got := c.Leader(); got != lead {
		t.Fatalf("leader while member %d lags: got %d, want %d", lagging, got, lead)
	}
	select {
	case resp := <-wch:
		t.Fatalf("watch on the lagging member: got %d events (err %v), want none before CatchUp", len(resp.Events), resp.Err())
	case <-time.After(300 * time.Millisecond):
	}
	if rev, val := serializableRev(t, r, key); rev != before || val != "before" {
		t.Fatalf("serializable get on the lagging member: got revision %d, %q; want %d, %q", rev, val, before, "before")
	}
	if err := getErr(t, r, key, 300*time.Millisecond); err == nil {
		t.Fatal("linearizable get through the lagging member: got nil error, want a failure")
	}

	c.CatchUp(lagging)
	c.CatchUp(lagging) // a no-op
	caughtUp := time.Now()
	for got := 0; got < writes; {
		select {
		case resp := <-wch:
			if err := resp.Err(); err != nil {
				t.Fatalf("watch after CatchUp: got %v, want events", err)
			}
			for _, ev := range resp.Events {
				if want := fmt.Sprint(got); string(ev.Kv.Value) != want {
					t.Fatalf("watch event %d after CatchUp: got %q, want %q", got, ev.Kv.Value, want)
				}
				got++
			}
		case <-time.After(opTimeout):
			t.Fatalf("watch after CatchUp: got %d events in %v, want %d", got, opTimeout, writes)
		}
	}
	if rev, val := serializableRev(t, r, key); rev < last || val != fmt.Sprint(writes-1) {
		t.Fatalf("serializable get after CatchUp: got revision %d, %q; want ≥ %d, %q", rev, val, last, fmt.Sprint(writes-1))
	}
	t.Logf("member %d caught up %d writes in %v", lagging, writes, time.Since(caughtUp).Round(time.Millisecond))
	put(t, r, key, "through the member that lagged")
	if got := c.Leader(); got != lead {
		t.Fatalf("leader after CatchUp: got %d, want %d", got, lead)
	}
}

// TestClusterCloseWhileLagging closes a cluster whose follower lags with
// messages held for it: Close drops them, and goleak finds nothing left.
func TestClusterCloseWhileLagging(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	lagging := (c.Leader() + 1) % 3
	c.Lag(lagging)
	cli := singleClient(t, c.Endpoints()[(lagging+1)%3], nil)
	for i := range 3 {
		putRetry(t, cli, t.Name(), fmt.Sprint(i))
	}
	c.Close()
}

// TestClusterRestartLagging: a lag outlives Stop, and Restart refuses a
// member that lags, which could never become ready.
func TestClusterRestartLagging(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	lagging := (c.Leader() + 1) % 3
	c.Lag(lagging)
	c.Stop(lagging)
	func() {
		defer func() {
			if recover() == nil {
				t.Errorf("Restart(%d) of a member that lags: got no panic, want one", lagging)
			}
		}()
		c.Restart(lagging)
	}()
	c.CatchUp(lagging)
	c.Restart(lagging)
	put(t, singleClient(t, c.Endpoints()[lagging], nil), t.Name(), "v")
}
