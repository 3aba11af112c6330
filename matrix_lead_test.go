package etcdlock_test

import (
	"fmt"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// The fault matrix of Lead's hand-over and term count: each etcd call they
// add (seams_test.go: term-read, term, aside, handover, the hand-over's
// queue-read, and grant: the lease of the count, which the first claim
// grants), each with its reply lost, dropped, or applied late, on the
// client of the candidate x that makes it; judged in etcd: who leads next
// (the holder's key as etcd has it when f begins), the term count's Version
// against the terms that ran f, no record and no key left once every late
// request has been applied, and never two f at once (duties).
//
//   - term-read, term, grant, queue-read, handover: x leads first (its
//     claim faulted), then hands over to t, queued behind h;
//   - aside: l leads, hands over to t, queued behind x; x holds, and its
//     check that t is queued is faulted.
//
// Either way t leads the second term, and nobody else runs f.

func TestLeadFaultMatrix(t *testing.T) {
	testflags.Parallel(t)
	srv, healthy := startServer(t)
	for _, c := range []call{callTermRead, callTerm, callGrant, callQueueRead, callHandOver, callAside} {
		for _, f := range []fault{faultLost, faultDropped, faultLate} {
			t.Run(fmt.Sprintf("%s/%s", c, f), func(t *testing.T) {
				t.Parallel()
				ctx := testContext(t)
				name := lockName(t)
				nth := 1
				if c == callGrant {
					nth = 2 // the first is the grant of x's Session
				}
				sm := newSeam(c, f, nth)
				sm.enter(phaseHold, nil)
				faulted := serverClient(t, srv, sm.unary, sm.stream)
				d := newDuties(t, healthy, name)
				x := func() *candidate {
					return campaign(ctx, faulted, name, d.f("x"), etcdlock.WithTTL(matrixTTL), etcdlock.WithIdentity("x"))
				}
				var cands []*candidate // stopped in this order: t last
				first, second := x, func() *candidate { return leadAs(ctx, healthy, name, "h", d) }
				leader := "x"
				if c == callAside {
					first, second = func() *candidate { return leadAs(ctx, healthy, name, "l", d) }, x
					leader = "l"
				}
				cands = append(cands, first())
				if r := d.next(); r.who != leader || r.term != 1 || r.etcdTerm != 1 {
					t.Errorf("the first term: got %+v, want %s's, counted 1 in etcd", r, leader)
				}
				// A late put of the first claim applies while the first
				// leader still holds: it counts nothing.
				sm.settle()
				if n := termCount(t, healthy, name); n != 1 {
					t.Errorf("the term count in etcd during the first term, every late request applied: got %d, want 1", n)
				}
				cands = append(cands, second())
				queued(t, healthy, name, 2)
				tc := leadAs(ctx, healthy, name, "t", d)
				target := identified(t, queued(t, healthy, name, 3), "t")
				d.end(leader, etcdlock.HandOver("t"))
				got := d.next()
				if got.who != "t" || got.leader != target.Key || got.token != target.Token {
					t.Errorf("after %s handed over to t: got %+v, want t leading with %s@%d", leader, got, target.Key, target.Token)
				}
				if got.term != 2 || got.etcdTerm != 2 || got.record != "" {
					t.Errorf("t's term: got TermFrom %d, etcd %d, record %q; want 2, 2, none", got.term, got.etcdTerm, got.record)
				}
				// A late put of the hand-over applies after t began: it
				// writes no record.
				sm.settle()
				rec, _ := recordKeys(name)
				if resp, err := healthy.Get(ctx, rec); err != nil || len(resp.Kvs) != 0 {
					t.Errorf("the hand-over record while t leads, every late request applied: got %v, %v; want none", resp, err)
				}
				if n := sm.fires(); n != 1 {
					t.Errorf("the fault fired %d times, want once", n)
				}
				for _, cand := range append(cands, tc) {
					_ = cand.stop(t)
				}
				sm.settle()
				if keys := lockKeys(t, healthy, name); len(keys) != 0 {
					t.Errorf("keys once every candidate stopped: got %q, want none", keys)
				}
				if resp, err := healthy.Get(ctx, rec); err != nil || len(resp.Kvs) != 0 {
					t.Errorf("the hand-over record once every late request applied: got %v, %v; want none", resp, err)
				}
				if n := termCount(t, healthy, name); n != 2 {
					t.Errorf("the term count once every late request applied: got %d, want 2", n)
				}
			})
		}
	}
}

// termCount returns the Version of the term key of name in etcd: the count
// of Lead's terms. A count with no lease fails the test: it would never end.
func termCount(t *testing.T, client *clientv3.Client, name string) int64 {
	t.Helper()
	_, term := recordKeys(name)
	resp, err := client.Get(testContext(t), term)
	if err != nil {
		t.Fatalf("read the term count: %v", err)
	}
	if len(resp.Kvs) == 0 {
		return 0
	}
	if resp.Kvs[0].Lease == 0 {
		t.Errorf("the term count %s has no lease", term)
	}
	return resp.Kvs[0].Version
}
