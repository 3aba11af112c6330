package etcdlock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// followBound is how late a follower may learn of a change (the issue's
// promise, with a TTL of 2 s): it measures a few milliseconds.
const followBound = time.Second

// A sighting is a value an observer sent, and when it came.
type sighting[T any] struct {
	v  T
	at time.Time
}

// sightings records what an Follow or FollowLeader channel sends, until
// it closes.
type sightings[T any] struct {
	mu   sync.Mutex
	got  []sighting[T]
	done chan struct{} // closed with the channel
}

// record records what ch sends, in a goroutine that ends when ch closes.
func record[T any](ch <-chan T) *sightings[T] {
	s := &sightings[T]{done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for v := range ch {
			s.mu.Lock()
			s.got = append(s.got, sighting[T]{v, time.Now()})
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *sightings[T]) all() []sighting[T] {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.got)
}

func (s *sightings[T]) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.got)
}

// wait waits for the first value sent from index from on that satisfies
// ok, and returns its index and sighting.
func (s *sightings[T]) wait(t *testing.T, what string, from int, ok func(T) bool) (int, sighting[T]) {
	t.Helper()
	i, found := -1, sighting[T]{}
	eventually(t, what, func() bool {
		for j, g := range s.all() {
			if j >= from && ok(g.v) {
				i, found = j, g
				return true
			}
		}
		return false
	})
	return i, found
}

// closes checks that the channel closes within bound of at, and logs when.
func (s *sightings[T]) closes(t *testing.T, what string, at time.Time, bound time.Duration) {
	t.Helper()
	select {
	case <-s.done:
		checkBound(t, what, time.Since(at), bound)
	case <-time.After(testTimeout):
		t.Fatalf("%s: channel still open %v after its context ended", what, testTimeout)
	}
}

// followQueue runs Follow of name on client until the test ends, and
// records what it sends.
func followQueue(t *testing.T, client *clientv3.Client, name string) *sightings[[]etcdlock.QueueEntry] {
	return following(t, "Follow", func(ctx context.Context) <-chan []etcdlock.QueueEntry { return etcdlock.Follow(ctx, client, name) })
}

// followLeader runs FollowLeader of name on client until the test ends,
// and records what it sends.
func followLeader(t *testing.T, client *clientv3.Client, name string) *sightings[etcdlock.QueueEntry] {
	return following(t, "FollowLeader", func(ctx context.Context) <-chan etcdlock.QueueEntry { return etcdlock.FollowLeader(ctx, client, name) })
}

// following runs follow until the test ends, records what it sends, and
// checks at the end that its channel closes.
func following[T any](t *testing.T, what string, follow func(ctx context.Context) <-chan T) *sightings[T] {
	ctx, cancel := context.WithCancel(context.Background())
	s := record(follow(ctx))
	t.Cleanup(func() {
		cancel()
		s.closes(t, what+" at the end of the test", time.Now(), testTimeout)
	})
	return s
}

// queueIs returns a test of a queue: it reads as want (describe).
func queueIs(want string) func([]etcdlock.QueueEntry) bool {
	return func(q []etcdlock.QueueEntry) bool { return describe(q) == want }
}

// noRepeats checks that no queue sent was the same as the one before it.
func noRepeats(t *testing.T, s *sightings[[]etcdlock.QueueEntry]) {
	t.Helper()
	got := s.all()
	for i := 1; i < len(got); i++ {
		if slices.Equal(got[i-1].v, got[i].v) {
			t.Errorf("queue %d sent again, unchanged: %q", i, describe(got[i].v))
		}
	}
}

// sameAsInspect checks that q is the queue Inspect reads now.
func sameAsInspect(t *testing.T, ctx context.Context, client *clientv3.Client, name string, q []etcdlock.QueueEntry) {
	t.Helper()
	if entries := inspect(t, ctx, client, name); !slices.Equal(q, entries) {
		t.Errorf("queue sent: got %+v, want Inspect's %+v", q, entries)
	}
}

