package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/handover"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// Leaders that hand over: StepDown, HandOver and the term count, judged in
// etcd (the queue, the records, the leases), never by Lead's own report.

// recordKeys returns the keys of the hand-over record and of the term count
// of the lock name.
func recordKeys(name string) (record, term string) {
	esc := strings.NewReplacer("%", "%25", "/", "%2F").Replace(name)
	return "etcdlock.handover." + esc, "etcdlock.term." + esc
}

// A termRun is one term of a candidate's f, with etcd's view as it began.
type termRun struct {
	who      string
	term     int64 // TermFrom
	token    int64 // HoldFrom
	leader   string
	etcdTerm int64  // the Version of the term key in etcd
	record   string // the hand-over record in etcd, "" if none
}

// duties are the candidates' f of a test: each records its terms, fails
// the test if another f runs, and ends its term when told, with what it is
// told to return.
type duties struct {
	t      *testing.T
	client *clientv3.Client
	name   string

	mu      sync.Mutex
	running string
	ends    map[string]chan error
	started chan termRun
}

func newDuties(t *testing.T, client *clientv3.Client, name string) *duties {
	return &duties{t: t, client: client, name: name, ends: map[string]chan error{}, started: make(chan termRun, 64)}
}

func (d *duties) endOf(who string) chan error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ends[who] == nil {
		d.ends[who] = make(chan error, 4)
	}
	return d.ends[who]
}

// end has who's running term end with f returning err.
func (d *duties) end(who string, err error) { d.endOf(who) <- err }

func (d *duties) f(who string) func(ctx context.Context) error {
	end := d.endOf(who)
	return func(ctx context.Context) error {
		r := termRun{who: who}
		var ok bool
		if r.term, ok = etcdlock.TermFrom(ctx); !ok || r.term <= 0 {
			d.t.Errorf("%s: TermFrom: got %d, %v, want a count > 0", who, r.term, ok)
		}
		h, _ := etcdlock.HoldFrom(ctx)
		r.token = h.Token
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), testTimeout)
		if l, err := etcdlock.LeaderOf(rctx, d.client, d.name); err == nil {
			r.leader = l.Key
		}
		rec, term := recordKeys(d.name)
		if resp, err := d.client.Get(rctx, term); err == nil && len(resp.Kvs) == 1 {
			r.etcdTerm = resp.Kvs[0].Version
		}
		if resp, err := d.client.Get(rctx, rec); err == nil && len(resp.Kvs) == 1 {
			r.record = string(resp.Kvs[0].Value)
		}
		cancel()
		d.mu.Lock()
		if d.running != "" {
			d.t.Errorf("%s's f runs while %s's still runs", who, d.running)
		}
		d.running = who
		d.mu.Unlock()
		d.started <- r
		// f reports progress while it waits: a watchdog (WithWatchdog)
		// judges Lead's own calls, never a slow test.
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		var err error
	wait:
		for {
			select {
			case <-ctx.Done():
				break wait
			case err = <-end:
				break wait
			case <-tick.C:
				etcdlock.Progress(ctx)
			}
		}
		d.mu.Lock()
		d.running = ""
		d.mu.Unlock()
		return err
	}
}

// next waits for the next term to begin.
func (d *duties) next() termRun {
	d.t.Helper()
	select {
	case r := <-d.started:
		return r
	case <-time.After(testTimeout):
		d.t.Fatalf("no term began within %v", testTimeout)
	}
	return termRun{}
}

// quiet fails the test if a term begins within dur.
func (d *duties) quiet(dur time.Duration, why string) {
	d.t.Helper()
	select {
	case r := <-d.started:
		d.t.Fatalf("%s: %s's f ran (term %d), want none", why, r.who, r.term)
	case <-time.After(dur):
	}
}

// queued waits until n keys are in the lock's queue, and returns them,
// oldest first.
func queued(t *testing.T, client *clientv3.Client, name string, n int) []etcdlock.QueueEntry {
	t.Helper()
	var e []etcdlock.QueueEntry
	eventually(t, "the queue", func() bool { e = inspect(t, testContext(t), client, name); return len(e) == n })
	return e
}

