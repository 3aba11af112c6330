package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// deleteSeen returns a channel that receives, when etcd reports the delete
// of key (created at rev), whether done was closed by then; the watch ends
// with the test. done may be nil.
func deleteSeen(t *testing.T, client *clientv3.Client, key string, rev int64, done <-chan struct{}) <-chan bool {
	seen := make(chan bool, 1)
	ctx, cancel := context.WithCancel(context.Background())
	wch := client.Watch(ctx, key, clientv3.WithRev(rev+1), clientv3.WithFilterPut())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for wr := range wch {
			if len(wr.Events) > 0 {
				seen <- done != nil && isClosed(done)
				return
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-stopped })
	return seen
}

// TestMaxHold: WithMaxHold ends a hold that lasts past its cap, for every
// kind: Done closes no earlier than the cap, then etcd deletes the key, the
// next in the queue holds, an event says why, and the unlock returns
// ErrLockLost.
func TestMaxHold(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	const maxHold = time.Second
	kinds := append(slices.Clone(family), member{"MultiMutex", openMulti, openMutex, 1})
	for _, p := range kinds {
		t.Run(p.name, func(t *testing.T) {
			testflags.Parallel(t)
			ctx := testContext(t)
			name := lockName(t)
			seen := &losses{}
			s := newSession(t, client, etcdlock.WithMaxHold(maxHold), etcdlock.WithObserver(seen))
			l := p.open(s, name)
			start := time.Now() // no later than the hold began
			mustLock(t, l)
			done := l.Done()
			e := entryOf(t, client, name, s.Lease())
			deleted := deleteSeen(t, client, e.Key, e.Token, done)
			waiter := lockInGoroutine(t, ctx, famLocker{p.blocker(newSession(t, client), name)})

			if _, ok := closedWithin(done, maxHold+doneBound); !ok {
				t.Fatalf("Done still open %v after the hold began, with a cap of %v", maxHold+doneBound, maxHold)
			}
			if took := time.Since(start); took < maxHold {
				t.Fatalf("Done closed %v after the hold began, before its cap of %v", took, maxHold)
			}
			select {
			case closedFirst := <-deleted:
				// The library closes Done before it sends the delete: by the
				// time etcd reports the delete, Done is closed.
				if !closedFirst {
					t.Errorf("etcd reported the key's delete while Done was still open")
				}
			case <-time.After(doneBound):
				t.Fatalf("key %s not deleted %v after Done closed", e.Key, doneBound)
			}
			if err := waitErr(t, waiter.locked); err != nil {
				t.Fatalf("the next in the queue: got %v, want it to hold", err)
			}
			if keys := keysOfLease(t, client, name, s.Lease()); len(keys) > 0 {
				t.Fatalf("keys of the capped hold: got %v, want none", keys)
			}
			if err := l.Unlock(ctx); !errors.Is(err, etcdlock.ErrLockLost) {
				t.Fatalf("unlock after the cap: got %v, want ErrLockLost", err)
			}
			eventually(t, "HoldLost at the cap", func() bool { return len(seen.of(e.Key)) == 1 })
			if got := seen.of(e.Key)[0]; got.Reason != etcdlock.LossMaxHold {
				t.Fatalf("HoldLost: got reason %q, want %q", got.Reason, etcdlock.LossMaxHold)
			}
		})
	}
}

