package etcdlock_test

// Cancellation: a call that returns without the lock leaves nothing behind,
// wherever its context ends (D3).

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdlock/etcdlock"
)

func TestLockContextCancelledWhileWaiting(t *testing.T) {
	_, client := startServer(t)
	name := lockName(t)
	ctx := testContext(t)
	holder := etcdlock.NewMutex(newSession(t, client), name)
	holder.Lock()

	waiterSession := newSession(t, client)
	waiter := etcdlock.NewMutex(waiterSession, name)
	wctx, cancel := context.WithCancel(ctx)
	ch := result(func() error { return waiter.LockContext(wctx) })
	eventually(t, "the waiter's key", func() bool { return len(lockKeys(t, client, name)) == 2 })
	cancel()
	if err := waitErr(t, ch); !errors.Is(err, context.Canceled) {
		t.Fatalf("LockContext = %v, want context.Canceled", err)
	}
	if keys := lockKeys(t, client, name); len(keys) != 1 {
		t.Errorf("keys after the cancelled wait = %q, want only the holder's", keys)
	}

	// A local waiter, queued behind a goroutine of its own process, too.
	local := etcdlock.NewMutex(waiterSession, name)
	release := make(chan struct{})
	go1 := result(func() error {
		if err := local.LockContext(ctx); err != nil {
			return err
		}
		<-release
		return local.UnlockContext(ctx)
	})
	eventually(t, "the first waiter's key", func() bool { return len(lockKeys(t, client, name)) == 2 })
	dctx, dcancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer dcancel()
	if err := local.LockContext(dctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("LockContext queued locally = %v, want context.DeadlineExceeded", err)
	}
	holder.Unlock()
	close(release)
	if err := waitErr(t, go1); err != nil {
		t.Fatal(err)
	}
	if keys := lockKeys(t, client, name); len(keys) != 0 {
		t.Errorf("keys at the end = %q, want none", keys)
	}
}

// randomDeadline returns a deadline between 0 and 3 ms: short enough to end
// a call at any point of its round trips to etcd.
func randomDeadline() time.Duration {
	return time.Duration(rand.Int64N(int64(3*time.Millisecond) + 1))
}

// putRecorder records the revisions at which key was put, from a watch
// opened before the first put.
type putRecorder struct {
	mu   sync.Mutex
	revs []int64
	last int64 // the highest header revision the watch has reported
}

func recordPuts(ctx context.Context, client *clientv3.Client, key string, from int64) *putRecorder {
	r := &putRecorder{}
	wch := client.Watch(ctx, key, clientv3.WithRev(from), clientv3.WithFilterDelete())
	go func() {
		for wr := range wch {
			r.mu.Lock()
			for _, ev := range wr.Events {
				r.revs = append(r.revs, ev.Kv.ModRevision)
			}
			r.last = max(r.last, wr.Header.Revision)
			r.mu.Unlock()
		}
	}()
	return r
}

// sync waits until the watch has reported everything up to etcd's current
// revision.
func (r *putRecorder) sync(t *testing.T, ctx context.Context, client *clientv3.Client) {
	t.Helper()
	now := revision(t, client)
	eventually(t, "the watch to catch up", func() bool {
		r.mu.Lock()
		last := r.last
		r.mu.Unlock()
		if last >= now {
			return true
		}
		_ = client.RequestProgress(ctx)
		return false
	})
}

// putsIn returns how many puts of the key fell in the revisions (from, to].
func (r *putRecorder) putsIn(from, to int64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rev := range r.revs {
		if rev > from && rev <= to {
			n++
		}
	}
	return n
}

// startContender makes another session take and release the lock in a loop, until
// the returned function is called.
func startContender(t *testing.T, client *clientv3.Client, name string) (stop func()) {
	m := etcdlock.NewMutex(newSession(t, client), name)
	ctx, cancel := context.WithCancel(testContext(t))
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			if err := m.LockContext(ctx); err != nil {
				continue
			}
			time.Sleep(randomDeadline() / 2)
			if err := m.UnlockContext(ctx); err != nil {
				t.Errorf("contender's UnlockContext: %v", err)
				return
			}
			time.Sleep(randomDeadline() / 2)
		}
	})
	return func() {
		cancel()
		wg.Wait()
	}
}