// identified returns the entry with identity id.
func identified(t *testing.T, entries []etcdlock.QueueEntry, id string) etcdlock.QueueEntry {
	t.Helper()
	e, ok := find(entries, id)
	if !ok {
		t.Fatalf("no entry of %q in %+v", id, entries)
	}
	return e
}

// find returns the entry with identity id, and false if there is none.
func find(entries []etcdlock.QueueEntry, id string) (etcdlock.QueueEntry, bool) {
	for _, e := range entries {
		if e.Identity == id {
			return e, true
		}
	}
	return etcdlock.QueueEntry{}, false
}

// leadAs campaigns as who (its identity) on a Session of TTL 5 s.
func leadAs(ctx context.Context, client *clientv3.Client, name, who string, d *duties, opts ...etcdlock.SessionOption) *candidate {
	return campaign(ctx, client, name, d.f(who), append([]etcdlock.SessionOption{etcdlock.WithTTL(5 * time.Second), etcdlock.WithIdentity(who)}, opts...)...)
}

// TestStepDown: with nobody else queued, a leader that steps down has no
// key in etcd's queue for the pause, then leads again; with a candidate
// queued, the candidate leads next, never while the old leader's f runs.
func TestStepDown(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	d := newDuties(t, client, name)
	a := leadAs(ctx, client, name, "a", d)
	first := d.next()
	const pause = 800 * time.Millisecond
	d.end("a", etcdlock.StepDown(pause))
	returned := time.Now()
	eventually(t, "a's key gone", func() bool { return len(lockKeys(t, client, name)) == 0 })
	// a's pause begins after d.end returns: a read that ends before the
	// pause is over finds no key of a's. One that ends later proves nothing
	// (on a loaded machine, a read begun in the pause may end after it).
	for {
		keys := lockKeys(t, client, name)
		at := time.Since(returned)
		if at >= pause {
			break
		}
		if len(keys) != 0 {
			t.Fatalf("the queue %v after a stepped down for %v: got %q, want it empty", at, pause, keys)
		}
		time.Sleep(20 * time.Millisecond)
	}
	again := d.next()
	if took := time.Since(returned); took < pause {
		t.Errorf("a led again %v after it stepped down for %v", took, pause)
	}
	if again.who != "a" || again.token <= first.token || again.leader == "" || again.term != first.term+1 {
		t.Errorf("the term after the pause: got %+v after %+v, want a again, a new token, the next term", again, first)
	}

	b := leadAs(ctx, client, name, "b", d)
	queued(t, client, name, 2)
	d.end("a", etcdlock.StepDown(time.Minute))
	next := d.next()
	if next.who != "b" {
		t.Fatalf("after a stepped down with b queued: got %+v, want b leading", next)
	}
	if e := queued(t, client, name, 1); e[0].Identity != "b" || !e[0].Holds || e[0].Key != next.leader || e[0].Token != next.token {
		t.Errorf("etcd's queue while a pauses: got %+v, want b alone, holding with the token of its f", e)
	}
	if next.term != again.term+1 || next.etcdTerm != next.term {
		t.Errorf("b's term: got TermFrom %d, etcd %d, want %d", next.term, next.etcdTerm, again.term+1)
	}
	for who, c := range map[string]*candidate{"a": a, "b": b} {
		if err := c.stop(t); !errors.Is(err, context.Canceled) {
			t.Errorf("Lead of %s: got %v, want context.Canceled", who, err)
		}
	}
	if keys := lockKeys(t, client, name); len(keys) != 0 {
		t.Errorf("keys after every candidate stopped: got %q, want none", keys)
	}
}

