package etcdlock_test

// The upstream defects of DESIGN.md §2, D1 to D11. Each defect's test runs
// the same scenario on etcdlock.Mutex and on concurrency.Mutex (client/v3
// v3.7.3), and checks both that ours behaves and that upstream shows the
// defect, so that each test is known to fail on the behaviour it guards
// against. TestD6StaleRelease drives our fenced delete directly.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
)

// D1: two handles for the same name on one Session are one lock.
func TestD1SameNameOneSession(t *testing.T) {
	_, client := startServer(t)

	// scenario locks a in this goroutine, then b in another one with a
	// deadline d, and returns b's result.
	scenario := func(t *testing.T, a, b locker, d time.Duration) error {
		ctx := testContext(t)
		if err := a.Lock(ctx); err != nil {
			t.Fatalf("first Lock: %v", err)
		}
		dctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		w := lockInGoroutine(t, dctx, b)
		return waitErr(t, w.locked)
	}

	t.Run("ours", func(t *testing.T) {
		s := newSession(t, client)
		name := lockName(t)
		a, b := oursOn(s, name), oursOn(s, name)
		if err := scenario(t, a, b, 300*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("second handle's LockContext while the first holds: got %v, want context.DeadlineExceeded", err)
		}
		// The second handle gets the lock once the first lets go.
		w := lockInGoroutine(t, testContext(t), b)
		if !blocked(w.locked, 100*time.Millisecond) {
			t.Fatal("second handle got the lock while the first holds")
		}
		if err := a.Unlock(testContext(t)); err != nil {
			t.Fatalf("UnlockContext: %v", err)
		}
		if err := waitErr(t, w.locked); err != nil {
			t.Fatalf("second handle's LockContext after the first let go: %v", err)
		}
		if err := w.Release(); err != nil {
			t.Fatalf("second handle's UnlockContext: %v", err)
		}
	})

	t.Run("upstream", func(t *testing.T) {
		s := newUpstreamSession(t, client, 30)
		name := lockName(t)
		a, b := upstreamOn(s, name), upstreamOn(s, name)
		// No short deadline: upstream's b holds at once, however loaded
		// the machine.
		if err := scenario(t, a, b, testTimeout); err != nil {
			t.Fatalf("upstream second Mutex's Lock: got %v, want nil (the defect: both hold)", err)
		}
		if keys := lockKeys(t, client, name); len(keys) != 1 {
			t.Errorf("upstream keys: got %q, want one key for both holders", keys)
		}
	})
}

// D2: reentrancy. The holder locks twice and unlocks once: it still holds.
func TestD2Reentrancy(t *testing.T) {
	_, client := startServer(t)

	// scenario locks holder twice and unlocks it once, then starts other,
	// and returns other's worker.
	scenario := func(t *testing.T, holder, other locker) *worker {
		ctx := testContext(t)
		for i := range 2 {
			if err := holder.Lock(ctx); err != nil {
				t.Fatalf("Lock %d by the holder: %v", i+1, err)
			}
		}
		if err := holder.Unlock(ctx); err != nil {
			t.Fatalf("first Unlock: %v", err)
		}
		return lockInGoroutine(t, ctx, other)
	}

	t.Run("ours", func(t *testing.T) {
		name := lockName(t)
		s := newSession(t, client)
		holder := oursOn(s, name)
		w := scenario(t, holder, oursOn(newSession(t, client), name))
		if !blocked(w.locked, 300*time.Millisecond) {
			t.Fatal("another session got the lock after two locks and one unlock, want it blocked")
		}
		if got := holder.m.HoldCount(); got != 1 {
			t.Errorf("HoldCount: got %d, want 1", got)
		}
		if keys := lockKeys(t, client, name); len(keys) != 2 || keys[0] != keyOf(name, s.Lease()) {
			t.Errorf("keys: got %q, want the holder's first, then the waiter's", keys)
		}
		local := make(chan bool)
		go func() { local <- holder.m.TryLock() }()
		if <-local {
			t.Error("TryLock by another goroutine of the holder's process: got true, want false")
		}
		if err := holder.Unlock(testContext(t)); err != nil {
			t.Fatalf("second Unlock: %v", err)
		}
		if err := waitErr(t, w.locked); err != nil {
			t.Fatalf("the other session's LockContext after the last unlock: %v", err)
		}
	})

	t.Run("upstream", func(t *testing.T) {
		name := lockName(t)
		holder := upstreamOn(newUpstreamSession(t, client, 30), name)
		w := scenario(t, holder, upstreamOn(newUpstreamSession(t, client, 30), name))
		if err := waitErr(t, w.locked); err != nil {
			t.Fatalf("upstream: another session's Lock: got %v, want nil (the defect: one Unlock of two Locks frees the lock)", err)
		}
	})
}

