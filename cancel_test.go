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
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

func TestLockContextCancelledWhileWaiting(t *testing.T) {
	testflags.Parallel(t)
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

// upTo returns a random duration from 0 to limit, in whole microseconds:
// short enough, for a few ms, to end a call at any point of its round trips
// to etcd.
func upTo(rng *rand.Rand, limit time.Duration) time.Duration {
	return time.Duration(rng.Int64N(int64(limit/time.Microsecond)+1)) * time.Microsecond
}

// newRand returns a random source seeded from the clock, and logs the seed.
func newRand(t *testing.T) (*rand.Rand, uint64) {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, 0)), seed
}

// putRecorder records the revisions at which key was put, from a watch
// opened before the first put.
type putRecorder struct {
	mu   sync.Mutex
	revs []int64 // increasing
	last int64   // the highest header revision the watch has reported
}

// recordPuts starts recording the puts of key from revision from, until
// ctx ends or the test does.
func recordPuts(t *testing.T, ctx context.Context, client *clientv3.Client, key string, from int64) *putRecorder {
	ctx, cancel := context.WithCancel(ctx)
	r := &putRecorder{}
	wch := client.Watch(ctx, key, clientv3.WithRev(from), clientv3.WithFilterDelete())
	var wg sync.WaitGroup
	wg.Go(func() {
		for wr := range wch {
			r.mu.Lock()
			for _, ev := range wr.Events {
				r.revs = append(r.revs, ev.Kv.ModRevision)
			}
			r.last = max(r.last, wr.Header.Revision)
			r.mu.Unlock()
		}
	})
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	return r
}

// sync waits until the watch has reported everything up to revision rev.
func (r *putRecorder) sync(t *testing.T, ctx context.Context, client *clientv3.Client, rev int64) {
	t.Helper()
	eventually(t, "the watch to catch up", func() bool {
		r.mu.Lock()
		last := r.last
		r.mu.Unlock()
		if last >= rev {
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
	lo, _ := slices.BinarySearch(r.revs, from+1)
	hi, _ := slices.BinarySearch(r.revs, to+1)
	return hi - lo
}

// startContender makes l (of another Session) take the lock for 0–3 ms at a
// time in a loop, until the returned function is called; that returns how
// many times it held the lock.
func startContender(t *testing.T, ctx context.Context, l famLock, seed uint64) (stop func() int) {
	rng := rand.New(rand.NewPCG(seed, 1))
	ctx, cancel := context.WithCancel(ctx)
	holds := 0
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			if err := l.Lock(ctx); err != nil {
				if ctx.Err() == nil {
					t.Errorf("contender's lock: got %v, want nil", err)
				}
				return
			}
			holds++
			time.Sleep(upTo(rng, 3*time.Millisecond))
			if err := l.Unlock(context.WithoutCancel(ctx)); err != nil {
				t.Errorf("contender's unlock: got %v, want nil", err)
				return
			}
			time.Sleep(upTo(rng, time.Millisecond))
		}
	})
	return func() int {
		cancel()
		wg.Wait()
		return holds
	}
}