// TestHandOver: a leader hands over to a candidate queued behind two
// others; those two hold the lock in turn, step aside without running f
// and queue again behind it; the named one leads next, deletes the record,
// and counts the second term. A hand-over by key works the same; one to a
// candidate not queued is a plain step down.
func TestHandOver(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	d := newDuties(t, client, name)
	var mu sync.Mutex
	var events []etcdlock.Event
	observe := etcdlock.WithObserver(etcdlock.ObserverFunc(func(e etcdlock.Event) {
		switch e.Kind {
		case etcdlock.TermStarted, etcdlock.HandedOver, etcdlock.SteppedAside:
			mu.Lock()
			events = append(events, e)
			mu.Unlock()
		}
	}))
	cands := map[string]*candidate{"a": leadAs(ctx, client, name, "a", d, observe)}
	first := d.next()
	for i, who := range []string{"b", "c", "d"} {
		cands[who] = leadAs(ctx, client, name, who, d, observe)
		queued(t, client, name, i+2)
	}
	before := identified(t, inspect(t, ctx, client, name), "d")
	fctx, stopFollowing := context.WithCancel(ctx)
	defer stopFollowing()
	leaders := etcdlock.FollowLeader(fctx, client, name)
	if l := <-leaders; l.Identity != "a" {
		t.Fatalf("FollowLeader before the hand-over: got %+v, want a", l)
	}
	d.end("a", etcdlock.HandOver("d"))
	got := d.next()
	if got.who != "d" || got.leader != before.Key || got.token != before.Token {
		t.Fatalf("after a handed over to d: got %+v, want d leading with its key %s@%d", got, before.Key, before.Token)
	}
	if got.term != first.term+1 || got.etcdTerm != got.term || got.record != "" {
		t.Errorf("d's term: got TermFrom %d, etcd %d, record %q; want %d, %d, none", got.term, got.etcdTerm, got.record, first.term+1, first.term+1)
	}
	// Followers see the change as any other: d leads (after b and c, for
	// the moment each held).
	sawD := false
	for l := range leaders {
		if l.Key == before.Key {
			sawD = true
			break
		}
		if l.Identity != "b" && l.Identity != "c" && l.Key != "" {
			t.Errorf("FollowLeader during the hand-over: got %+v, want b, c (giving way), or d", l)
		}
	}
	if !sawD {
		t.Errorf("FollowLeader never showed d leading")
	}
	stopFollowing()
	// b and c held the lock and gave way: they queued again, behind d.
	e := queued(t, client, name, 4)
	for _, who := range []string{"b", "c", "a"} {
		if c := identified(t, e, who); c.Token <= got.token || c.Holds {
			t.Errorf("%s in etcd's queue: %+v, want it waiting behind d (token %d)", who, c, got.token)
		}
	}

	// By key: to c, queued behind b.
	target := identified(t, e, "c")
	d.end("d", etcdlock.HandOver(target.Key))
	if got = d.next(); got.who != "c" || got.token != target.Token || got.etcdTerm != first.term+2 {
		t.Errorf("after d handed over to c's key: got %+v, want c with token %d in term %d", got, target.Token, first.term+2)
	}

	// To nobody queued: the next in the queue leads.
	e = queued(t, client, name, 4)
	d.end("c", etcdlock.HandOver("nobody"))
	if got = d.next(); got.leader != e[1].Key {
		t.Errorf("after a hand-over to nobody: got %+v, want the next in the queue, %s", got, e[1].Key)
	}
	for _, c := range cands {
		_ = c.stop(t)
	}
	if keys := lockKeys(t, client, name); len(keys) != 0 {
		t.Errorf("keys after every candidate stopped: got %q, want none", keys)
	}
	mu.Lock()
	defer mu.Unlock()
	var kinds []string
	for _, e := range events {
		kinds = append(kinds, string(e.Kind)+":"+e.Target)
	}
	t.Logf("events: %v", kinds)
	asides := 0
	terms := map[int64]bool{}
	for _, e := range events {
		if e.Kind == etcdlock.SteppedAside {
			asides++
		}
		if e.Kind == etcdlock.TermStarted {
			terms[e.Term] = true
		}
		if e.Kind == etcdlock.HandedOver && e.Target == "" && e.Err != nil {
			t.Errorf("HandedOver to nobody: Err %v, want none", e.Err)
		}
	}
	// a, d, c, the next in the queue; then maybe more, where candidates
	// led while the others were being stopped. Those may leave a gap: a
	// candidate stopped as its term's count is put counts the term without
	// starting it (TermFrom).
	for n := int64(1); n <= 4; n++ {
		if !terms[n] {
			t.Errorf("TermStarted events: terms %v, want every term from 1 to 4", terms)
			break
		}
	}
	if asides < 3 { // b and c for d, at least one for c
		t.Errorf("SteppedAside events: got %d, want at least 3", asides)
	}
}