// D3: a context cancelled after etcd applied the acquire Txn but before the
// reply leaves upstream's key behind for the whole session. Ours, and every
// primitive of the family, at every point of an acquisition:
// TestFamilyCancelAfterApply.
func TestD3CancelAfterApply(t *testing.T) {
	srv, client := startServer(t)
	var fault txnFault
	ic := interceptedClient(t, srv.Endpoints(), fault.intercept, nil)

	for _, tc := range []struct {
		name      string
		try       bool // upstream TryLock; otherwise Lock
		contended bool
	}{
		{name: "upstream Lock"},
		{name: "upstream TryLock", try: true},
		{name: "upstream Lock queued", contended: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := lockName(t)
			ctx := testContext(t)
			var holder *etcdlock.Mutex
			if tc.contended {
				holder = etcdlock.NewMutex(newSession(t, client), name)
				if err := holder.LockContext(ctx); err != nil {
					t.Fatal(err)
				}
			}
			s := newUpstreamSession(t, ic, 30)
			m := concurrency.NewMutex(s, name)
			cctx, cancel := context.WithCancel(ctx)
			defer cancel()
			fault.arm(0, 1, cancelAfterApply(cancel, true))
			var err error
			if tc.try {
				err = m.TryLock(cctx)
			} else {
				err = m.Lock(cctx)
			}
			if n := fault.count(); n != 1 {
				t.Fatalf("cancels after an applied Txn: got %d, want 1", n)
			}
			if !errors.Is(err, context.Canceled) {
				t.Errorf("upstream error: got %v, want context.Canceled", err)
			}
			stale := keyOf(name, s.Lease())
			if keys := keysOfLease(t, client, name, s.Lease()); len(keys) != 1 || keys[0] != stale {
				t.Fatalf("upstream keys of the cancelled session: got %q, want %q left behind (the defect)", keys, stale)
			}
			if err := m.Unlock(ctx); !errors.Is(err, concurrency.ErrLockReleased) {
				t.Errorf("upstream Unlock after the cancel: got %v, want ErrLockReleased", err)
			}
			if keys := keysOfLease(t, client, name, s.Lease()); len(keys) != 1 {
				t.Errorf("upstream keys after its Unlock: got %q, want the stale key still there", keys)
			}
			if holder != nil {
				if err := holder.UnlockContext(ctx); err != nil {
					t.Fatal(err)
				}
			}
			// The stale key now holds the lock for the session's whole life.
			other := etcdlock.NewMutex(newSession(t, client), name)
			if other.TryLock() {
				t.Fatal("another session's TryLock with the stale key in etcd: got true, want false")
			}
			dctx, dcancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer dcancel()
			if err := other.LockContext(dctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("another session's LockContext with the stale key in etcd: got %v, want context.DeadlineExceeded", err)
			}
		})
	}
}