// TestCancelRandom (D3): hundreds of LockContext and TryLockFor calls with
// deadlines of 0-3 ms, alone and against another session that takes and
// releases the lock. After every call that returns without the lock, no key
// of the session is left in etcd, whenever the deadline struck; in
// particular after etcd applied the put but before the reply came back.
func TestCancelRandom(t *testing.T) {
	const iterations = 600 // the second half against a contender
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	s := newSession(t, client)
	m := etcdlock.NewMutex(s, name)

	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	puts := recordPuts(wctx, client, keyOf(name, s.Lease()), revision(t, client)+1)

	// The revisions (from, to] of each call that failed, by phase.
	type span struct{ from, to int64 }
	var (
		held    [2]int
		failed  [2][]span
		stop    = func() {}
		prev    = revision(t, client)
		started = time.Now()
	)
	for i := range iterations {
		phase := 0
		if i >= iterations/2 {
			phase = 1
			if i == iterations/2 {
				stop = startContender(t, client, name)
			}
		}
		d := randomDeadline()
		cctx, cancel := context.WithTimeout(ctx, d)
		var (
			ok   bool
			err  error
			call string
		)
		if i%2 == 0 {
			call = "LockContext"
			err = m.LockContext(cctx)
			ok = err == nil
		} else {
			wait := randomDeadline()
			call = "TryLockFor(" + wait.String() + ")"
			ok, err = m.TryLockFor(cctx, wait)
		}
		cancel()

		mine := keysOfLease(t, client, name, s.Lease())
		now := revision(t, client)
		if ok {
			held[phase]++
			if len(mine) != 1 {
				t.Errorf("iteration %d, %s with a %v deadline: got the lock with keys %q, want our one key", i, call, d, mine)
			}
			if err := m.UnlockContext(ctx); err != nil {
				t.Fatalf("iteration %d: UnlockContext: %v", i, err)
			}
		} else {
			failed[phase] = append(failed[phase], span{prev, now})
			if len(mine) != 0 {
				t.Errorf("iteration %d, %s with a %v deadline: got %v and keys %q left, want no key of ours", i, call, d, err, mine)
			}
		}
		prev = now
		if t.Failed() {
			break
		}
	}
	stop()
	elapsed := time.Since(started)

	puts.sync(t, ctx, client)
	for phase, what := range []string{"alone", "contended"} {
		applied := 0
		for _, sp := range failed[phase] {
			if puts.putsIn(sp.from, sp.to) > 0 {
				applied++
			}
		}
		t.Logf("%s: %d calls held the lock; %d returned without it, %d of them after etcd applied our put; none left a key",
			what, held[phase], len(failed[phase]), applied)
	}
	t.Logf("%d calls in %v", iterations, elapsed)
	if keys := lockKeys(t, client, name); len(keys) != 0 {
		t.Errorf("keys at the end: got %q, want none", keys)
	}
}