// TestHandOverTargetGone: the candidate handed over to (a key put by hand,
// a waiter that never leads) goes after the record was written: its lease
// revoked (the record goes with it), or its key deleted by hand (the
// record then names a key gone). Either way, the next candidate in the
// queue leads (the one that stepped aside, or the old leader, queued again
// after its pause), and no record is left.
func TestHandOverTargetGone(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	for _, how := range []string{"revoked", "deleted"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			name := lockName(t)
			d := newDuties(t, client, name)
			a := leadAs(ctx, client, name, "a", d)
			first := d.next()
			b := leadAs(ctx, client, name, "b", d)
			queued(t, client, name, 2)
			lease, err := client.Grant(ctx, 30)
			if err != nil {
				t.Fatal(err)
			}
			defer client.Revoke(context.WithoutCancel(ctx), lease.ID)
			tkey := keyOf(name, lease.ID)
			if _, err := client.Put(ctx, tkey, "t", clientv3.WithLease(lease.ID)); err != nil {
				t.Fatal(err)
			}
			target := identified(t, queued(t, client, name, 3), "t")
			d.end("a", etcdlock.HandOver("t"))

			// b held, stepped aside: the target holds, b waits behind it,
			// and the record names the target, on its lease.
			rec, _ := recordKeys(name)
			eventually(t, "the target holding, b behind it", func() bool {
				e := inspect(t, ctx, client, name)
				b, ok := find(e, "b")
				return ok && e[0].Key == tkey && e[0].Holds && b.Token > target.Token
			})
			resp, err := client.Get(ctx, rec)
			if err != nil || len(resp.Kvs) != 1 || clientv3.LeaseID(resp.Kvs[0].Lease) != lease.ID || !strings.HasSuffix(string(resp.Kvs[0].Value), " "+tkey) {
				t.Fatalf("the record: got %v, %v; want one naming %s on its lease %x", resp, err, tkey, lease.ID)
			}
			d.quiet(300*time.Millisecond, "the target holds")
			// Next behind the target: b, or a, which queued again after its
			// pause, maybe before b queued again.
			next := inspect(t, ctx, client, name)[1]

			if how == "revoked" {
				_, err = client.Revoke(ctx, lease.ID)
			} else {
				_, err = client.Delete(ctx, tkey)
			}
			if err != nil {
				t.Fatal(err)
			}
			got := d.next()
			if got.leader != next.Key || got.token != next.Token || got.record != "" || got.term != first.term+1 || got.etcdTerm != got.term {
				t.Errorf("after the target's key went (%s): got %+v, want %s (%s) leading in term %d, no record", how, got, next.Identity, next.Key, first.term+1)
			}
			if how == "deleted" {
				ttl, err := client.TimeToLive(ctx, lease.ID)
				if err != nil || ttl.TTL <= 0 {
					t.Errorf("the target's lease: %v, %v; want it alive (b deleted the record)", ttl, err)
				}
			}
			for _, c := range []*candidate{a, b} {
				_ = c.stop(t)
			}
			if keys := lockKeys(t, client, name); len(keys) != 0 {
				t.Errorf("keys after the candidates stopped: got %q, want none", keys)
			}
		})
	}
}