// D4: a contended waiter's watch starts synced: from now, or ahead of the
// store, never from a revision etcd already has.
func TestD4SyncedWatch(t *testing.T) {
	srv, client := startServer(t)
	rec := &watchRecorder{rev: func() int64 {
		// Called on clientv3's goroutine: no t.Fatal here.
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		rev, err := currentRevision(ctx, client)
		if err != nil {
			return -1
		}
		return rev
	}}
	wc := interceptedClient(t, srv.Endpoints(), nil, rec.intercept)

	// scenario: a holder on a plain client, two waiters on the recorded one,
	// unrelated writes while they wait; each in turn gets the lock. It
	// returns the watches created on the lock's keys.
	scenario := func(t *testing.T, name string, holder, w1, w2 locker) []watchCreate {
		ctx := testContext(t)
		nWatches := func() int {
			n := 0
			for _, c := range rec.list() {
				if strings.HasPrefix(c.key, name+"/") {
					n++
				}
			}
			return n
		}
		writes := func() {
			for i := range 5 {
				if _, err := client.Put(ctx, name+"-unrelated", fmt.Sprint(i)); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := holder.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		first := lockInGoroutine(t, ctx, w1)
		eventually(t, "the first waiter's watch", func() bool { return nWatches() >= 1 })
		second := lockInGoroutine(t, ctx, w2)
		eventually(t, "the second waiter's watch", func() bool { return nWatches() >= 2 })
		writes()
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := waitErr(t, first.locked); err != nil {
			t.Fatalf("first waiter: %v", err)
		}
		writes()
		if err := first.Release(); err != nil {
			t.Fatal(err)
		}
		if err := waitErr(t, second.locked); err != nil {
			t.Fatalf("second waiter: %v", err)
		}
		if err := second.Release(); err != nil {
			t.Fatal(err)
		}
		var out []watchCreate
		for _, c := range rec.list() {
			if strings.HasPrefix(c.key, name+"/") {
				out = append(out, c)
			}
		}
		return out
	}

	t.Run("ours", func(t *testing.T) {
		name := lockName(t)
		creates := scenario(t, name,
			oursOn(newSession(t, client), name),
			oursOn(newSession(t, wc), name),
			oursOn(newSession(t, wc), name))
		for _, c := range creates {
			// etcd files a watch as synced when it starts at 0 or past the
			// store's revision; created is at least that revision.
			if c.start != 0 && (c.created == 0 || c.start <= c.created) {
				t.Errorf("watch on %q: got start revision %d with the store at %d or later, want 0 or ahead (synced)", c.key, c.start, c.created)
			}
		}
		t.Logf("our waiters created %d watches: %+v", len(creates), creates)
	})

	t.Run("upstream", func(t *testing.T) {
		name := lockName(t)
		creates := scenario(t, name,
			upstreamOn(newUpstreamSession(t, client, 30), name),
			upstreamOn(newUpstreamSession(t, wc, 30), name),
			upstreamOn(newUpstreamSession(t, wc, 30), name))
		unsynced := 0
		for _, c := range creates {
			if c.start != 0 && c.before > 0 && c.start <= c.before {
				unsynced++
			}
		}
		if unsynced == 0 {
			t.Errorf("upstream waiters' watches: got none starting at or behind the store's revision, want some (the defect: unsynced watches); %+v", creates)
		}
		t.Logf("upstream waiters created %d watches, %d unsynced: %+v", len(creates), unsynced, creates)
	})
}

// D5: a TryLock that finds another holder writes nothing.
func TestD5TryLockWrites(t *testing.T) {
	_, client := startServer(t)
	ctx := testContext(t)

	// scenario returns the TryLock's result and how far it moved etcd's
	// revision, with another session holding the lock.
	scenario := func(t *testing.T, name string, try locker) (writes int64, ok bool, err error) {
		holder := etcdlock.NewMutex(newSession(t, client), name)
		if err := holder.LockContext(ctx); err != nil {
			t.Fatal(err)
		}
		before := revision(t, client)
		ok, err = try.TryLock(ctx)
		return revision(t, client) - before, ok, err
	}

	t.Run("ours", func(t *testing.T) {
		name := lockName(t)
		m := etcdlock.NewMutex(newSession(t, client), name)
		writes, ok, err := scenario(t, name, ours{m})
		if ok || err != nil {
			t.Errorf("TryLockFor(0): got %v, %v, want false, nil", ok, err)
		}
		if writes != 0 {
			t.Errorf("revisions moved by TryLockFor(0): got %d, want 0", writes)
		}
		before := revision(t, client)
		if m.TryLock() {
			t.Error("TryLock: got true, want false")
		}
		if got := revision(t, client) - before; got != 0 {
			t.Errorf("revisions moved by TryLock: got %d, want 0", got)
		}
	})

	t.Run("upstream", func(t *testing.T) {
		name := lockName(t)
		writes, ok, err := scenario(t, name, upstreamOn(newUpstreamSession(t, client, 30), name))
		if ok || err != nil {
			t.Errorf("upstream TryLock: got %v, %v, want false, nil (ErrLocked)", ok, err)
		}
		if writes != 2 {
			t.Errorf("revisions moved by upstream TryLock: got %d, want 2 (the defect: a put and a delete)", writes)
		}
	})
}

// D6: an unlock is fenced on the create revision of the hold it ends.
func TestD6FencedUnlock(t *testing.T) {
	_, client := startServer(t)

	// scenario: a locks; its key is deleted by someone else; b, another
	// handle on the same session, locks from another goroutine (and holds
	// before a unlocks, if bHolds); a unlocks. It returns a's token, b's
	// worker and a's Unlock error.
	scenario := func(t *testing.T, name string, a, b locker, bHolds bool) (int64, *worker, error) {
		ctx := testContext(t)
		if err := a.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		resp, err := client.Get(ctx, a.Key())
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("get the holder's key: %v, %v", resp, err)
		}
		token := resp.Kvs[0].CreateRevision
		if _, err := client.Delete(ctx, a.Key()); err != nil {
			t.Fatal(err)
		}
		w := lockInGoroutine(t, ctx, b)
		if bHolds {
			err := waitErr(t, w.locked)
			w.locked <- err
		} else if !blocked(w.locked, 300*time.Millisecond) {
			t.Fatal("the other handle got the lock while the first holds, want it waiting")
		}
		return token, w, a.Unlock(ctx)
	}

	t.Run("ours", func(t *testing.T) {
		name := lockName(t)
		s := newSession(t, client)
		a, b := oursOn(s, name), oursOn(s, name)
		token, w, err := scenario(t, name, a, b, false)
		if !errors.Is(err, etcdlock.ErrLockLost) {
			t.Errorf("UnlockContext after the key was deleted: got %v, want ErrLockLost", err)
		}
		if err := waitErr(t, w.locked); err != nil {
			t.Fatalf("the other handle's LockContext: %v", err)
		}
		newToken := b.m.Token()
		if newToken <= token {
			t.Errorf("token of the new hold: got %d, want > %d", newToken, token)
		}
		ctx := testContext(t)
		resp, err := client.Get(ctx, keyOf(name, s.Lease()))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != newToken {
			t.Fatalf("the new hold's key: got %v, want it intact with create revision %d", resp.Kvs, newToken)
		}
		if err := w.Release(); err != nil {
			t.Errorf("UnlockContext of the new hold: %v", err)
		}
	})

	t.Run("upstream", func(t *testing.T) {
		name := lockName(t)
		s := newUpstreamSession(t, client, 30)
		a, b := upstreamOn(s, name), upstreamOn(s, name)
		// Upstream's b holds at once: a's key is gone.
		_, w, err := scenario(t, name, a, b, true)
		if err != nil {
			t.Errorf("upstream Unlock of the deleted hold: got %v, want nil", err)
		}
		if err := waitErr(t, w.locked); err != nil {
			t.Fatalf("upstream second Mutex's Lock: %v", err)
		}
		if keys := lockKeys(t, client, name); len(keys) != 0 {
			t.Errorf("upstream keys after the stale Unlock: got %q, want none (the defect: it deleted the newer hold)", keys)
		}
		if b.Key() != keyOf(name, s.Lease()) {
			t.Errorf("upstream second Mutex's Key: got %q, want it still believing it holds %q", b.Key(), keyOf(name, s.Lease()))
		}
	})
}

// D6, the release itself: a delete fenced on an older create revision,
// direct or retried in the background, never deletes a newer key of the
// same name; fenced on the right one, it does.
func TestD6StaleRelease(t *testing.T) {
	_, client := startServer(t)
	ctx := testContext(t)
	s := newSession(t, client)
	name := lockName(t)
	key := keyOf(name, s.Lease())
	m := etcdlock.NewMutex(s, name)
	if err := m.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	old := m.Token()
	// Someone deletes our key, and a newer hold of the same name (same
	// lease) is written.
	if _, err := client.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	put, err := client.Put(ctx, key, "", clientv3.WithLease(s.Lease()))
	if err != nil {
		t.Fatal(err)
	}
	newer := put.Header.Revision
	// keyRev returns the create revision of our key, 0 if it is gone.
	keyRev := func() int64 {
		resp, err := client.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			return 0
		}
		return resp.Kvs[0].CreateRevision
	}

	deleted, err := etcdlock.ReleaseFenced(ctx, m, old)
	if err != nil || deleted {
		t.Errorf("release fenced on %d of the key created at %d: got %v, %v, want false, nil", old, newer, deleted, err)
	}
	if got := keyRev(); got != newer {
		t.Fatalf("key after the stale release: got create revision %d, want %d (intact)", got, newer)
	}

	// The background retry, as UnlockContext starts it when etcd does not
	// confirm the delete.
	retried := make(chan struct{})
	etcdlock.ReleaseLater(m, old, func() { close(retried) })
	select {
	case <-retried:
	case <-ctx.Done():
		t.Fatal("the background retry did not end")
	}
	if got := keyRev(); got != newer {
		t.Fatalf("key after the stale background retry: got create revision %d, want %d (intact)", got, newer)
	}

	// Fenced on the right revision, the release deletes it.
	deleted, err = etcdlock.ReleaseFenced(ctx, m, newer)
	if err != nil || !deleted {
		t.Errorf("release fenced on %d of the key created at %d: got %v, %v, want true, nil", newer, newer, deleted, err)
	}
	if got := keyRev(); got != 0 {
		t.Errorf("key after the release: got create revision %d, want deleted", got)
	}
}