// TestMaxHoldScopes: Do's f sees its context cancelled at the cap, and Do
// returns ErrLockLost; Lead leads again, with a new token, after its cap.
func TestMaxHoldScopes(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	const maxHold = 500 * time.Millisecond
	ctx := testContext(t)

	name := lockName(t)
	m := etcdlock.NewMutex(newSession(t, client, etcdlock.WithMaxHold(maxHold)), name)
	err := m.Do(ctx, func(ctx context.Context) error {
		<-ctx.Done()
		return nil
	})
	if !errors.Is(err, etcdlock.ErrLockLost) {
		t.Fatalf("Do past its cap: got %v, want ErrLockLost", err)
	}
	if keys := lockKeys(t, client, name); len(keys) > 0 {
		t.Fatalf("keys after Do: got %v, want none", keys)
	}

	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var tokens []int64
	err = etcdlock.Lead(lctx, client, name+"-lead", func(ctx context.Context) error {
		h, _ := etcdlock.HoldFrom(ctx)
		tokens = append(tokens, h.Token)
		if len(tokens) == 2 {
			cancel()
		}
		<-ctx.Done()
		return nil
	}, etcdlock.WithTTL(5*time.Second), etcdlock.WithMaxHold(maxHold))
	if !errors.Is(err, context.Canceled) || len(tokens) != 2 || tokens[1] <= tokens[0] {
		t.Fatalf("Lead past its cap: got %v, tokens %v; want two terms, tokens increasing", err, tokens)
	}
}

