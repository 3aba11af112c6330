package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
)

// The deadlock test of issue 23: Sessions that each take random subsets of
// the same names at once never wait in a cycle, where the same workload
// taken lock by lock does.

// multiRun is what a run of the workload saw.
type multiRun struct {
	holds, timeouts atomic.Int64
}

// multiWorkload runs workers Sessions (each on a client of its own) that
// each, until the run's time is up, take a random subset of 2 to 3 of
// names, hold it a little, and release it: at once with a MultiMutex, or
// lock by lock with Mutexes in a random order (lockByLock). Each
// acquisition may take at most wait. At each hold it judges in etcd that
// each name's oldest key is the holder's, at the hold's token, in one read;
// and in memory that no two holders of a name overlap.
func multiWorkload(t *testing.T, client *clientv3.Client, names []string, workers int, d, wait time.Duration, lockByLock bool, seed uint64) *multiRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d+wait+testTimeout)
	defer cancel()
	var run multiRun
	holders := make([]atomic.Int32, len(names))
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for w := range workers {
		s := newSession(t, startClient(t, client))
		rng := rand.New(rand.NewPCG(seed, uint64(w)))
		wg.Go(func() {
			for time.Now().Before(end) && !t.Failed() {
				idx := rng.Perm(len(names))[:2+rng.IntN(2)]
				picked := make([]string, len(idx))
				for i, j := range idx {
					picked[i] = names[j]
				}
				actx, cancel := context.WithTimeout(ctx, wait)
				unlock, token, err := multiTake(actx, s, picked, lockByLock)
				cancel()
				switch {
				case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
					run.timeouts.Add(1)
					if !lockByLock {
						t.Errorf("worker %d: taking %q: no hold after %v", w, picked, wait)
					}
					continue
				case err != nil:
					t.Errorf("worker %d: taking %q: %v", w, picked, err)
					return
				}
				for _, j := range idx {
					if n := holders[j].Add(1); n != 1 {
						t.Errorf("%q: %d holders at once", names[j], n)
					}
				}
				if !lockByLock {
					if err := firstInEvery(ctx, s, picked, token); err != nil {
						t.Errorf("worker %d: %v", w, err)
					}
				}
				run.holds.Add(1)
				time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
				for _, j := range idx {
					holders[j].Add(-1)
				}
				if err := unlock(ctx); err != nil {
					t.Errorf("worker %d: releasing %q: %v", w, picked, err)
					return
				}
			}
		})
	}
	wg.Wait()
	return &run
}

// multiTake takes the names on s, at once or lock by lock (releasing what
// it took when it fails), and returns the release and the token (at once:
// the shared token).
func multiTake(ctx context.Context, s *etcdlock.Session, names []string, lockByLock bool) (func(context.Context) error, int64, error) {
	if !lockByLock {
		m := etcdlock.NewMultiMutex(s, names...)
		if err := m.LockContext(ctx); err != nil {
			return nil, 0, err
		}
		return m.UnlockContext, m.Token(), nil
	}
	var taken []*etcdlock.Mutex
	unlock := func(ctx context.Context) error {
		var errs []error
		for _, m := range slices.Backward(taken) {
			errs = append(errs, m.UnlockContext(ctx))
		}
		return errors.Join(errs...)
	}
	for _, name := range names {
		m := etcdlock.NewMutex(s, name)
		if err := m.LockContext(ctx); err != nil {
			_ = unlock(context.WithoutCancel(ctx))
			return nil, 0, err
		}
		taken = append(taken, m)
	}
	return unlock, 0, nil
}

// firstInEvery judges in etcd, in one read, that the key of s for each
// name is the oldest of its queue, created at token.
func firstInEvery(ctx context.Context, s *etcdlock.Session, names []string, token int64) error {
	var ops []clientv3.Op
	for _, name := range names {
		ops = append(ops, clientv3.OpGet(name+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)))
	}
	resp, err := s.Client().Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return fmt.Errorf("read the queues: %w", err)
	}
	for i, name := range names {
		kvs := resp.Responses[i].GetResponseRange().Kvs
		if want := keyOf(name, s.Lease()); len(kvs) != 1 || string(kvs[0].Key) != want || kvs[0].CreateRevision != token {
			return fmt.Errorf("holder of %q at revision %d: got %v, want %s at %d", name, resp.Header.Revision, kvs, want, token)
		}
	}
	return nil
}

// multiRunFor is how long the deadlock test's workload runs: 30 s, or a few
// seconds under -short; ETCDLOCK_MULTI_LONG sets it (1: 10 minutes, or a
// duration).
func multiRunFor(t *testing.T) time.Duration {
	if os.Getenv("ETCDLOCK_MULTI_LONG") == "" && testing.Short() {
		return 3 * time.Second
	}
	return faultsFor(t, "ETCDLOCK_MULTI_LONG", 30*time.Second)
}