// D7: cleanup is bounded while etcd is unreachable, and finishes once it is
// back.
func TestD7BoundedCleanup(t *testing.T) {
	// proxied returns a client through a proxy of its own, with a watch
	// recorder, so that a test can see when a waiter is waiting.
	proxied := func(t *testing.T, srv *etcdtest.Server) (*clientv3.Client, *etcdtest.Proxy, *watchRecorder) {
		_, proxy := srv.ProxiedClient(t)
		t.Cleanup(proxy.Unblackhole)
		rec := &watchRecorder{rev: func() int64 { return 0 }}
		return interceptedClient(t, proxy.Endpoints(), nil, rec.intercept), proxy, rec
	}

	t.Run("ours", func(t *testing.T) {
		srv, client := startServer(t)
		pc, proxy, rec := proxied(t, srv)
		// A long TTL: the lease outlives the outage, so keys that go were
		// deleted by the background retry, not by the lease's expiry.
		s := newSession(t, pc, etcdlock.WithTTL(30*time.Second))
		name := lockName(t)
		held := etcdlock.NewMutex(s, name)
		waiting := etcdlock.NewMutex(s, name+"-waiting")
		ctx := testContext(t)
		if err := held.LockContext(ctx); err != nil {
			t.Fatal(err)
		}
		// A holder elsewhere, so that the waiting lock's key goes in etcd's
		// queue before the outage.
		other := etcdlock.NewMutex(newSession(t, client), name+"-waiting")
		if err := other.LockContext(ctx); err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithCancel(ctx)
		defer wcancel()
		queued := result(func() error { return waiting.LockContext(wctx) })
		eventually(t, "the waiter's watch", func() bool { return rec.watching(other.Key()) })

		proxy.Blackhole()
		start := time.Now()
		err := held.UnlockContext(ctx)
		checkBound(t, "UnlockContext while etcd is unreachable", time.Since(start), unlockBound)
		if err == nil {
			t.Error("UnlockContext while etcd is unreachable: got nil, want an error")
		}
		if held.HoldCount() != 0 {
			t.Errorf("HoldCount after UnlockContext: got %d, want 0", held.HoldCount())
		}

		start = time.Now()
		wcancel()
		err = waitErr(t, queued)
		checkBound(t, "cancelled wait while etcd is unreachable", time.Since(start), deadlineSlack)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled wait while etcd is unreachable: got %v, want context.Canceled", err)
		}

		fresh := etcdlock.NewMutex(s, name+"-fresh")
		const d = 500 * time.Millisecond
		dctx, dcancel := context.WithTimeout(ctx, d)
		defer dcancel()
		start = time.Now()
		err = fresh.LockContext(dctx)
		checkBound(t, fmt.Sprintf("LockContext with a %v deadline while etcd is unreachable", d), time.Since(start), d+deadlineSlack)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("LockContext while etcd is unreachable: got %v, want context.DeadlineExceeded", err)
		}

		proxy.Unblackhole()
		for _, n := range []string{name, name + "-waiting", name + "-fresh"} {
			eventually(t, "the background retry to delete our key of "+n, func() bool {
				return len(keysOfLease(t, client, n, s.Lease())) == 0
			})
		}
		if ttl, err := client.TimeToLive(ctx, s.Lease()); err != nil || ttl.TTL <= 0 {
			t.Errorf("our lease after the outage: TTL %v, %v, want alive (the keys were deleted by the retry)", ttl, err)
		}

		proxy.Blackhole()
		start = time.Now()
		err = s.Close()
		checkBound(t, "Session.Close while etcd is unreachable", time.Since(start), closeBound)
		t.Logf("Session.Close while etcd is unreachable: %v", err)
	})

	t.Run("upstream wait", func(t *testing.T) {
		srv, client := startServer(t)
		pc, proxy, rec := proxied(t, srv)
		name := lockName(t)
		ctx := testContext(t)
		holder := etcdlock.NewMutex(newSession(t, client), name)
		if err := holder.LockContext(ctx); err != nil {
			t.Fatal(err)
		}
		s := newUpstreamSession(t, pc, 5)
		m := concurrency.NewMutex(s, name)
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		ch := result(func() error { return m.Lock(wctx) })
		eventually(t, "the upstream waiter's watch", func() bool { return rec.watching(holder.Key()) })

		proxy.Blackhole()
		cancel()
		if !blocked(ch, 2*time.Second) {
			t.Fatal("upstream Lock returned within 2s of its cancel while etcd is unreachable, want it stuck in its cleanup (the defect: it uses client.Ctx())")
		}
		proxy.Unblackhole()
		select {
		case err := <-ch:
			t.Logf("upstream Lock returned once etcd was back: %v", err)
		case <-time.After(3 * time.Second):
			// Its delete was lost in the outage and has no deadline: only
			// closing the client ends it.
			t.Log("upstream Lock still stuck 3s after etcd came back; closing its client")
			_ = pc.Close()
			t.Logf("upstream Lock returned: %v", waitErr(t, ch))
		}
		if err := holder.UnlockContext(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("upstream close", func(t *testing.T) {
		srv, _ := startServer(t)
		pc, proxy := srv.ProxiedClient(t)
		t.Cleanup(proxy.Unblackhole)
		s, err := concurrency.NewSession(pc, concurrency.WithTTL(3))
		if err != nil {
			t.Fatal(err)
		}
		proxy.Blackhole()
		start := time.Now()
		ch := result(s.Close)
		if !blocked(ch, 2*time.Second) {
			t.Fatal("upstream Session.Close returned within 2s while etcd is unreachable, want it to block for its 3s TTL")
		}
		err = waitErr(t, ch)
		t.Logf("upstream Session.Close while etcd is unreachable: %v after %v", err, time.Since(start))
	})
}

// D8: a waiter whose own session ends returns ErrSessionExpired promptly,
// not when the holder leaves.
func TestD8WaiterSessionRevoked(t *testing.T) {
	srv, client := startServer(t)
	admin := startClient(t, client)
	var fault txnFault
	rec := &watchRecorder{rev: func() int64 { return 0 }}
	wc := interceptedClient(t, srv.Endpoints(), fault.intercept, rec.intercept)

	revoke := func(ctx context.Context, lease clientv3.LeaseID) error {
		_, err := admin.Revoke(ctx, lease)
		return err
	}
	// holder takes the lock with a session of its own.
	holder := func(t *testing.T, name string) *etcdlock.Mutex {
		m := etcdlock.NewMutex(newSession(t, client), name)
		if err := m.LockContext(testContext(t)); err != nil {
			t.Fatal(err)
		}
		return m
	}
	// expectExpired checks that the waiter returns ErrSessionExpired within
	// expiredBound, and that the holder still holds.
	expectExpired := func(t *testing.T, name string, w *worker, h *etcdlock.Mutex) {
		start := time.Now()
		select {
		case err := <-w.locked:
			if !errors.Is(err, etcdlock.ErrSessionExpired) {
				t.Errorf("waiter's lock after its lease was revoked: got %v, want ErrSessionExpired", err)
			}
			t.Logf("waiter returned %v, %v after the revoke", err, time.Since(start).Round(time.Millisecond))
		case <-time.After(expiredBound):
			t.Fatalf("waiter's lock still blocked %v after its lease was revoked, want ErrSessionExpired within 1s", expiredBound)
		}
		if got := h.HoldCount(); got != 1 {
			t.Errorf("holder's HoldCount: got %d, want 1", got)
		}
		if keys := lockKeys(t, client, name); len(keys) != 1 || keys[0] != h.Key() {
			t.Errorf("keys: got %q, want only the holder's %q", keys, h.Key())
		}
		if err := h.UnlockContext(testContext(t)); err != nil {
			t.Fatal(err)
		}
	}

	// With the default TTL (60 s), the keep-alive learns of a revoke only
	// up to 20 s later: the waiter must see its own key go instead.
	for _, how := range []struct {
		name string
		lock func(s *etcdlock.Session, name string) locker
	}{
		{"LockContext", func(s *etcdlock.Session, name string) locker { return oursOn(s, name) }},
		{"TryLockFor", func(s *etcdlock.Session, name string) locker { return oursFor{oursOn(s, name), time.Hour} }},
	} {
		t.Run(how.name+" revoked while waiting", func(t *testing.T) {
			name := lockName(t)
			h := holder(t, name)
			s := newSession(t, wc)
			w := lockInGoroutine(t, testContext(t), how.lock(s, name))
			eventually(t, "the waiter's watch on the holder's key", func() bool { return rec.watching(h.Key()) })
			if err := revoke(testContext(t), s.Lease()); err != nil {
				t.Fatal(err)
			}
			expectExpired(t, name, w, h)
		})

		// The revoke lands between the waiter's put and its first look at
		// its predecessor.
		t.Run(how.name+" revoked as the wait starts", func(t *testing.T) {
			name := lockName(t)
			h := holder(t, name)
			s := newSession(t, wc)
			eventually(t, "a keep-alive of the waiter's lease", func() bool { return rec.keptAlive(s.Lease()) })
			fault.arm(0, 1, func(ctx context.Context, invoke func() error) error {
				if err := invoke(); err != nil {
					return err
				}
				return revoke(ctx, s.Lease())
			})
			w := lockInGoroutine(t, testContext(t), how.lock(s, name))
			expectExpired(t, name, w, h)
			if n := fault.count(); n != 1 {
				t.Errorf("revokes after the put: got %d, want 1", n)
			}
		})
	}

	// Our key deleted by hand while the lease lives: queue again, behind
	// the holder.
	t.Run("ours deleted while waiting", func(t *testing.T) {
		name := lockName(t)
		h := holder(t, name)
		s := newSession(t, wc)
		m := etcdlock.NewMutex(s, name)
		w := lockInGoroutine(t, testContext(t), ours{m})
		eventually(t, "the waiter's watch on the holder's key", func() bool { return rec.watching(h.Key()) })
		key := keyOf(name, s.Lease())
		before := lockKeys(t, client, name)
		if _, err := admin.Delete(testContext(t), key); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the waiter's key back in the queue", func() bool {
			keys := lockKeys(t, client, name)
			return len(keys) == 2 && keys[1] == key
		})
		if !blocked(w.locked, 200*time.Millisecond) {
			t.Fatalf("waiter returned while the holder holds, after its key was deleted (keys before: %q)", before)
		}
		if err := h.UnlockContext(testContext(t)); err != nil {
			t.Fatal(err)
		}
		if err := waitErr(t, w.locked); err != nil {
			t.Fatalf("waiter after the holder left: got %v, want the lock", err)
		}
	})

	t.Run("upstream", func(t *testing.T) {
		name := lockName(t)
		h := holder(t, name)
		s := newUpstreamSession(t, wc, 3)
		w := lockInGoroutine(t, testContext(t), upstreamOn(s, name))
		eventually(t, "the waiter's watch on the holder's key", func() bool { return rec.watching(h.Key()) })
		if err := revoke(testContext(t), s.Lease()); err != nil {
			t.Fatal(err)
		}
		if !blocked(w.locked, 3*time.Second) {
			t.Fatal("upstream waiter returned within 3s of its lease's revoke, want it still waiting for the holder (the defect)")
		}
		if err := h.UnlockContext(testContext(t)); err != nil {
			t.Fatal(err)
		}
		t.Logf("upstream waiter returned after the holder left: %v", waitErr(t, w.locked))
	})
}

