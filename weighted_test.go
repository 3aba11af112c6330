package etcdlock_test

// Weighted permits (Semaphore.AcquireN): golang.org/x/sync/semaphore's
// weighted tests, ported to permits across Sessions, each answer judged in
// etcd: a permit the library gives is, at that moment, among the keys that
// hold by the rule read from etcd's keys (the oldest keys whose weights fit
// within the limit, in order).

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/queue"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// weightOf reads a permit key's weight from its value, as written: the
// first line "limit=N" (1) or "limit=N;weight=K".
func weightOf(value []byte) int {
	line, _, _ := strings.Cut(string(value), "\n")
	_, w, ok := strings.Cut(line, ";weight=")
	if !ok {
		return 1
	}
	n, _ := strconv.Atoi(w)
	return n
}

// holdsInEtcd reports whether key holds a permit of the semaphore name,
// whose holders were made with limit, by the rule, from what etcd has now;
// and the permits those holders take.
func holdsInEtcd(t *testing.T, client *clientv3.Client, name string, limit int, key string) (bool, int) {
	t.Helper()
	holders, sum := permitsInEtcd(t, client, name, limit)
	return slices.Contains(holders, key), sum
}

// permitsInEtcd returns the keys that hold a permit of the semaphore name,
// whose holders were made with limit, and the permits they take, by the
// rule as the docs give it, not as the library computes it: its keys and
// its limit record, read in one Txn; the limit is the record's ("limit=N
// keep=G") if there is one; keys created at or before G (at most the
// record's revision) hold; the others, oldest first, while their weights
// (each at most the limit) fit within what the older keys left.
func permitsInEtcd(t *testing.T, client *clientv3.Client, name string, limit int) ([]string, int) {
	t.Helper()
	resp, err := client.Txn(testContext(t)).Then(
		clientv3.OpGet(name+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)),
		clientv3.OpGet(queue.LimitKey(name)),
	).Commit()
	if err != nil {
		t.Fatalf("read the keys and the limit record of %q: %v", name, err)
	}
	var keep int64
	if rec := resp.Responses[1].GetResponseRange().Kvs; len(rec) == 1 {
		if _, err := fmt.Sscanf(string(rec[0].Value), "limit=%d keep=%d", &limit, &keep); err != nil {
			t.Fatalf("the limit record of %q: %q: %v", name, rec[0].Value, err)
		}
		keep = min(keep, rec[0].ModRevision)
	}
	var holders []string
	room, sum := limit, 0
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs { // oldest first
		w := min(weightOf(kv.Value), limit)
		fits := room >= 0 && w <= room
		if fits || kv.CreateRevision <= keep {
			holders = append(holders, string(kv.Key))
			sum += w
		}
		if fits {
			room -= w
		} else {
			room = -1 // first come, first served: no later key fits
		}
	}
	return holders, sum
}

// weightedWorker acquires weight permits of sem, rounds times, and checks
// each answer in etcd and against the permits held in the process.
type weightedWorker struct {
	t      *testing.T
	client *clientv3.Client
	limit  int
	inUse  *atomic.Int64 // permits held now, by every worker
	most   *atomic.Int64
}

func (w weightedWorker) hold(p *etcdlock.Permit) {
	w.t.Helper()
	if ok, _ := holdsInEtcd(w.t, w.client, p.Key()[:strings.LastIndexByte(p.Key(), '/')], w.limit, p.Key()); !ok {
		w.t.Errorf("permit %s of weight %d: not among the holders in etcd", p.Key(), p.Weight())
	}
	n := w.inUse.Add(int64(p.Weight()))
	if n > int64(w.limit) {
		w.t.Errorf("%d permits held at once, limit %d", n, w.limit)
	}
	raise(w.most, n)
	time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
	w.inUse.Add(-int64(p.Weight()))
}

