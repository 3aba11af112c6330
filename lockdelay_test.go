package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// TestLockDelay: a waiter made WithLockDelay holds, as etcd shows, but its
// acquisition returns only d after the holder's key went with its lease
// (revoked, or expired once its keep-alives were cut off); after a clean
// unlock it returns at once.
func TestLockDelay(t *testing.T) {
	testflags.Parallel(t)
	srv, client := startServer(t)
	const d = time.Second

	// kill ends the holder without an unlock, and returns a time no later
	// than etcd's delete of its key.
	crash := func(t *testing.T, kill func(holder *etcdlock.Session) time.Time) {
		ctx := testContext(t)
		name := lockName(t)
		holderClient := serverClient(t, srv, nil, nil)
		holder := aliveSession(t, holderClient, 2*time.Second)
		if err := etcdlock.NewMutex(holder, name).LockContext(ctx); err != nil {
			t.Fatal(err)
		}
		ws := newSession(t, client, etcdlock.WithLockDelay(d))
		locked := result(func() error { return etcdlock.NewMutex(ws, name).LockContext(ctx) })
		eventually(t, "the waiter queued", func() bool { return len(lockKeys(t, client, name)) == 2 })
		gone := deleteSeen(t, client, keyOf(name, holder.Lease()), entryOf(t, client, name, holder.Lease()).Token, nil)
		before := kill(holder)
		<-gone
		// The waiter's key holds in etcd while its acquisition waits out the delay.
		eventually(t, "the waiter's key holding", func() bool {
			e := inspect(t, ctx, client, name)
			return len(e) == 1 && e[0].Lease == ws.Lease() && e[0].Holds
		})
		if err := waitErr(t, locked); err != nil {
			t.Fatalf("the waiter: %v", err)
		}
		if took := time.Since(before); took < d {
			t.Fatalf("the waiter returned at most %v after the holder's key went with its lease, before the delay %v", took, d)
		}
	}
	t.Run("revoked", func(t *testing.T) {
		crash(t, func(holder *etcdlock.Session) time.Time {
			before := time.Now()
			if _, err := client.Revoke(testContext(t), holder.Lease()); err != nil {
				t.Fatal(err)
			}
			return before
		})
	})
	t.Run("expired", func(t *testing.T) {
		crash(t, func(holder *etcdlock.Session) time.Time {
			// The holder's client closes: no keep-alive; etcd expires the
			// lease, no earlier than the seconds it had left (rounded down).
			asked := time.Now()
			left, _ := leaseTTL(t, client, holder.Lease())
			_ = holder.Client().Close()
			return asked.Add(time.Duration(left) * time.Second)
		})
	})

	t.Run("clean unlock", func(t *testing.T) {
		const long = 10 * time.Second
		ctx := testContext(t)
		name := lockName(t)
		m := etcdlock.NewMutex(newSession(t, client), name)
		if err := m.LockContext(ctx); err != nil {
			t.Fatal(err)
		}
		w := etcdlock.NewMutex(newSession(t, client, etcdlock.WithLockDelay(long)), name)
		locked := result(func() error { return w.LockContext(ctx) })
		eventually(t, "the waiter queued", func() bool { return len(lockKeys(t, client, name)) == 2 })
		start := time.Now()
		if err := m.UnlockContext(ctx); err != nil {
			t.Fatal(err)
		}
		if err := waitErr(t, locked); err != nil {
			t.Fatal(err)
		}
		checkBound(t, "the hand-off after a clean unlock", time.Since(start), long/2)
	})

	t.Run("ctx ends in the delay", func(t *testing.T) {
		ctx := testContext(t)
		name := lockName(t)
		holder := newSession(t, client)
		if err := etcdlock.NewMutex(holder, name).LockContext(ctx); err != nil {
			t.Fatal(err)
		}
		ws := newSession(t, client, etcdlock.WithLockDelay(time.Hour))
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		locked := result(func() error { return etcdlock.NewMutex(ws, name).LockContext(wctx) })
		eventually(t, "the waiter queued", func() bool { return len(lockKeys(t, client, name)) == 2 })
		if _, err := client.Revoke(ctx, holder.Lease()); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the waiter's key holding", func() bool {
			e := inspect(t, ctx, client, name)
			return len(e) == 1 && e[0].Lease == ws.Lease()
		})
		cancel()
		if err := waitErr(t, locked); !errors.Is(err, context.Canceled) {
			t.Fatalf("the waiter, its ctx ended in the delay: got %v, want context.Canceled", err)
		}
		if keys := keysOfLease(t, client, name, ws.Lease()); len(keys) > 0 {
			t.Fatalf("the waiter's keys after it gave up: %v, want none", keys)
		}
	})

	// The hold is made before the delay: a loss during the delay (the
	// waiter's key deleted by hand, or its cap reached) ends the
	// acquisition with ErrLockLost at once, its key gone, rather than after
	// the delay with a hold whose Done closes as it returns.
	lostInDelay := func(t *testing.T, opts []etcdlock.SessionOption, lose func(ctx context.Context, ws *etcdlock.Session, name string)) {
		ctx := testContext(t)
		for try := 1; ; try++ {
			name := fmt.Sprintf("%s-%d", lockName(t), try)
			holder := newSession(t, client)
			if err := etcdlock.NewMutex(holder, name).LockContext(ctx); err != nil {
				t.Fatal(err)
			}
			var lost sync.WaitGroup
			lost.Add(1)
			var once sync.Once
			observer := etcdlock.ObserverFunc(func(e etcdlock.Event) {
				if e.Kind == etcdlock.HoldLost {
					once.Do(lost.Done)
				}
			})
			ws := newSession(t, client, append(opts, etcdlock.WithLockDelay(time.Hour), etcdlock.WithObserver(observer))...)
			locked := result(func() error { return etcdlock.NewMutex(ws, name).LockContext(ctx) })
			eventually(t, "the waiter queued", func() bool { return len(lockKeys(t, client, name)) == 2 })
			if _, err := client.Revoke(ctx, holder.Lease()); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the waiter's key holding", func() bool {
				e := inspect(t, ctx, client, name)
				return len(e) == 1 && e[0].Lease == ws.Lease() && e[0].Holds
			})
			start := time.Now()
			lose(ctx, ws, name)
			err := waitErr(t, locked)
			if err == nil && try < 5 {
				// etcd showed the waiter holding before the waiter saw the
				// holder's key go: it saw its own key deleted first, queued
				// again behind nothing and held with no delay. The loss did
				// not come in a delay (a delay of an hour cannot end in
				// milliseconds): again, on a new name.
				t.Logf("try %d: the loss came before the waiter's delay began; again", try)
				continue
			}
			if !errors.Is(err, etcdlock.ErrLockLost) {
				t.Fatalf("the waiter, its hold lost in the delay: got %v, want ErrLockLost", err)
			}
			t.Logf("the acquisition ended %v after the loss, in a delay of an hour", time.Since(start).Round(time.Millisecond))
			lost.Wait()
			eventually(t, "the waiter's key gone", func() bool { return len(keysOfLease(t, client, name, ws.Lease())) == 0 })
			return
		}
	}
	t.Run("key deleted in the delay", func(t *testing.T) {
		lostInDelay(t, nil, func(ctx context.Context, ws *etcdlock.Session, name string) {
			if _, err := client.Delete(ctx, keyOf(name, ws.Lease())); err != nil {
				t.Fatal(err)
			}
		})
	})
	t.Run("cap reached in the delay", func(t *testing.T) {
		lostInDelay(t, []etcdlock.SessionOption{etcdlock.WithMaxHold(300 * time.Millisecond)}, func(context.Context, *etcdlock.Session, string) {})
	})

	t.Run("bad input", func(t *testing.T) {
		for _, bad := range []time.Duration{0, -time.Second} {
			if _, err := etcdlock.NewSession(client, etcdlock.WithLockDelay(bad)); !errors.Is(err, etcdlock.ErrInvalidArgument) {
				t.Errorf("WithLockDelay(%v): got %v, want ErrInvalidArgument", bad, err)
			}
		}
	})
}