// D9: Lock (sync.Locker) retries a transient failure instead of panicking.
func TestD9LockerTransientFailure(t *testing.T) {
	srv, client := startServer(t)
	var fault txnFault
	ic := interceptedClient(t, srv.Endpoints(), fault.intercept, nil)
	transient := rpctypes.ErrGRPCTimeout // codes.Unavailable

	t.Run("ours", func(t *testing.T) {
		name := lockName(t)
		m := etcdlock.NewMutex(newSession(t, ic), name)
		fault.arm(0, 2, failWith(transient))
		type outcome struct {
			panicked any
			holds    int
		}
		done := make(chan outcome, 1)
		go func() {
			var o outcome
			o.panicked = catchPanic(m.Lock)
			if o.panicked == nil {
				o.holds = m.HoldCount()
				m.Unlock()
			}
			done <- o
		}()
		var o outcome
		select {
		case o = <-done:
		case <-time.After(testTimeout):
			t.Fatal("Lock still blocked after two transient failures")
		}
		if o.panicked != nil {
			t.Fatalf("Lock after two transient failures: panicked with %v, want it to retry and hold", o.panicked)
		}
		if o.holds != 1 {
			t.Errorf("HoldCount after Lock: got %d, want 1", o.holds)
		}
		if n := fault.count(); n != 2 {
			t.Errorf("failed Txns: got %d, want 2", n)
		}
		if keys := lockKeys(t, client, name); len(keys) != 0 {
			t.Errorf("keys after Unlock: got %q, want none", keys)
		}
	})

	t.Run("upstream", func(t *testing.T) {
		name := lockName(t)
		l := concurrency.NewLocker(newUpstreamSession(t, ic, 30), name)
		fault.arm(0, 2, failWith(transient))
		r := catchPanic(l.Lock)
		if r == nil {
			t.Fatal("upstream NewLocker's Lock after a transient failure: did not panic, want a panic (the defect)")
		}
		if err, ok := r.(error); !ok || !errors.Is(err, rpctypes.ErrTimeout) {
			t.Errorf("upstream panic: got %v, want the transient error %v", r, rpctypes.ErrTimeout)
		}
	})
}