// TestMultiNoDeadlock: Sessions that take random subsets of the same names
// at once all get every hold, with one holder per name at a time.
func TestMultiNoDeadlock(t *testing.T) {
	_, client := startServer(t)
	names := multiNames(t, 5)
	d := multiRunFor(t)
	run := multiWorkload(t, client, names, 4, d, 20*time.Second, false, 23)
	t.Logf("MultiMutex: %d holds in %v by 4 Sessions over %d names, %d acquisitions past 20 s", run.holds.Load(), d, len(names), run.timeouts.Load())
	if run.holds.Load() == 0 {
		t.Fatal("no hold at all")
	}
	for _, name := range names {
		if keys := lockKeys(t, client, name); len(keys) != 0 {
			t.Errorf("keys of %q after the run: got %q, want none", name, keys)
		}
	}
}

// TestMultiLockByLockDeadlocks: the same names taken lock by lock in two
// orders wait in a cycle until a timeout breaks it, judged in etcd; taken
// at once, in the same orders, they never do.
func TestMultiLockByLockDeadlocks(t *testing.T) {
	_, client := startServer(t)
	ctx := testContext(t)
	names := multiNames(t, 2)
	orders := [][]string{{names[0], names[1]}, {names[1], names[0]}}
	sessions := []*etcdlock.Session{newSession(t, startClient(t, client)), newSession(t, startClient(t, client))}

	// Lock by lock, with a barrier between the first lock and the second:
	// each holds the lock the other waits for.
	const wait = 3 * time.Second
	var barrier sync.WaitGroup
	barrier.Add(2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			first := etcdlock.NewMutex(sessions[i], orders[i][0])
			if err := first.LockContext(ctx); err != nil {
				errs[i] = err
				barrier.Done()
				return
			}
			defer func() { _ = first.UnlockContext(ctx) }()
			barrier.Done()
			barrier.Wait()
			wctx, cancel := context.WithTimeout(ctx, wait)
			defer cancel()
			second := etcdlock.NewMutex(sessions[i], orders[i][1])
			if errs[i] = second.LockContext(wctx); errs[i] == nil {
				_ = second.UnlockContext(ctx)
			}
		})
	}
	// The cycle, in etcd: in each queue, one Session holds and the other
	// waits, crosswise.
	eventually(t, "both waiting", func() bool {
		for _, name := range names {
			if len(lockKeys(t, client, name)) != 2 {
				return false
			}
		}
		return true
	})
	for i, name := range names {
		q, err := etcdlock.Inspect(ctx, client, name)
		if err != nil || len(q) != 2 || q[0].Lease != sessions[i].Lease() || q[1].Lease != sessions[1-i].Lease() {
			t.Fatalf("queue of %q: got %+v, %v; want Session %d holding and %d waiting", name, q, err, i, 1-i)
		}
	}
	wg.Wait()
	timedOut := 0
	for i, err := range errs {
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			timedOut++
		case err != nil:
			t.Fatalf("lock by lock, Session %d: %v", i, err)
		}
	}
	if timedOut == 0 {
		t.Fatal("lock by lock, in two orders: both got both locks, want a wait in a cycle until a timeout")
	}
	t.Logf("lock by lock: %d of 2 timed out after %v in a cycle", timedOut, wait)

	// At once, in the same two orders, started together many times: every
	// acquisition holds.
	for round := range 20 {
		var start sync.WaitGroup
		start.Add(1)
		for i := range 2 {
			wg.Go(func() {
				start.Wait()
				m := etcdlock.NewMultiMutex(sessions[i], orders[i]...)
				wctx, cancel := context.WithTimeout(ctx, wait)
				defer cancel()
				if err := m.LockContext(wctx); err != nil {
					t.Errorf("round %d, Session %d: LockContext: %v", round, i, err)
					return
				}
				if err := m.UnlockContext(ctx); err != nil {
					t.Errorf("round %d, Session %d: UnlockContext: %v", round, i, err)
				}
			})
		}
		start.Done()
		wg.Wait()
	}

	// The random workload, lock by lock, for comparison: timeouts counted,
	// not asserted (a cycle needs an unlucky interleaving).
	if !testing.Short() {
		run := multiWorkload(t, client, multiNames(t, 5), 4, 3*time.Second, time.Second, true, 23)
		t.Logf("lock by lock, random orders: %d holds, %d acquisitions timed out after 1 s", run.holds.Load(), run.timeouts.Load())
	}
}