// TestFollow: the queue now and after every change, as Inspect reads it,
// for every kind of lock; nothing sent when a change leaves the queue as it
// was (a nested lock's key, a Semaphore's wake-up); a queue sent is the
// receiver's to change; no write; bad input gives a closed channel.
func TestFollow(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	as := func(id string) *etcdlock.Session { return newSession(t, client, etcdlock.WithIdentity(id)) }

	t.Run("bad input", func(t *testing.T) {
		var nilCtx context.Context
		for _, tc := range []struct {
			what   string
			ctx    context.Context
			client *clientv3.Client
			name   string
		}{
			{"a nil context", nilCtx, client, lockName(t)},
			{"a nil client", ctx, nil, lockName(t)},
			{"the empty name", ctx, client, ""},
		} {
			q := record(etcdlock.Follow(tc.ctx, tc.client, tc.name))
			l := record(etcdlock.FollowLeader(tc.ctx, tc.client, tc.name))
			q.closes(t, "Follow with "+tc.what, time.Now(), time.Second)
			l.closes(t, "FollowLeader with "+tc.what, time.Now(), time.Second)
			if q.len() != 0 || l.len() != 0 {
				t.Errorf("with %s: got %v and %v sent, want nothing", tc.what, q.all(), l.all())
			}
		}
	})

	t.Run("Mutex", func(t *testing.T) {
		name := lockName(t)
		before := revision(t, client)
		q := followQueue(t, client, name)
		_, first := q.wait(t, "the first queue", 0, func([]etcdlock.QueueEntry) bool { return true })
		if first.v == nil || len(first.v) != 0 {
			t.Errorf("first queue of a free lock: got %#v, want an empty slice", first.v)
		}
		if w := wroteSince(t, client, before); len(w) > 0 {
			t.Errorf("writes after Follow's read and watch: %v, want none", w)
		}

		a := etcdlock.NewMutex(as("a"), name)
		if err := a.LockContext(ctx); err != nil {
			t.Fatal(err)
		}
		i, _ := q.wait(t, "a holds", 0, queueIs("mutex:a:holds"))
		lockInGoroutine(t, ctx, oursOn(as("b"), name))
		i, s := q.wait(t, "b waits", i, queueIs("mutex:a:holds mutex:b:waits"))
		sameAsInspect(t, ctx, client, name, s.v)
		if s.v[0].Key != a.Key() || s.v[0].Token != a.Token() {
			t.Errorf("holder: got %+v, want key %s, token %d", s.v[0], a.Key(), a.Token())
		}

		// A key of a nested lock, and a receiver that changes what it got:
		// nothing is sent for either. The next change shows it: it comes
		// right after the last queue.
		s.v[0].Identity = "changed by the receiver"
		if _, err := client.Put(ctx, name+"/1/nested", "x"); err != nil {
			t.Fatal(err)
		}
		if err := a.UnlockContext(ctx); err != nil {
			t.Fatal(err)
		}
		j, s := q.wait(t, "b holds", i, queueIs("mutex:b:holds"))
		if j != i+1 {
			t.Errorf("queues sent between: got %d, want none (%q)", j-i-1, describe(q.all()[i+1].v))
		}
		sameAsInspect(t, ctx, client, name, s.v)
		noRepeats(t, q)
	})

	t.Run("RWMutex and Semaphore", func(t *testing.T) {
		name := lockName(t)
		q := followQueue(t, client, name)
		q.wait(t, "the first queue", 0, queueIs(""))

		r := etcdlock.NewRWMutex(as("reader"), name)
		if err := r.RLockContext(ctx); err != nil {
			t.Fatal(err)
		}
		lockInGoroutine(t, ctx, rwWriter{etcdlock.NewRWMutex(as("writer"), name)})
		i, s := q.wait(t, "the writer waits", 0, queueIs("read:reader:holds write:writer:waits"))
		sameAsInspect(t, ctx, client, name, s.v)
		if err := r.RUnlockContext(ctx); err != nil {
			t.Fatal(err)
		}
		i, _ = q.wait(t, "the writer holds", i, queueIs("write:writer:holds"))

		// Semaphore keys of the same name: a second queue, holders first.
		var permits []*etcdlock.Permit
		for _, id := range []string{"p1", "p2"} {
			p, err := etcdlock.NewSemaphore(as(id), name, 2).Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			permits = append(permits, p)
		}
		var p3 *etcdlock.Permit
		acquired := result(func() error {
			var err error
			p3, err = etcdlock.NewSemaphore(as("p3"), name, 2).Acquire(ctx)
			return err
		})
		i, s = q.wait(t, "p3 waits", i, queueIs("write:writer:holds semaphore:p1:holds semaphore:p2:holds semaphore:p3:waits"))
		sameAsInspect(t, ctx, client, name, s.v)
		// p1's release admits p3, whose predecessor p2 then puts its key
		// again to wake it (a Semaphore's wake-up): one change.
		if err := permits[0].Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := waitErr(t, acquired); err != nil {
			t.Fatal(err)
		}
		defer p3.Release(context.Background())
		_, s = q.wait(t, "p3 holds", i, queueIs("write:writer:holds semaphore:p2:holds semaphore:p3:holds"))
		sameAsInspect(t, ctx, client, name, s.v)
		if err := permits[1].Release(ctx); err != nil {
			t.Fatal(err)
		}
		q.wait(t, "p2 gone", i, queueIs("write:writer:holds semaphore:p3:holds"))
		noRepeats(t, q)
	})
}