// serverLease is what polling etcd tells of a lease's expiry. An answer of
// k whole seconds, asked at start and received at end, means the expiry is
// in [start + k s, end + (k+1) s); not found means etcd has revoked it.
type serverLease struct {
	id            clientv3.LeaseID
	expiresAfter  time.Time // the server cannot expire the lease before this
	expiresBefore time.Time // the lease's expiry had passed by this (zero: not yet seen)
	goneAt        time.Time // first answer "not found" (zero: not yet)
}

// poll asks etcd once, unless the lease is already known to be gone, and
// reports whether it is.
func (l *serverLease) poll(t *testing.T, client *clientv3.Client) bool {
	t.Helper()
	if !l.goneAt.IsZero() {
		return true
	}
	start := time.Now()
	ttl, alive := leaseTTL(t, client, l.id)
	end := time.Now()
	if !alive {
		l.goneAt = end
		return true
	}
	if after := start.Add(time.Duration(ttl) * time.Second); after.After(l.expiresAfter) {
		l.expiresAfter = after
	}
	if before := end.Add(time.Duration(ttl+1) * time.Second); l.expiresBefore.IsZero() || before.Before(l.expiresBefore) {
		l.expiresBefore = before
	}
	return false
}

// D10: the loss signal comes before the lease can expire.
// TestDoneBeforeLeaseExpiry cuts a client off from etcd (its proxy drops all
// traffic) while it holds a lock, and checks the order of events: Mutex.Done
// closes while the server still has the lease, before a waiter elsewhere
// gets the lock. In the same blackhole, an upstream concurrency.Session on
// the same client shows D10: its Done closes only once the lease's TTL has
// run out on the server since its last renewal, so the lease may already be
// gone.
func TestDoneBeforeLeaseExpiry(t *testing.T) {
	const ttl = 2 * time.Second
	healthy, pc, proxy := startProxied(t)
	defer proxy.Unblackhole()
	ctx := testContext(t)
	name := lockName(t)

	s := aliveSession(t, pc, ttl)
	ourAck, _ := ackWatch(t, pc, s.Lease())
	m := etcdlock.NewMutex(s, name)
	m.Lock()
	d := m.Done()
	up := newUpstreamSession(t, pc, int(ttl/time.Second))
	upAck, _ := ackWatch(t, pc, up.Lease())

	waiter := etcdlock.NewMutex(newSession(t, healthy, etcdlock.WithTTL(30*time.Second)), name)
	var acquiredAt atomic.Int64
	waited := result(func() error {
		if err := waiter.LockContext(ctx); err != nil {
			return err
		}
		acquiredAt.Store(time.Now().UnixNano())
		return waiter.UnlockContext(ctx)
	})
	eventually(t, "the waiter's key", func() bool { return len(lockKeys(t, healthy, name)) == 2 })

	// Start right after an acknowledgement, so that the cut is not
	// mistaken for a late reply.
	before := ourAck.last()
	eventually(t, "keep-alive acknowledgements", func() bool { return ourAck.last().After(before) && !upAck.last().IsZero() })
	proxy.Blackhole()
	cut := time.Now()
	doneAt, upDoneAt := closeTime(d), closeTime(up.Done())

	ours, theirs := &serverLease{id: s.Lease()}, &serverLease{id: up.Lease()}
	eventually(t, "both leases gone from the server", func() bool {
		oursGone, theirsGone := ours.poll(t, healthy), theirs.poll(t, healthy)
		return oursGone && theirsGone
	})
	if err := waitErr(t, waited); err != nil {
		t.Fatalf("waiter: got %v, want nil", err)
	}
	eventually(t, "upstream Session.Done", func() bool { return !upDoneAt().IsZero() })

	since := func(at time.Time) time.Duration { return at.Sub(cut).Round(time.Millisecond) }
	acquired := time.Unix(0, acquiredAt.Load())
	t.Logf("events after the cut (TTL %v), in ms:", ttl)
	t.Logf("  %-40s %9s %9s", "", "etcdlock", "upstream")
	row := func(what string, a, b time.Time) {
		t.Logf("  %-40s %9d %9d", what, since(a).Milliseconds(), since(b).Milliseconds())
	}
	row("last keep-alive ack", ourAck.last(), upAck.last())
	row("server may expire the lease from", ours.expiresAfter, theirs.expiresAfter)
	row("server lease expired by", ours.expiresBefore, theirs.expiresBefore)
	row("server revoked the lease", ours.goneAt, theirs.goneAt)
	row("Mutex.Done / Session.Done closed", doneAt(), upDoneAt())
	t.Logf("  %-40s %9d", "waiter elsewhere acquired the lock", since(acquired).Milliseconds())

	switch {
	case doneAt().IsZero():
		t.Errorf("Mutex.Done: got open after the lease expired, want closed before")
	case !doneAt().Before(ours.expiresAfter):
		t.Errorf("Mutex.Done closed %v after the server could expire the lease, want before", doneAt().Sub(ours.expiresAfter))
	case !doneAt().Before(acquired):
		t.Errorf("Mutex.Done closed %v after the waiter acquired, want before", doneAt().Sub(acquired))
	default:
		t.Logf("Mutex.Done closed %v before the server could expire the lease", ours.expiresAfter.Sub(doneAt()).Round(time.Millisecond))
	}
	// D10. The server renewed the upstream lease before it acknowledged
	// the renewal, so from ack + TTL on, etcd may expire the lease.
	t.Logf("upstream Session.Done closed %v after its last ack (TTL %v)", upDoneAt().Sub(upAck.last()).Round(time.Millisecond), ttl)
	if upDoneAt().Before(theirs.expiresAfter) {
		t.Errorf("upstream Session.Done closed %v before the server could expire the lease; want at or after (D10)",
			theirs.expiresAfter.Sub(upDoneAt()))
	}
	if upDoneAt().After(theirs.expiresBefore) {
		t.Logf("upstream Session.Done closed %v after the lease had expired on the server (D10)", upDoneAt().Sub(theirs.expiresBefore).Round(time.Millisecond))
	}

	proxy.Unblackhole()
	if err := m.UnlockContext(ctx); err == nil {
		t.Error("UnlockContext of the expired hold: got nil, want ErrSessionExpired or ErrLockLost")
	}
}