// TestTermCount: three leaders, one term each, count three, as etcd's term
// key says; a Mutex holding the name in between counts nothing. The key is
// on a lease of its own, of handover.CountTTL, kept alive by the leaders:
// with every candidate stopped (their Sessions closed) it stays, and the
// next leader counts on; once its lease ends, the key is gone and the count
// starts again at 1.
func TestTermCount(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	_, termKey := recordKeys(name)
	m := etcdlock.NewMutex(newSession(t, client), name)
	d := newDuties(t, client, name)
	for i, who := range []string{"a", "b", "c"} {
		c := leadAs(ctx, client, name, who, d)
		r := d.next()
		if r.who != who || r.term != int64(i+1) || r.etcdTerm != r.term {
			t.Errorf("term %d: got %+v, want %s with TermFrom and etcd's count %d", i+1, r, who, i+1)
		}
		// A Mutex takes the lock between two terms: no count.
		w := lockInGoroutine(t, ctx, ours{m})
		queued(t, client, name, 2)
		d.end(who, etcdlock.StepDown(time.Minute))
		if err := waitErr(t, w.locked); err != nil {
			t.Fatal(err)
		}
		if err := w.Release(); err != nil {
			t.Fatal(err)
		}
		_ = c.stop(t) // its Session closed: the count stays
	}
	resp, err := client.Get(ctx, termKey)
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Version != 3 || resp.Kvs[0].Lease == 0 {
		t.Fatalf("the term key after three terms, every candidate stopped: got %v, %v; want Version 3, on a lease", resp, err)
	}
	count := clientv3.LeaseID(resp.Kvs[0].Lease)
	ttl, err := client.TimeToLive(ctx, count)
	if max := int64(handover.CountTTL / time.Second); err != nil || ttl.GrantedTTL != max || ttl.TTL <= 0 || ttl.TTL > max {
		t.Fatalf("the count's lease: got %+v, %v; want granted %d s, alive", ttl, err, max)
	}
	d4 := leadAs(ctx, client, name, "d", d)
	if r := d.next(); r.who != "d" || r.term != 4 || r.etcdTerm != 4 {
		t.Errorf("the term after every candidate stopped: got %+v, want d in term 4", r)
	}
	_ = d4.stop(t)
	if _, err := client.Revoke(ctx, count); err != nil {
		t.Fatal(err)
	}
	if resp, err := client.Get(ctx, termKey); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("the term key once its lease ended: got %v, %v; want none", resp, err)
	}
	e := leadAs(ctx, client, name, "e", d)
	if r := d.next(); r.who != "e" || r.term != 1 || r.etcdTerm != 1 {
		t.Errorf("the term after the count's lease ended: got %+v, want e in term 1", r)
	}
	_ = e.stop(t)
}

// TestTermEndBadInput: StepDown(-1) and HandOver("") are errors wrapping
// ErrInvalidArgument, which Lead returns, releasing the lock; outside Lead,
// a term's end is an error like any other; TermFrom has no count there.
func TestTermEndBadInput(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	for _, bad := range []error{etcdlock.StepDown(-time.Second), etcdlock.HandOver("")} {
		if !errors.Is(bad, etcdlock.ErrInvalidArgument) {
			t.Errorf("got %v, want ErrInvalidArgument", bad)
		}
		err := etcdlock.Lead(ctx, client, name, func(context.Context) error { return bad })
		if !errors.Is(err, etcdlock.ErrInvalidArgument) {
			t.Errorf("Lead with f returning %q: got %v, want it", bad, err)
		}
		if keys := lockKeys(t, client, name); len(keys) != 0 {
			t.Errorf("keys after Lead returned: got %q, want none", keys)
		}
	}
	if n, ok := etcdlock.TermFrom(ctx); ok || n != 0 {
		t.Errorf("TermFrom outside Lead: got %d, %v; want 0, false", n, ok)
	}
	m := etcdlock.NewMutex(newSession(t, client), name)
	err := m.Do(ctx, func(ctx context.Context) error {
		if _, ok := etcdlock.TermFrom(ctx); ok {
			t.Errorf("TermFrom in Do: got a count, want none")
		}
		return etcdlock.StepDown(0)
	})
	if err == nil || m.HoldCount() != 0 {
		t.Errorf("Do with f returning StepDown: got %v, %d holds; want the error, none", err, m.HoldCount())
	}
}

