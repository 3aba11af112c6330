package etcdlock_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdlock/etcdlock"
)

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