// TestD11SameTxnNestedKey: one Txn creates a key of the lock and a key of a
// lock nested under it, both at one revision. Skipping the nested key must
// not skip the lock's key: TryLock, TryLockFor and a waiter all see the
// holder, and the waiter gets the lock once the holder's key goes.
func TestD11SameTxnNestedKey(t *testing.T) {
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	lease, err := client.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	holder := fmt.Sprintf("%s/%x", name, int64(lease.ID))
	// "-" sorts before every hex digit: in a tie on create revision, etcd
	// lists the nested key first.
	nested := fmt.Sprintf("%s/-/%x", name, int64(lease.ID))
	if _, err := client.Txn(ctx).Then(
		clientv3.OpPut(nested, "", clientv3.WithLease(lease.ID)),
		clientv3.OpPut(holder, "", clientv3.WithLease(lease.ID)),
	).Commit(); err != nil {
		t.Fatal(err)
	}

	s := newSession(t, client)
	m := etcdlock.NewMutex(s, name)
	if m.TryLock() {
		m.Unlock()
		t.Fatalf("TryLock while %q holds the lock: got true, want false", holder)
	}
	if ok, err := m.TryLockFor(ctx, 300*time.Millisecond); ok || err != nil {
		if ok {
			m.Unlock()
		}
		t.Fatalf("TryLockFor while %q holds the lock: got %v, %v, want false, nil", holder, ok, err)
	}
	w := lockInGoroutine(t, ctx, oursOn(s, name))
	if !blocked(w.locked, 300*time.Millisecond) {
		t.Fatalf("LockContext returned while %q holds the lock, want it to wait", holder)
	}
	if _, err := client.Delete(ctx, holder); err != nil {
		t.Fatal(err)
	}
	if err := waitErr(t, w.locked); err != nil {
		t.Fatalf("LockContext after the holder's key was deleted: %v", err)
	}
	if err := w.Release(); err != nil {
		t.Errorf("UnlockContext: %v", err)
	}
}