// TestMaxHoldBadInput: a cap that is not positive is refused, and no lease
// is granted.
func TestMaxHoldBadInput(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	before, err := client.Leases(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []time.Duration{0, -time.Second} {
		s, err := etcdlock.NewSession(client, etcdlock.WithMaxHold(d))
		if !errors.Is(err, etcdlock.ErrInvalidArgument) || s != nil {
			t.Errorf("WithMaxHold(%v): got %v, %v; want ErrInvalidArgument", d, s, err)
		}
	}
	after, err := client.Leases(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	if !sharedEtcd() && len(after.Leases) != len(before.Leases) {
		t.Fatalf("leases: %d before, %d after bad input; want no new lease", len(before.Leases), len(after.Leases))
	}
}

// TestMaxHoldRacesUnlock: the holder unlocks about when its cap is reached.
// Either the unlock came first (nil) or the cap (ErrLockLost, one HoldLost
// event); in both cases no key of the hold is left once the unlock returns.
func TestMaxHoldRacesUnlock(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	const maxHold = 200 * time.Millisecond
	ctx := testContext(t)
	name := lockName(t)
	seen := &losses{}
	s := newSession(t, client, etcdlock.WithMaxHold(maxHold), etcdlock.WithObserver(seen))
	m := etcdlock.NewMutex(s, name)
	var lost, clean int
	for i := range 20 {
		if err := m.LockContext(ctx); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		time.Sleep(maxHold - 20*time.Millisecond + rand.N(40*time.Millisecond))
		switch err := m.UnlockContext(ctx); {
		case err == nil:
			clean++
		case errors.Is(err, etcdlock.ErrLockLost):
			lost++
		default:
			t.Fatalf("round %d: unlock: got %v, want nil or ErrLockLost", i, err)
		}
		if left := lockKeys(t, client, name); len(left) > 0 {
			t.Fatalf("round %d: keys after the unlock: got %v, want none", i, left)
		}
	}
	eventually(t, "one HoldLost per ErrLockLost", func() bool {
		seen.mu.Lock()
		defer seen.mu.Unlock()
		return len(seen.events) == lost
	})
	t.Logf("unlock first %d times, cap first %d times", clean, lost)
}

// TestCapHold: a cap given with one call's context caps that call's hold
// alone, for each kind of acquisition; with a Session cap too, the lesser
// applies. Judged in etcd: the capped key is deleted after the cap, the
// others stay.
func TestCapHold(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	const short = time.Second
	capped, err := etcdlock.CapHold(ctx, short)
	if err != nil {
		t.Fatal(err)
	}
	name := lockName(t)

	// cappedAt checks that done closes no earlier than the cap after start
	// and that etcd deleted key by then.
	cappedAt := func(what string, start time.Time, done <-chan struct{}, key string) {
		t.Helper()
		if _, ok := closedWithin(done, short+doneBound); !ok {
			t.Fatalf("%s: Done still open %v after the hold began, with a cap of %v", what, short+doneBound, short)
		}
		if took := time.Since(start); took < short {
			t.Fatalf("%s: Done closed %v after the hold began, before its cap of %v", what, took, short)
		}
		eventually(t, what+": the capped key's delete", func() bool { return !slices.Contains(lockKeys(t, client, name+"/"+what), key) })
	}

	s := newSession(t, client)
	free := etcdlock.NewMutex(s, name+"/free")
	if err := free.LockContext(ctx); err != nil { // no cap
		t.Fatal(err)
	}
	m := etcdlock.NewMutex(s, name+"/mutex")
	start := time.Now()
	if err := m.LockContext(capped); err != nil {
		t.Fatal(err)
	}
	cappedAt("mutex", start, m.Done(), m.Key())
	if err := m.UnlockContext(ctx); !errors.Is(err, etcdlock.ErrLockLost) {
		t.Fatalf("unlock of the capped hold: got %v, want ErrLockLost", err)
	}

	sem := etcdlock.NewSemaphore(s, name+"/sem", 2)
	start = time.Now()
	p, err := sem.Acquire(capped)
	if err != nil {
		t.Fatal(err)
	}
	cappedAt("sem", start, p.Done(), p.Key())
	if err := p.Release(ctx); !errors.Is(err, etcdlock.ErrLockLost) {
		t.Fatalf("release of the capped permit: got %v, want ErrLockLost", err)
	}

	start = time.Now()
	err = etcdlock.NewMutex(s, name+"/do").Do(capped, func(fctx context.Context) error {
		h, _ := etcdlock.HoldFrom(fctx)
		cappedAt("do", start, h.Done(), h.Key)
		<-fctx.Done()
		return nil
	})
	if !errors.Is(err, etcdlock.ErrLockLost) {
		t.Fatalf("Do under a cap reached: got %v, want ErrLockLost", err)
	}

	// A Session cap above the call's: the call's applies.
	long := newSession(t, client, etcdlock.WithMaxHold(time.Hour))
	lm := etcdlock.NewMutex(long, name+"/lesser")
	start = time.Now()
	if err := lm.LockContext(capped); err != nil {
		t.Fatal(err)
	}
	cappedAt("lesser", start, lm.Done(), lm.Key())
	_ = lm.UnlockContext(ctx)

	// The uncapped hold of the same Session outlived them all.
	if isClosed(free.Done()) || !slices.Contains(lockKeys(t, client, name+"/free"), free.Key()) {
		t.Fatal("the hold taken without a cap ended with the capped ones")
	}
	if err := free.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}

	for _, d := range []time.Duration{0, -time.Second} {
		if got, err := etcdlock.CapHold(ctx, d); !errors.Is(err, etcdlock.ErrInvalidArgument) || got != ctx {
			t.Errorf("CapHold(ctx, %v): got %v, want ErrInvalidArgument and ctx unchanged", d, err)
		}
	}
	//lint:ignore SA1012 a nil context is the bad input under test
	if _, err := etcdlock.CapHold(nil, time.Second); !errors.Is(err, etcdlock.ErrInvalidArgument) {
		t.Errorf("CapHold(nil, 1s): got %v, want ErrInvalidArgument", err)
	}
}

// A hold of one call whose context has a cap.
func ExampleCapHold() {
	srv, client := startExampleServer()
	defer srv.Close()
	s, err := etcdlock.NewSession(client)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	ctx := context.Background()
	capped, err := etcdlock.CapHold(ctx, 2*time.Second) // this hold ends after 2 s, whatever its holder does
	if err != nil {
		log.Fatal(err)
	}
	m := etcdlock.NewMutex(s, "reports/weekly")
	if err := m.LockContext(capped); err != nil {
		log.Fatal(err)
	}
	<-m.Done() // a holder that hangs past the cap is no longer alone: fence its writes
	fmt.Println("unlock:", errors.Is(m.UnlockContext(ctx), etcdlock.ErrLockLost))
	// Output: unlock: true
}