// rwWriter is an RWMutex's write lock as a locker.
type rwWriter struct{ rw *etcdlock.RWMutex }

func (l rwWriter) Lock(ctx context.Context) error            { return l.rw.LockContext(ctx) }
func (l rwWriter) TryLock(ctx context.Context) (bool, error) { return l.rw.TryLockFor(ctx, 0) }
func (l rwWriter) Unlock(ctx context.Context) error          { return l.rw.UnlockContext(ctx) }
func (l rwWriter) Key() string                               { return l.rw.Key() }

// TestInspectAt: the revision InspectAt returns is that of its read: a
// watch from the next one sees the next change first.
//
// The test judges by its own keys (wroteSince), not by etcd's revision, which
// other tests move on a shared etcd: InspectAt's revision lies between two
// reads of etcd's revision that no write of the test's comes between, and
// the only write of the test's after it is the next change. On an etcd of
// the test's own, that is: the revision is the one read before, and the
// next change comes at the next one.
func TestInspectAt(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	m := etcdlock.NewMutex(newSession(t, client, etcdlock.WithIdentity("a")), name)
	if err := m.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	key := m.Key()
	before := revision(t, client)
	entries, rev, err := etcdlock.InspectAt(ctx, client, name)
	after := revision(t, client)
	if err != nil || rev < before || rev > after || describe(entries) != "mutex:a:holds" {
		t.Fatalf("InspectAt: got %q, revision %d, %v; want a's hold, revision in [%d, %d]", describe(entries), rev, err, before, after)
	}
	if w := wroteSince(t, client, before); len(w) > 0 {
		t.Fatalf("writes around InspectAt: %v, want none", w)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := client.Watch(wctx, name+"/", clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	if err := m.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case wr := <-wch:
		if len(wr.Events) == 0 || string(wr.Events[0].Kv.Key) != key || wr.Events[0].Type != mvccpb.DELETE || wr.Events[0].Kv.ModRevision <= rev {
			t.Fatalf("watch from InspectAt's revision + 1: got %v, want the delete of %s after %d", wr.Events, key, rev)
		}
		want := fmt.Sprintf("DELETE %q at %d", key, wr.Events[0].Kv.ModRevision)
		if w := wroteSince(t, client, rev); len(w) != 1 || w[0] != want {
			t.Errorf("writes after InspectAt's revision: got %v, want only %s", w, want)
		}
	case <-time.After(testTimeout):
		t.Fatal("no event from the watch")
	}
	if _, rev, err := etcdlock.InspectAt(ctx, client, ""); !errors.Is(err, etcdlock.ErrInvalidName) || rev != 0 {
		t.Errorf("InspectAt with the empty name: got revision %d, %v; want 0, ErrInvalidName", rev, err)
	}
}

// TestLeaderOf: the holder of the Mutex queue (Lead's, or an Election's
// leader), or ErrNoLeader, also when only an RWMutex or a Semaphore holds
// the name; one read, no write; bad input gives an error.
func TestLeaderOf(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	as := func(id string) *etcdlock.Session { return newSession(t, client, etcdlock.WithIdentity(id)) }
	noLeader := func(what string) {
		t.Helper()
		if l, err := etcdlock.LeaderOf(ctx, client, name); !errors.Is(err, etcdlock.ErrNoLeader) || !strings.Contains(err.Error(), name) {
			t.Errorf("LeaderOf %s: got %+v, %v; want ErrNoLeader naming %q", what, l, err, name)
		}
	}

	if _, err := etcdlock.LeaderOf(ctx, client, ""); !errors.Is(err, etcdlock.ErrInvalidName) {
		t.Errorf("LeaderOf the empty name: got %v, want ErrInvalidName", err)
	}
	if _, err := etcdlock.LeaderOf(ctx, nil, name); !errors.Is(err, etcdlock.ErrInvalidArgument) {
		t.Errorf("LeaderOf with a nil client: got %v, want ErrInvalidArgument", err)
	}
	noLeader("a free name")

	r := etcdlock.NewRWMutex(as("reader"), name)
	if err := r.RLockContext(ctx); err != nil {
		t.Fatal(err)
	}
	noLeader("a name read-locked")
	if err := r.RUnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
	p, err := etcdlock.NewSemaphore(as("permit"), name, 1).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	noLeader("a name a Semaphore holds")
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}

	leading := make(chan etcdlock.Hold, 1)
	c := campaign(ctx, client, name, func(fctx context.Context) error {
		h, _ := etcdlock.HoldFrom(fctx)
		leading <- h
		<-fctx.Done()
		return nil
	}, etcdlock.WithIdentity("replica-1"))
	var h etcdlock.Hold
	select {
	case h = <-leading:
	case <-time.After(testTimeout):
		t.Fatal("Lead never led")
	}
	before := revision(t, client)
	l, err := etcdlock.LeaderOf(ctx, client, name)
	want := etcdlock.QueueEntry{Key: h.Key, Lease: h.Lease, Token: h.Token, Holds: true, Identity: "replica-1", Kind: etcdlock.KindMutex}
	if err != nil || l != want {
		t.Errorf("LeaderOf while Lead leads: got %+v, %v; want %+v", l, err, want)
	}
	if w := wroteSince(t, client, before); len(w) > 0 {
		t.Errorf("writes after LeaderOf: %v, want none", w)
	}
	if err := c.stop(t); !errors.Is(err, context.Canceled) {
		t.Errorf("Lead: got %v, want context.Canceled", err)
	}
	noLeader("after the leader stopped")

	// etcd's Election uses a Mutex's keys: its leader, with its value.
	e := concurrency.NewElection(newUpstreamSession(t, client, 60), name)
	if err := e.Campaign(ctx, "10.0.0.2:8080"); err != nil {
		t.Fatal(err)
	}
	if l, err := etcdlock.LeaderOf(ctx, client, name); err != nil || l.Key != e.Key() || l.Identity != "10.0.0.2:8080" {
		t.Errorf("LeaderOf an Election: got %+v, %v; want key %s, identity its value", l, err, e.Key())
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestFollowLeaderFailover: a follower sees every leader of a failover
// sequence, in order, within 1 s of each change (TTL 2 s): a leader whose
// key an operator deletes, a leader cut off from etcd (its key expires with
// its lease), a leader that stops. Follow, beside it, shows the same
// holders.
func TestFollowLeaderFailover(t *testing.T) {
	testflags.Parallel(t)
	srv := etcdtest.Start(t)
	client := srv.Client(t)
	ctx := testContext(t)
	name := lockName(t)
	const ttl = 2 * time.Second

	leaders := followLeader(t, client, name)
	queues := followQueue(t, client, name)
	// Nobody leads yet.
	_, s := leaders.wait(t, "the first leader", 0, func(etcdlock.QueueEntry) bool { return true })
	if s.v != (etcdlock.QueueEntry{}) {
		t.Fatalf("first leader of a free name: got %+v, want the zero QueueEntry", s.v)
	}

	log := newLeaderLog(t)
	log.overlap = true // the operator's delete
	type node struct {
		c     *candidate
		proxy *etcdtest.Proxy
	}
	nodes := map[string]*node{}
	defer func() {
		for _, n := range nodes {
			n.proxy.Unblackhole()
			_ = n.c.stop(t)
		}
	}()
	for _, who := range []string{"a", "b", "c"} {
		pc, proxy := srv.ProxiedClient(t)
		nodes[who] = &node{c: campaign(ctx, pc, name, log.f(who), etcdlock.WithTTL(ttl), etcdlock.WithIdentity(who)), proxy: proxy}
		if who == "a" {
			log.leader("")
		}
	}
	eventually(t, "three candidates queued", func() bool { return len(lockKeys(t, client, name)) == 3 })

	// seen waits for the follower to see the leader with token, and checks
	// that it did within followBound of at.
	seen := func(what string, who string, token int64, at time.Time) {
		t.Helper()
		_, s := leaders.wait(t, what, 0, func(l etcdlock.QueueEntry) bool { return l.Token == token })
		if s.v.Identity != who {
			t.Errorf("%s: got leader %q, want %q", what, s.v.Identity, who)
		}
		checkBound(t, what+": the follower saw "+who, s.at.Sub(at), followBound)
	}

	// An operator deletes the leader's key, once the followers have sent
	// its term: they send the newest queue, and a watch that starts behind
	// etcd's revision, as on an etcd other tests write to, catches up on
	// several changes in one response.
	first, tm := log.leader("")
	seen("the first leader", first, tm.token, tm.start)
	queues.wait(t, first+" holds, in Follow", 0, func(q []etcdlock.QueueEntry) bool { return leaderOf(q) == tm.token })
	l, err := etcdlock.LeaderOf(ctx, client, name)
	if err != nil || l.Identity != first {
		t.Fatalf("LeaderOf: got %+v, %v; want %s", l, err, first)
	}
	deleted := time.Now()
	if _, err := client.Delete(ctx, l.Key); err != nil {
		t.Fatal(err)
	}
	second, tm := log.leader(first)
	seen("key deleted", second, tm.token, deleted)
	eventually(t, first+"'s f ended", func() bool { return !log.ended(first).IsZero() })

	// The leader is cut off: its key goes when its lease expires, and the
	// next one leads at once.
	nodes[second].proxy.Blackhole()
	cut := time.Now()
	third, tm := log.leader(second)
	t.Logf("%s cut off; %s led %v later", second, third, tm.start.Sub(cut).Round(time.Millisecond))
	seen("leader cut off", third, tm.token, tm.start)
	nodes[second].proxy.Unblackhole()

	// The leader stops: it releases.
	stopped := time.Now()
	_ = nodes[third].c.stop(t)
	delete(nodes, third)
	fourth, tm := log.leader(third)
	seen("leader stopped", fourth, tm.token, stopped)

	// Every term, in order, each seen within the bound of its start; and
	// nothing else.
	var want, got []int64
	log.mu.Lock()
	terms := slices.Clone(log.terms)
	log.mu.Unlock()
	for _, tm := range terms {
		want = append(want, tm.token)
	}
	for _, s := range leaders.all() {
		if s.v.Token != 0 {
			got = append(got, s.v.Token)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("leaders seen, by token: got %v, want every term's %v", got, want)
	}
	for _, tm := range terms {
		for _, s := range leaders.all() {
			if s.v.Token == tm.token && s.at.Sub(tm.start) > followBound {
				t.Errorf("%s's term (token %d) seen %v after it began, want ≤ %v", tm.who, tm.token, s.at.Sub(tm.start), followBound)
			}
		}
	}
	// Follow's holders are the same leaders.
	var holders []int64
	for _, s := range queues.all() {
		if l := leaderOf(s.v); l != 0 && (len(holders) == 0 || holders[len(holders)-1] != l) {
			holders = append(holders, l)
		}
	}
	if !slices.Equal(holders, want) {
		t.Errorf("holders Follow saw, by token: got %v, want %v", holders, want)
	}
	noRepeats(t, queues)
}

// leaderOf returns the token of q's Mutex holder, 0 if none.
func leaderOf(q []etcdlock.QueueEntry) int64 {
	for _, e := range q {
		if e.Holds && e.Kind == etcdlock.KindMutex {
			return e.Token
		}
	}
	return 0
}

// holdAs takes the Mutex name in a goroutine of its own, as id, and
// returns it holding.
func holdAs(t *testing.T, ctx context.Context, client *clientv3.Client, name, id string) *worker {
	t.Helper()
	w := lockInGoroutine(t, ctx, oursOn(newSession(t, client, etcdlock.WithIdentity(id)), name))
	if err := waitErr(t, w.locked); err != nil {
		t.Fatal(err)
	}
	return w
}

// handOver queues the Mutex name as next behind the holder, then releases
// the holder, and returns next, holding, and when the holder released.
func handOver(t *testing.T, ctx context.Context, client *clientv3.Client, name string, holder *worker, next string) (*worker, time.Time) {
	t.Helper()
	w := lockInGoroutine(t, ctx, oursOn(newSession(t, client, etcdlock.WithIdentity(next)), name))
	eventually(t, next+" queued", func() bool { return len(lockKeys(t, client, name)) == 2 })
	released := time.Now()
	if err := holder.Release(); err != nil {
		t.Fatal(err)
	}
	if err := waitErr(t, w.locked); err != nil {
		t.Fatal(err)
	}
	return w, released
}

// TestFollowCompaction: an observer cut off while the lock changes and
// its history is compacted reconnects to a watch it cannot resume, reads
// again and watches from there: it sends the queue as it is, then each
// later change within 1 s, sooner than its periodic re-read.
func TestFollowCompaction(t *testing.T) {
	if sharedEtcd() {
		// A compaction is of the whole etcd: in one shared by other tests,
		// it takes the history their watches start from.
		t.Skip("compacts etcd: needs an etcd of its own, not the one ETCDTEST_ENDPOINTS shares")
	}
	testflags.Parallel(t)
	srv, client := startServer(t)
	pc, proxy := srv.ProxiedClient(t)
	defer proxy.Unblackhole()
	ctx := testContext(t)
	name := lockName(t)
	q := followQueue(t, pc, name)
	a := holdAs(t, ctx, client, name, "a")
	q.wait(t, "a holds", 0, queueIs("mutex:a:holds"))

	proxy.Blackhole()
	holder, _ := handOver(t, ctx, client, name, a, "b")
	rev := revision(t, client)
	if _, err := client.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	proxy.Unblackhole()
	_, s := q.wait(t, "b holds", 0, queueIs("mutex:b:holds"))
	// gRPC reconnects about 1 s after Unblackhole; a re-read comes within
	// 5 s in any case.
	checkBound(t, "queue after the compaction and reconnection", s.at.Sub(back), 2*etcdlock.FollowReread)

	for _, next := range []string{"c", "d", "e"} {
		var released time.Time
		holder, released = handOver(t, ctx, client, name, holder, next)
		_, s := q.wait(t, next+" holds", 0, queueIs("mutex:"+next+":holds"))
		checkBound(t, "after the compaction, "+next+" holds", s.at.Sub(released), followBound)
	}
	noRepeats(t, q)
}

// TestFollowMemberStopped: each member of a 3-member cluster in turn is
// stopped under a running observer, which uses them all (one of them serves
// its watch); each change made while the member is down is sent within the
// bound.
func TestFollowMemberStopped(t *testing.T) {
	testflags.Parallel(t)
	cluster := etcdtest.StartCluster(t, 3)
	client := cluster.Client(t)
	observer := cluster.Client(t)
	ctx := testContext(t)
	name := lockName(t)
	q := followQueue(t, observer, name)
	holder := holdAs(t, ctx, client, name, "m")
	q.wait(t, "m holds", 0, queueIs("mutex:m:holds"))
	for i := range cluster.Members() {
		cluster.Stop(i)
		for _, next := range []string{"x", "y"} {
			next = fmt.Sprintf("%s%d", next, i)
			var released time.Time
			holder, released = handOver(t, ctx, client, name, holder, next)
			_, s := q.wait(t, next+" holds", 0, queueIs("mutex:"+next+":holds"))
			checkBound(t, fmt.Sprintf("member %d stopped: %s holds", i, next), s.at.Sub(released), 2*followBound)
		}
		cluster.Restart(i)
	}
	noRepeats(t, q)
}

// TestFollowLostEvent: a watch event that etcd loses (etcd #17529 and
// others) delays the change by at most the re-read interval.
func TestFollowLostEvent(t *testing.T) {
	testflags.Parallel(t)
	srv, client := startServer(t)
	var d eventDropper
	wc := serverClient(t, srv, nil, d.intercept)
	ctx := testContext(t)
	name := lockName(t)
	q := followQueue(t, wc, name)
	m := etcdlock.NewMutex(newSession(t, client, etcdlock.WithIdentity("a")), name)
	if err := m.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	i, _ := q.wait(t, "a holds", 0, queueIs("mutex:a:holds"))
	d.arm(m.Key())
	released := time.Now()
	if err := m.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
	_, s := q.wait(t, "nobody holds", i, queueIs(""))
	checkBound(t, "the release, its event lost", s.at.Sub(released), 2*etcdlock.FollowReread)
	if n := d.count(); n != 1 {
		t.Errorf("delete events swallowed: got %d, want 1 (the test did not lose the event)", n)
	}
}

// TestFollowEnds: when ctx ends, the channel closes at once, whether the
// observer waits on its watch, on a receiver, or on etcd unreachable; no
// goroutine of it is left. Nothing is sent while etcd is unreachable, and
// the queue once it is back.
func TestFollowEnds(t *testing.T) {
	testflags.Parallel(t)
	labelGoroutines(t) // followers counts the Follow goroutines of this test
	srv, client := startServer(t)
	pc, proxy := srv.ProxiedClient(t)
	defer proxy.Unblackhole()
	name := lockName(t)

	ctx, cancel := context.WithCancel(context.Background())
	q := record(etcdlock.Follow(ctx, client, name))
	q.wait(t, "the first queue", 0, queueIs(""))
	if n := followers(t); n < 1 {
		t.Errorf("goroutines of Follow while it runs: got %d, want some (else the counts below prove nothing)", n)
	}
	at := time.Now()
	cancel()
	q.closes(t, "Follow watching", at, time.Second)

	// Never received: the queue waits to be sent.
	ctx, cancel = context.WithCancel(context.Background())
	ch := etcdlock.FollowLeader(ctx, client, name)
	time.Sleep(100 * time.Millisecond)
	at = time.Now()
	cancel()
	l := record(ch)
	l.closes(t, "FollowLeader not received from", at, time.Second)
	if n := followers(t); n != 0 {
		t.Errorf("goroutines of Follow after its ctx ended: got %d, want 0", n)
	}

	// etcd unreachable: reads time out, and the watch cannot open.
	proxy.Blackhole()
	ctx, cancel = context.WithCancel(context.Background())
	q = record(etcdlock.Follow(ctx, pc, name))
	time.Sleep(3 * time.Second) // a read timed out, and another is under way
	if n := q.len(); n != 0 {
		t.Errorf("queues sent while etcd was unreachable: got %d, want none", n)
	}
	proxy.Unblackhole()
	q.wait(t, "the first queue, etcd back", 0, queueIs(""))
	proxy.Blackhole()
	time.Sleep(3 * time.Second)
	at = time.Now()
	cancel()
	q.closes(t, "Follow with etcd unreachable", at, time.Second)
	proxy.Unblackhole()
	// clientv3 keeps a watch stream it could not open until the client
	// closes (goleak, in TestMain, sees them all gone): only Follow's own
	// goroutines are counted.
	if n := followers(t); n != 0 {
		t.Errorf("goroutines of Follow after its ctx ended: got %d, want 0", n)
	}
}

// followers returns how many goroutines run Follow's code among those
// labelled by followerLabels: the test's own, so that tests running in
// parallel do not count each other's.
func followers(t *testing.T) int {
	t.Helper()
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 1); err != nil {
		t.Fatalf("goroutine profile: %v", err)
	}
	label := fmt.Sprintf("%q:%q", followerLabel, t.Name())
	n := 0
	// Records of goroutines with one stack and one set of labels, each
	// "count @ pcs", "# labels: {...}", then the frames.
	for rec := range strings.SplitSeq(buf.String(), "\n\n") {
		if !strings.Contains(rec, "etcdlock.(*follower[") || !strings.Contains(rec, label) {
			continue
		}
		var count int
		if _, err := fmt.Sscanf(rec, "%d @", &count); err != nil {
			t.Fatalf("goroutine profile: record %q: %v", rec, err)
		}
		n += count
	}
	return n
}

// followerLabel is the profiler label that marks the goroutines a test
// starts (Follow's among them), with the test's name: see followers.
const followerLabel = "etcdlock-test"

// labelGoroutines labels the test's goroutine, and so those it starts, with
// the test's name.
func labelGoroutines(t *testing.T) {
	pprof.SetGoroutineLabels(pprof.WithLabels(context.Background(), pprof.Labels(followerLabel, t.Name())))
}