// D11: a lock's name is not a plain prefix: holding "a/b" does not block "a".
func TestD11NestedNames(t *testing.T) {
	_, client := startServer(t)
	for _, tc := range []struct {
		name string
		hold func(t *testing.T, name string) locker
	}{
		{"ours holds nested", func(t *testing.T, name string) locker { return oursOn(newSession(t, client), name) }},
		{"upstream holds nested", func(t *testing.T, name string) locker {
			return upstreamOn(newUpstreamSession(t, client, 30), name)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testContext(t)
			name := lockName(t)
			nested := tc.hold(t, name+"/b")
			if err := nested.Lock(ctx); err != nil {
				t.Fatal(err)
			}

			m := etcdlock.NewMutex(newSession(t, client), name)
			if !m.TryLock() {
				t.Fatalf("our TryLock of %q while %q is held: got false, want true", name, name+"/b")
			}
			m.Unlock()
			if err := m.LockContext(ctx); err != nil {
				t.Fatalf("our LockContext of %q while %q is held: %v", name, name+"/b", err)
			}
			m.Unlock()

			up := upstreamOn(newUpstreamSession(t, client, 30), name)
			ok, err := up.TryLock(ctx)
			if ok || err != nil {
				t.Errorf("upstream TryLock of %q while %q is held: got %v, %v, want false, nil (the defect)", name, name+"/b", ok, err)
			}
			if ok {
				_ = up.Unlock(ctx)
			}
			if err := nested.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// D11, the other side: what fixes nesting must not break exclusion between
// ours, upstream's (which is what `etcdctl lock` runs) and etcd's v3lock
// gRPC service on the same name.
func TestD11SameNameExcludes(t *testing.T) {
	_, local := startServer(t)
	child := v3lockServer(t)

	// excludes checks that b cannot take the lock while a holds it, and
	// that a waiting b gets it once a lets go.
	excludes := func(t *testing.T, a, b locker) {
		ctx := testContext(t)
		if err := a.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		if ok, err := b.TryLock(ctx); ok || err != nil {
			t.Errorf("TryLock while the other holds: got %v, %v, want false, nil", ok, err)
		}
		dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		if err := b.Lock(dctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Lock while the other holds: got %v, want context.DeadlineExceeded", err)
		}
		w := lockInGoroutine(t, ctx, b)
		if !blocked(w.locked, 100*time.Millisecond) {
			t.Fatal("Lock while the other holds: got the lock, want it waiting")
		}
		if err := a.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := waitErr(t, w.locked); err != nil {
			t.Fatalf("Lock after the other let go: %v", err)
		}
		if err := w.Release(); err != nil {
			t.Fatal(err)
		}
	}
	type factory func(t *testing.T, client *clientv3.Client) locker
	var (
		oursNamed factory = func(t *testing.T, client *clientv3.Client) locker {
			return oursOn(newSession(t, client), lockName(t))
		}
		upstreamNamed factory = func(t *testing.T, client *clientv3.Client) locker {
			return upstreamOn(newUpstreamSession(t, client, 30), lockName(t))
		}
		v3lockNamed factory = func(t *testing.T, client *clientv3.Client) locker {
			return newV3Lock(t, client, lockName(t))
		}
	)

	for _, tc := range []struct {
		name   string
		client *clientv3.Client
		a, b   factory
	}{
		{"ours then upstream", local, oursNamed, upstreamNamed},
		{"upstream then ours", local, upstreamNamed, oursNamed},
		{"ours then v3lock", child, oursNamed, v3lockNamed},
		{"v3lock then ours", child, v3lockNamed, oursNamed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			excludes(t, tc.a(t, tc.client), tc.b(t, tc.client))
			if keys := lockKeys(t, tc.client, lockName(t)); len(keys) != 0 {
				t.Errorf("keys at the end: got %q, want none", keys)
			}
		})
	}
}