// TestHandOverRecordNamesNoneBehind: a record that names a key ahead of the
// new holder's (here a key of another prefix, put by hand before it queued)
// names no candidate of its queue: the holder deletes it and leads, rather
// than give way for ever.
func TestHandOverRecordNamesNoneBehind(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	other := name + "-other/x"
	put, err := client.Put(ctx, other, "")
	if err != nil {
		t.Fatal(err)
	}
	defer client.Delete(context.WithoutCancel(ctx), other)
	rec, _ := recordKeys(name)
	if _, err := client.Put(ctx, rec, fmt.Sprintf("%d %s", put.Header.Revision, other)); err != nil {
		t.Fatal(err)
	}
	d := newDuties(t, client, name)
	a := leadAs(ctx, client, name, "a", d)
	if r := d.next(); r.who != "a" || r.term != 1 || r.record != "" {
		t.Errorf("the holder under a record naming a key ahead: got %+v, want a leading, the record deleted", r)
	}
	_ = a.stop(t)
}

// TestHandOverToSelf: a hand-over to the leader's own identity or key names
// no queued candidate: a plain step down, and with nobody else queued the
// leader leads again, in the next term, with no record left.
func TestHandOverToSelf(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	d := newDuties(t, client, name)
	a := leadAs(ctx, client, name, "a", d)
	r := d.next()
	d.end("a", etcdlock.HandOver("a"))
	if r = d.next(); r.who != "a" || r.term != 2 || r.etcdTerm != 2 || r.record != "" {
		t.Errorf("after a hand-over to its own identity: got %+v, want a again in term 2, no record", r)
	}
	d.end("a", etcdlock.HandOver(r.leader))
	if r = d.next(); r.who != "a" || r.term != 3 || r.record != "" {
		t.Errorf("after a hand-over to its own key: got %+v, want a again in term 3, no record", r)
	}
	if err := a.stop(t); !errors.Is(err, context.Canceled) {
		t.Errorf("Lead: got %v, want context.Canceled", err)
	}
}

// TestLeadInScope: a Lead of a name in the scope of a hold of it (its
// campaigns would be re-entries of that hold) is ErrInvalidArgument, f not
// run.
func TestLeadInScope(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	lead := func(ctx context.Context, s *etcdlock.Session, name string) error {
		return s.Lead(ctx, name, func(context.Context) error {
			t.Error("f ran within a hold of its name")
			return nil
		})
	}
	for _, tc := range []struct {
		name string
		run  func(ctx context.Context, s *etcdlock.Session, name string) error
	}{
		{"in a Do of the name", func(ctx context.Context, s *etcdlock.Session, name string) error {
			return etcdlock.NewMutex(s, name).Do(ctx, func(ctx context.Context) error { return lead(ctx, s, name) })
		}},
		{"in a Do of another name, in a Do of the name", func(ctx context.Context, s *etcdlock.Session, name string) error {
			return etcdlock.NewMutex(s, name).Do(ctx, func(ctx context.Context) error {
				return etcdlock.NewMutex(s, name+"-other").Do(ctx, func(ctx context.Context) error { return lead(ctx, s, name) })
			})
		}},
		{"by the goroutine that holds the name", func(ctx context.Context, s *etcdlock.Session, name string) error {
			m := etcdlock.NewMutex(s, name)
			if err := m.LockContext(ctx); err != nil {
				return err
			}
			defer func() { _ = m.UnlockContext(ctx) }()
			return lead(ctx, s, name)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, name := testContext(t), lockName(t)
			s := newSession(t, client)
			if err := tc.run(ctx, s, name); !errors.Is(err, etcdlock.ErrInvalidArgument) {
				t.Errorf("Session.Lead %s: got %v, want ErrInvalidArgument", tc.name, err)
			}
			if n, err := client.Get(ctx, handover.TermKey(name)); err != nil || n.Count != 0 {
				t.Errorf("a term counted in etcd: %v, %v", n, err)
			}
		})
	}
}