// TestCancelRandom (D3): LockContext and TryLockFor calls ended at random
// points, by a deadline or a cancel 0–5 ms into the call, alone in the first
// half and against another Session that takes and releases the lock in the
// second. After every call that returns without the lock, no key of the
// Session is left in etcd, whenever the call ended; in particular after
// etcd applied the put but before the reply came back. A call that holds
// has put its key exactly once. It makes 600 calls; ETCDLOCK_SOAK=1 makes
// 10,000.
//
// The acquire Txn is observed through a watch on our key: a call that
// failed, yet whose key etcd had put, was cancelled after etcd applied the
// Txn (mid-RPC, or while waiting) and had to clean up.
func TestCancelRandom(t *testing.T) {
	testflags.Parallel(t)
	// 600 calls of a few round trips each: about 6 s alone, several times
	// that beside the quick suite's other tests under -race. The bound is
	// the test's, not the contract's: generous.
	calls := 600
	ctx, cancelAll := context.WithTimeout(context.Background(), 4*testTimeout)
	defer cancelAll()
	if os.Getenv("ETCDLOCK_SOAK") == "1" {
		calls = 10000
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.Background(), 30*time.Minute)
		defer cancel()
	}
	_, client := startServer(t)
	name := lockName(t)
	s := newSession(t, client)
	m := etcdlock.NewMutex(s, name)
	rng, seed := newRand(t)
	from := revision(t, client)
	puts := recordPuts(t, ctx, client, keyOf(name, s.Lease()), from+1)

	// Each call's revisions (from, to], around the call and its unlock.
	type span struct {
		from, to  int64
		held      bool
		contended bool
	}
	spans := make([]span, 0, calls)
	var held, ranOut, cancelled int
	stopContender := func() int { return 0 }
	began := time.Now()
	for i := range calls {
		contended := i >= calls/2
		if i == calls/2 {
			stopContender = startContender(t, ctx, mutexLock{etcdlock.NewMutex(newSession(t, startClient(t, client)), name)}, seed)
		}
		d := upTo(rng, 5*time.Millisecond)
		var cctx context.Context
		var cancel context.CancelFunc
		ends, stopTimer := "deadline", func() bool { return false }
		if rng.IntN(2) == 0 {
			cctx, cancel = context.WithTimeout(ctx, d)
		} else {
			ends = "cancel"
			cctx, cancel = context.WithCancel(ctx)
			stopTimer = time.AfterFunc(d, cancel).Stop
		}
		call := "LockContext"
		var ok bool
		var err error
		if rng.IntN(2) == 0 {
			err = m.LockContext(cctx)
			ok = err == nil
		} else {
			wait := upTo(rng, 5*time.Millisecond)
			call = "TryLockFor(" + wait.String() + ")"
			ok, err = m.TryLockFor(cctx, wait)
		}
		stopTimer()
		cancel()

		mine := keysOfLease(t, client, name, s.Lease())
		switch {
		case ok:
			held++
			if len(mine) != 1 {
				t.Errorf("call %d, %s with a %v %s: got the lock with keys %q, want our one key", i, call, d, ends, mine)
			}
			if err := m.UnlockContext(ctx); err != nil {
				t.Fatalf("call %d: UnlockContext: got %v, want nil", i, err)
			}
		case err == nil:
			ranOut++
		case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
			cancelled++
		default:
			t.Fatalf("call %d, %s with a %v %s: got %v, want nil or the context's error", i, call, d, ends, err)
		}
		if !ok && len(mine) != 0 {
			t.Errorf("call %d, %s with a %v %s: got %v and keys %q left, want no key of ours", i, call, d, ends, err, mine)
		}
		to := revision(t, client)
		spans = append(spans, span{from: from, to: to, held: ok, contended: contended})
		from = to
		if t.Failed() {
			break
		}
	}
	took := time.Since(began)
	contenderHolds := stopContender()

	puts.sync(t, ctx, client, from)
	var afterApply, failed [2]int // by contended
	for _, sp := range spans {
		n := puts.putsIn(sp.from, sp.to)
		c := 0
		if sp.contended {
			c = 1
		}
		switch {
		case sp.held && n != 1:
			t.Errorf("a call that held put our key %d times, want once", n)
		case !sp.held:
			failed[c]++
			if n > 0 {
				afterApply[c]++
			}
		}
	}
	if keys := lockKeys(t, client, name); len(keys) != 0 {
		t.Errorf("keys at the end: got %q, want none", keys)
	}
	t.Logf("%d calls in %v (%v per call), the contender held %d times", len(spans), took.Round(time.Millisecond),
		(took / time.Duration(max(len(spans), 1))).Round(time.Microsecond), contenderHolds)
	t.Logf("  %-55s %7d", "held (unlocked at once)", held)
	t.Logf("  %-55s %7d", "ended: the context's error", cancelled)
	t.Logf("  %-55s %7d", "TryLockFor wait ran out: (false, nil)", ranOut)
	t.Logf("  %-55s %7d / %d", "failed after etcd put our key, alone (mid-RPC)", afterApply[0], failed[0])
	t.Logf("  %-55s %7d / %d", "failed after etcd put our key, contended", afterApply[1], failed[1])
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

// An etcd error that comes as a TryLockFor's wait runs out is that error,
// not "the wait ran out": (false, err), and nothing left behind.
func TestTryLockForErrorAtWaitEnd(t *testing.T) {
	testflags.Parallel(t)
	srv, client := startServer(t)
	var fault txnFault
	ic := serverClient(t, srv, fault.intercept, nil)
	name := lockName(t)
	ctx := testContext(t)
	holder := etcdlock.NewMutex(newSession(t, client), name)
	holder.Lock()
	defer holder.Unlock()

	const wait = 300 * time.Millisecond
	m := etcdlock.NewMutex(newSession(t, ic), name)
	// The enqueue is applied; its reply is lost after the wait has run out.
	fault.arm(0, 1, func(_ context.Context, invoke func() error) error {
		if err := invoke(); err != nil {
			return err
		}
		time.Sleep(wait + 100*time.Millisecond)
		return status.Error(codes.Unavailable, "test: reply lost")
	})
	ok, err := m.TryLockFor(ctx, wait)
	if ok || err == nil || status.Code(errors.Unwrap(err)) != codes.Unavailable {
		t.Errorf("TryLockFor = %v, %v; want false and the Unavailable error", ok, err)
	}
	if keys := lockKeys(t, client, name); len(keys) != 1 {
		t.Errorf("keys after the failed try = %q, want only the holder's", keys)
	}
}