// TestWeighted (x/sync's TestWeighted): workers of weights 1 to limit, each
// on a Session of its own, acquire and release at once; the limit is never
// exceeded and nothing is left behind.
func TestWeighted(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	const limit, rounds = 4, 6
	var inUse, most atomic.Int64
	w := weightedWorker{t: t, client: client, limit: limit, inUse: &inUse, most: &most}
	var wg sync.WaitGroup
	for weight := 1; weight <= limit; weight++ {
		sem := etcdlock.NewSemaphore(newSession(t, client), name, limit)
		wg.Go(func() {
			for range rounds {
				p, err := sem.AcquireN(ctx, weight)
				if err != nil {
					t.Errorf("AcquireN(%d): %v", weight, err)
					return
				}
				if p.Weight() != weight {
					t.Errorf("Weight = %d, want %d", p.Weight(), weight)
				}
				w.hold(p)
				if err := p.Release(ctx); err != nil {
					t.Errorf("Release: %v", err)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("most permits held at once: %d of %d", most.Load(), limit)
	if keys := lockKeys(t, client, name); len(keys) != 0 {
		t.Errorf("keys left: %q", keys)
	}
}

// TestWeightedBadInput (x/sync's TestWeightedPanic, where it applies): a
// release of a released permit is ErrNotHeld, not a panic; fewer than one
// permit is ErrInvalidArgument and writes nothing.
func TestWeightedBadInput(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	sem := etcdlock.NewSemaphore(newSession(t, client), name, 2)
	for _, n := range []int{0, -1} {
		if _, err := sem.AcquireN(ctx, n); !errors.Is(err, etcdlock.ErrInvalidArgument) {
			t.Errorf("AcquireN(%d): got %v, want ErrInvalidArgument", n, err)
		}
		if _, err := sem.TryAcquireN(ctx, n, 0); !errors.Is(err, etcdlock.ErrInvalidArgument) {
			t.Errorf("TryAcquireN(%d): got %v, want ErrInvalidArgument", n, err)
		}
	}
	if keys := lockKeys(t, client, name); len(keys) != 0 {
		t.Errorf("keys after refused acquisitions: %q", keys)
	}
	p, err := sem.AcquireN(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	release(t, p)
	if err := p.Release(ctx); !errors.Is(err, etcdlock.ErrNotHeld) {
		t.Errorf("second Release: got %v, want ErrNotHeld", err)
	}
	var nilPermit *etcdlock.Permit
	if nilPermit.Weight() != 0 {
		t.Errorf("nil Permit's Weight: got %d, want 0", nilPermit.Weight())
	}
}

// TestWeightedTryAcquire (x/sync's TestWeightedTryAcquire): what a try
// gets with weights, with every answer checked in etcd.
func TestWeightedTryAcquire(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	const limit = 3
	a := etcdlock.NewSemaphore(newSession(t, client), name, limit)
	b := etcdlock.NewSemaphore(newSession(t, client), name, limit)
	try := func(sem *etcdlock.Semaphore, n int, want bool) *etcdlock.Permit {
		t.Helper()
		p, err := sem.TryAcquireN(ctx, n, 0)
		switch {
		case want && err != nil:
			t.Fatalf("TryAcquireN(%d): got %v, want a permit", n, err)
		case !want && !errors.Is(err, etcdlock.ErrNoPermit):
			t.Fatalf("TryAcquireN(%d): got %v, want ErrNoPermit", n, err)
		case want:
			if ok, _ := holdsInEtcd(t, client, name, limit, p.Key()); !ok {
				t.Errorf("TryAcquireN(%d) answered held; etcd disagrees", n)
			}
		}
		return p
	}
	p2 := try(a, 2, true)
	try(b, 2, false) // 2 + 2 > 3
	p1 := try(b, 1, true)
	try(a, 1, false)
	release(t, p2)
	p3 := try(a, 2, true)
	try(b, 1, false)
	release(t, p1)
	release(t, p3)
	all := try(b, limit, true)
	try(a, 1, false)
	release(t, all)
	if keys := lockKeys(t, client, name); len(keys) != 0 {
		t.Errorf("keys left: %q (a refused try writes nothing)", keys)
	}
}

// TestLargeAcquireDoesntStarve (x/sync's): while workers take and give back
// one permit each in a loop, an acquisition of every permit is served, in
// turn: no acquisition queued after it is admitted before it (each
// admission takes a number from one counter as its call returns; a permit
// with a token above the large one's, numbered before it, overtook it).
func TestLargeAcquireDoesntStarve(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	const limit = 3
	var running atomic.Bool
	running.Store(true)
	var order atomic.Int64 // admissions, numbered as their calls return
	type admission struct{ token, n int64 }
	var mu sync.Mutex
	var small []admission
	var wg sync.WaitGroup
	for range limit {
		sem := etcdlock.NewSemaphore(newSession(t, client), name, limit)
		wg.Go(func() {
			for running.Load() {
				p, err := sem.Acquire(ctx)
				if err != nil {
					t.Errorf("Acquire: %v", err)
					return
				}
				mu.Lock()
				small = append(small, admission{p.Token(), order.Add(1)})
				mu.Unlock()
				time.Sleep(time.Millisecond)
				if err := p.Release(ctx); err != nil {
					t.Errorf("Release: %v", err)
					return
				}
			}
		})
	}
	time.Sleep(100 * time.Millisecond) // the workers are at it
	big := etcdlock.NewSemaphore(newSession(t, client), name, limit)
	p, err := big.AcquireN(ctx, limit)
	if err != nil {
		t.Fatalf("AcquireN(%d) while others loop: %v", limit, err)
	}
	bigN, bigToken := order.Add(1), p.Token()
	if ok, sum := holdsInEtcd(t, client, name, limit, p.Key()); !ok || sum != limit {
		t.Errorf("the large permit: holds in etcd %v, %d permits held, want true, %d (alone)", ok, sum, limit)
	}
	time.Sleep(20 * time.Millisecond)
	release(t, p)
	running.Store(false)
	wg.Wait()
	var overtook []int64
	for _, a := range small {
		if a.token > bigToken && a.n < bigN {
			overtook = append(overtook, a.token)
		}
	}
	if len(overtook) > 0 {
		t.Errorf("acquisitions queued after the large one (token %d) admitted before it: tokens %v", bigToken, overtook)
	}
	t.Logf("%d small admissions around the large one", len(small))
	if keys := lockKeys(t, client, name); len(keys) != 0 {
		t.Errorf("keys left: %q", keys)
	}
}

// TestAllocCancelDoesntStarve (x/sync's): a large acquisition that waits
// blocks a small one behind it (first come, first served), and its cancel
// admits the small one at once: nothing is left waiting for a permit that
// is free.
func TestAllocCancelDoesntStarve(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	const limit = 10
	// A TTL of a minute: a safety re-read cannot be what admits the small
	// one.
	sem := func() *etcdlock.Semaphore {
		return etcdlock.NewSemaphore(newSession(t, client, etcdlock.WithTTL(time.Minute)), name, limit)
	}
	held, err := sem().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer release(t, held)

	bigCtx, cancelBig := context.WithCancel(ctx)
	big := make(chan permitResult, 1)
	go func() {
		p, err := sem().AcquireN(bigCtx, limit)
		big <- permitResult{p, err}
	}()
	eventually(t, "the large acquisition's key", func() bool { return len(lockKeys(t, client, name)) == 2 })
	small := queuedAcquire(t, ctx, client, name, sem())
	if !waiting(small, 300*time.Millisecond) {
		t.Fatal("the small acquisition overtook the large one that waits before it")
	}
	start := time.Now()
	cancelBig()
	if r := <-big; !errors.Is(r.err, context.Canceled) {
		t.Errorf("cancelled AcquireN: got %v, want context.Canceled", r.err)
	}
	p := admitted(t, small)
	// Logged, not bounded: with a TTL of a minute, a cancel that woke no
	// one would leave it waiting past admitted's wait.
	t.Logf("the small acquisition admitted %v after the large one's cancel", time.Since(start))
	if ok, _ := holdsInEtcd(t, client, name, limit, p.Key()); !ok {
		t.Error("the small permit: etcd disagrees that it holds")
	}
	release(t, p)
	if keys := lockKeys(t, client, name); len(keys) != 1 || keys[0] != held.Key() {
		t.Errorf("keys: got %q, want only the first holder's %q (the cancelled one left nothing)", keys, held.Key())
	}
}

// TestWeightedCancelRandom: Sessions take random weights with deadlines
// that end at random points of their waits; every permit given holds in
// etcd, the limit is never exceeded, a cancelled acquisition leaves no key,
// and at the end every Session gets every permit (nothing starves, nothing
// is stranded).
func TestWeightedCancelRandom(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	const limit, workers = 5, 5
	rounds := 12
	if testing.Short() {
		rounds = 6
	}
	var inUse, most, given, cancelled atomic.Int64
	w := weightedWorker{t: t, client: client, limit: limit, inUse: &inUse, most: &most}
	sems := make([]*etcdlock.Semaphore, workers)
	var wg sync.WaitGroup
	for i := range sems {
		sems[i] = etcdlock.NewSemaphore(newSession(t, client), name, limit)
		wg.Go(func() {
			for range rounds {
				n := 1 + rand.IntN(limit)
				actx, cancel := context.WithTimeout(ctx, time.Duration(rand.IntN(150))*time.Millisecond)
				p, err := sems[i].AcquireN(actx, n)
				cancel()
				switch {
				case errors.Is(err, context.DeadlineExceeded):
					cancelled.Add(1)
					continue
				case err != nil:
					t.Errorf("AcquireN(%d): %v", n, err)
					return
				}
				given.Add(1)
				w.hold(p)
				if err := p.Release(ctx); err != nil {
					t.Errorf("Release: %v", err)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d acquisitions given, %d cancelled; most permits at once %d of %d", given.Load(), cancelled.Load(), most.Load(), limit)
	eventually(t, "no key left by a cancelled acquisition", func() bool { return len(lockKeys(t, client, name)) == 0 })
	for i, sem := range sems {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		p, err := sem.AcquireN(actx, limit)
		cancel()
		if err != nil {
			t.Fatalf("Session %d: every permit after the storm: %v", i, err)
		}
		release(t, p)
	}
}