// TestTermCountLocalHandoff: two Leads of one name on one Session with
// WithLocalHandoff pass one key (one hold) between their goroutines; each
// of their terms is counted once in etcd, though the hold is the same.
func TestTermCountLocalHandoff(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	s := newSession(t, client, etcdlock.WithTTL(5*time.Second), etcdlock.WithLocalHandoff(4))
	var mu sync.Mutex
	var terms []int64
	started := make(chan struct{}, 16)
	f := func(ctx context.Context) error {
		n, _ := etcdlock.TermFrom(ctx)
		mu.Lock()
		terms = append(terms, n)
		mu.Unlock()
		started <- struct{}{}
		time.Sleep(100 * time.Millisecond)
		return etcdlock.StepDown(0)
	}
	lctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { _ = s.Lead(lctx, name, f) })
	}
	for range 4 {
		<-started
	}
	cancel()
	wg.Wait()
	_, termKey := recordKeys(name)
	resp, err := client.Get(ctx, termKey)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the term key: %v, %v", resp, err)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("terms %v; the count in etcd %d", terms, resp.Kvs[0].Version)
	seen := map[int64]bool{}
	for _, n := range terms {
		if n < 1 || seen[n] {
			t.Errorf("terms %v: each term must have a count of its own", terms)
			break
		}
		seen[n] = true
	}
	if got, want := resp.Kvs[0].Version, slices.Max(terms); got != want {
		t.Errorf("the count in etcd is %d, the last term's %d", got, want)
	}
}

// TestHandOverWatchdog: a hand-over is Lead's call, not f's: with
// WithWatchdog of 1 s, a hand-over slowed by etcd (its queue read applied
// late: the first try gives up after 2 s) does not make the watchdog cancel
// the term or close the Session: Lead goes on, the one handed over to
// leads.
func TestHandOverWatchdog(t *testing.T) {
	testflags.Parallel(t)
	srv, healthy := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	sm := newSeam(callQueueRead, faultLate, 1)
	sm.enter(phaseHold, nil)
	t.Cleanup(sm.late.Wait)
	faulted := serverClient(t, srv, sm.unary, sm.stream)
	d := newDuties(t, healthy, name)
	x := leadAs(ctx, faulted, name, "x", d, etcdlock.WithWatchdog(time.Second))
	if r := d.next(); r.who != "x" {
		t.Fatalf("first leader: %s", r.who)
	}
	k := leadAs(ctx, healthy, name, "k", d)
	defer k.stop(t)
	queued(t, healthy, name, 2)
	d.end("x", etcdlock.HandOver("k"))
	if r := d.next(); r.who != "k" {
		t.Fatalf("after the hand-over: %s leads, want k", r.who)
	}
	select {
	case err := <-x.result:
		t.Fatalf("Lead of x returned after a hand-over slowed by etcd: %v", err)
	case <-time.After(time.Second):
	}
	if err := x.stop(t); err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Lead of x, stopped: %v", err)
	}
	if sm.fires() != 1 {
		t.Errorf("the fault fired %d times, want once", sm.fires())
	}
}

// TestTermCountKeptAlive: the leader keeps the count's lease alive while
// its term lasts, every third of the lease's TTL: a count on a lease of
// 3 s (put by hand) outlives a term of 7 s, on the same lease, and ends
// within the TTL once no leader keeps it.
func TestTermCountKeptAlive(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	_, termKey := recordKeys(name)
	const ttl = 3 * time.Second
	g, err := client.Grant(ctx, int64(ttl/time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Put(ctx, termKey, "by hand", clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	d := newDuties(t, client, name)
	a := leadAs(ctx, client, name, "a", d)
	if r := d.next(); r.term != 2 || r.etcdTerm != 2 {
		t.Fatalf("the term after the count put by hand: got %+v, want 2", r)
	}
	time.Sleep(ttl*2 + ttl/3)
	resp, err := client.Get(ctx, termKey)
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Version != 2 || clientv3.LeaseID(resp.Kvs[0].Lease) != g.ID {
		t.Fatalf("the count after a term of %v, its lease of %v: got %v, %v; want Version 2 on lease %x", ttl*2+ttl/3, ttl, resp, err, g.ID)
	}
	_ = a.stop(t)
	eventually(t, "the count gone with its lease", func() bool {
		resp, err := client.Get(ctx, termKey)
		return err == nil && len(resp.Kvs) == 0
	})
}