// TestCancelRandomUpstream (D3 upstream): the same calls on
// concurrency.Mutex leave their key behind after a cancel that strikes once
// etcd applied the put.
func TestCancelRandomUpstream(t *testing.T) {
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	s := newUpstreamSession(t, client, 30)
	m := concurrency.NewMutex(s, name)
	key := keyOf(name, s.Lease())

	calls, failed, leaks := 0, 0, 0
	// 200 calls, and more only until one leaks: it can only get stronger.
	for ; calls < 200 || leaks == 0 && calls < 2000; calls++ {
		cctx, cancel := context.WithTimeout(ctx, randomDeadline())
		var err error
		if calls%2 == 0 {
			err = m.Lock(cctx)
		} else {
			err = m.TryLock(cctx)
		}
		cancel()
		if err == nil {
			if err := m.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			continue
		}
		failed++
		if keys := keysOfLease(t, client, name, s.Lease()); len(keys) != 0 {
			leaks++
			if _, err := client.Delete(ctx, key); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("upstream: %d calls, %d returned an error, %d of them left their key", calls, failed, leaks)
	if leaks == 0 {
		t.Errorf("upstream calls that left their key after a cancel: got 0 of %d failed calls, want some (the defect)", failed)
	}
}

// TestSoakCancel cancels lock calls at random points, 0–5 ms into the call,
// with and without another process contending, and checks after every call
// that no key of ours is left in etcd. ETCDLOCK_SOAK=1 runs 10,000 calls.
//
// The acquire Txn is observed through a watch on our key: a call that
// failed, yet whose key etcd had put, was cancelled after etcd applied the
// Txn (mid-RPC, or while waiting) and had to clean up.
func TestSoakCancel(t *testing.T) {
	n := 300
	if os.Getenv("ETCDLOCK_SOAK") == "1" {
		n = 10000
	}
	srv, client := startServer(t)
	ctx := testContext(t)
	if n > 300 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.Background(), 30*time.Minute)
		defer cancel()
	}
	name := lockName(t)
	s := newSession(t, client)
	m := etcdlock.NewMutex(s, name)
	key := keyOf(name, s.Lease())
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	t.Logf("seed %d", seed)

	// Every put of our key, by revision.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	start := revision(t, client)
	wch := client.Watch(wctx, key, clientv3.WithRev(start+1), clientv3.WithFilterDelete(), clientv3.WithProgressNotify())
	var (
		mu      sync.Mutex
		puts    []int64
		watched int64 // the watch has seen every event up to this revision
	)
	var wg sync.WaitGroup
	wg.Go(func() {
		for wr := range wch {
			mu.Lock()
			for _, ev := range wr.Events {
				puts = append(puts, ev.Kv.ModRevision)
			}
			if wr.Header.Revision > watched {
				watched = wr.Header.Revision
			}
			mu.Unlock()
		}
	})
	defer wg.Wait()
	defer wcancel()

	// The contender, in the second half: another Session that takes the lock
	// for 0–3 ms at a time.
	contend := make(chan struct{})
	stopContender := make(chan struct{})
	var contenderHolds atomic.Int64
	var cwg sync.WaitGroup
	defer cwg.Wait()
	cm := etcdlock.NewMutex(newSession(t, srv.Client(t)), name)
	cwg.Go(func() {
		crng := rand.New(rand.NewPCG(uint64(seed), 1))
		select {
		case <-contend:
		case <-stopContender:
			return
		}
		for {
			select {
			case <-stopContender:
				return
			default:
			}
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := cm.LockContext(cctx)
			cancel()
			if err != nil {
				t.Errorf("contender LockContext: got %v, want nil", err)
				return
			}
			contenderHolds.Add(1)
			time.Sleep(time.Duration(crng.IntN(3000)) * time.Microsecond)
			if err := cm.UnlockContext(ctx); err != nil {
				t.Errorf("contender UnlockContext: got %v, want nil", err)
				return
			}
			time.Sleep(time.Duration(crng.IntN(1000)) * time.Microsecond)
		}
	})
	stopOnce := sync.OnceFunc(func() { close(stopContender) })
	defer stopOnce()

	type call struct {
		from, to  int64 // revisions around the call and its unlock
		held      bool
		contended bool
	}
	calls := make([]call, 0, n)
	var keysLeft, held, ranOut, cancelled int
	began := time.Now()
	from := start
	for i := range n {
		contended := i >= n/2
		if i == n/2 {
			close(contend)
		}
		d := time.Duration(rng.IntN(5001)) * time.Microsecond
		var cctx context.Context
		var cancel context.CancelFunc
		if rng.IntN(2) == 0 {
			cctx, cancel = context.WithTimeout(ctx, d)
		} else {
			cctx, cancel = context.WithCancel(ctx)
			time.AfterFunc(d, cancel)
		}
		var ok bool
		var err error
		if rng.IntN(2) == 0 {
			err = m.LockContext(cctx)
			ok = err == nil
		} else {
			ok, err = m.TryLockFor(cctx, time.Duration(rng.IntN(5001))*time.Microsecond)
		}
		cancel()
		switch {
		case ok:
			held++
			if err := m.UnlockContext(ctx); err != nil {
				t.Fatalf("call %d: UnlockContext: got %v, want nil", i, err)
			}
		case err == nil:
			ranOut++
		case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
			cancelled++
		default:
			t.Fatalf("call %d: got %v, want nil or the context's error", i, err)
		}
		resp, err := client.Get(ctx, key)
		if err != nil {
			t.Fatalf("get %q: got %v, want nil", key, err)
		}
		if len(resp.Kvs) != 0 {
			keysLeft++
			t.Errorf("call %d (held %v, err %v): key %q left in etcd", i, ok, err, key)
		}
		calls = append(calls, call{from: from, to: resp.Header.Revision, held: ok, contended: contended})
		from = resp.Header.Revision
	}
	took := time.Since(began)
	stopOnce()
	cwg.Wait()

	// Wait until the watch has seen every revision of the run.
	eventually(t, "the watch to catch up", func() bool {
		if err := client.RequestProgress(wctx); err != nil {
			t.Fatalf("RequestProgress: got %v, want nil", err)
		}
		time.Sleep(20 * time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		return watched >= from
	})
	mu.Lock()
	slices.Sort(puts)
	var afterApply [2]int // failed calls whose key etcd had put, by contended
	var failed [2]int
	for _, c := range calls {
		lo, _ := slices.BinarySearch(puts, c.from+1)
		hi, _ := slices.BinarySearch(puts, c.to+1)
		wrote := hi - lo
		ci := 0
		if c.contended {
			ci = 1
		}
		switch {
		case c.held && wrote != 1:
			t.Errorf("a held call put our key %d times, want once", wrote)
		case !c.held:
			failed[ci]++
			if wrote > 0 {
				afterApply[ci]++
			}
		}
	}
	mu.Unlock()

	if got := lockKeys(t, client, name); len(got) != 0 {
		t.Errorf("keys at the end: got %q, want none", got)
	}
	t.Logf("%d calls in %v (%v per call), contender held %d times", n, took.Round(time.Millisecond),
		(took / time.Duration(n)).Round(time.Microsecond), contenderHolds.Load())
	t.Logf("  %-50s %7d", "held (unlocked at once)", held)
	t.Logf("  %-50s %7d", "cancelled: the context's error", cancelled)
	t.Logf("  %-50s %7d", "TryLockFor wait ran out: (false, nil)", ranOut)
	t.Logf("  %-50s %7d / %d", "failed after etcd put our key, uncontended (mid-RPC)", afterApply[0], failed[0])
	t.Logf("  %-50s %7d / %d", "failed after etcd put our key, contended", afterApply[1], failed[1])
	t.Logf("  %-50s %7d", "calls that left our key in etcd", keysLeft)
}