// TestLockDelayRace: the holder's clean unlock races the revoke of its
// lease. Where the revoke deleted the key (the unlock found it gone), the
// waiter must wait the delay; where the unlock deleted it, it may or may not
// (the lease may be gone by the time the waiter asks), but never holds with
// the holder's key there.
func TestLockDelayRace(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	const d = 300 * time.Millisecond
	ctx := testContext(t)
	name := lockName(t)
	w := etcdlock.NewMutex(newSession(t, client, etcdlock.WithLockDelay(d)), name)
	var crashed, clean, cleanDelayed int
	for i := range 10 {
		holder := newSession(t, client)
		m := etcdlock.NewMutex(holder, name)
		if err := m.LockContext(ctx); err != nil {
			t.Fatal(err)
		}
		waiter := lockInGoroutine(t, ctx, ours{w})
		eventually(t, "the waiter queued", func() bool { return len(lockKeys(t, client, name)) == 2 })
		start := time.Now()
		var wg sync.WaitGroup
		wg.Go(func() { _, _ = client.Revoke(ctx, holder.Lease()) })
		uerr := m.UnlockContext(ctx)
		wg.Wait()
		if err := waitErr(t, waiter.locked); err != nil {
			t.Fatalf("round %d: the waiter: %v", i, err)
		}
		took := time.Since(start)
		switch {
		case uerr != nil:
			crashed++
			if took < d {
				t.Fatalf("round %d: the revoke deleted the key (unlock: %v), and the waiter returned after %v, before the delay %v", i, uerr, took, d)
			}
		case took >= d:
			cleanDelayed++
		default:
			clean++
		}
		if keys := lockKeys(t, client, name); len(keys) != 1 || keys[0] != w.Key() {
			t.Fatalf("round %d: keys %v, want only the waiter's", i, keys)
		}
		if err := waiter.Release(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("revoke first %d times; unlock first %d times, of which delayed %d", crashed, clean+cleanDelayed, cleanDelayed)
}
