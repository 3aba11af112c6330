package etcdlock_test

// The upstream defects D1 to D11 (docs/design.md, "What is different from
// the upstream packages"). Each defect's test runs
// the same scenario on etcdlock.Mutex and on concurrency.Mutex (client/v3
// v3.7.3), and checks both that ours behaves and that upstream shows the
// defect, so that each test is known to fail on the behaviour it guards
// against. TestD6StaleRelease drives our fenced delete directly. This file
// has the defects of writing and releasing (D1–D3, D5, D6); waiting and the
// loss signal are in defects_wait_test.go, etcd unreachable in
// defects_unreachable_test.go, nested names in defects_names_test.go.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// D1: two handles for the same name on one Session are one lock.
func TestD1SameNameOneSession(t *testing.T) {
	testflags.Parallel(t)
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
	testflags.Parallel(t)
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
	testflags.Parallel(t)
	srv, client := startServer(t)
	var fault txnFault
	ic := serverClient(t, srv, fault.intercept, nil)

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

// D5: a TryLock that finds another holder writes nothing.
func TestD5TryLockWrites(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)

	// scenario returns the TryLock's result and the writes it made, with
	// another session holding the lock. They are counted in the test's
	// keyspace (wroteSince): on a shared etcd, other tests move the
	// revision too.
	scenario := func(t *testing.T, name string, try locker) (writes []string, ok bool, err error) {
		holder := etcdlock.NewMutex(newSession(t, client), name)
		if err := holder.LockContext(ctx); err != nil {
			t.Fatal(err)
		}
		before := revision(t, client)
		ok, err = try.TryLock(ctx)
		return wroteSince(t, client, before), ok, err
	}

	t.Run("ours", func(t *testing.T) {
		name := lockName(t)
		m := etcdlock.NewMutex(newSession(t, client), name)
		writes, ok, err := scenario(t, name, ours{m})
		if ok || err != nil {
			t.Errorf("TryLockFor(0): got %v, %v, want false, nil", ok, err)
		}
		if len(writes) != 0 {
			t.Errorf("writes of TryLockFor(0): got %d (%v), want 0", len(writes), writes)
		}
		before := revision(t, client)
		if m.TryLock() {
			t.Error("TryLock: got true, want false")
		}
		if w := wroteSince(t, client, before); len(w) != 0 {
			t.Errorf("writes of TryLock: got %d (%v), want 0", len(w), w)
		}
	})

	t.Run("upstream", func(t *testing.T) {
		name := lockName(t)
		writes, ok, err := scenario(t, name, upstreamOn(newUpstreamSession(t, client, 30), name))
		if ok || err != nil {
			t.Errorf("upstream TryLock: got %v, %v, want false, nil (ErrLocked)", ok, err)
		}
		// The defect: a put and a delete of its key under the lock's name
		// (wroteSince names a write as: PUT "key" at revision).
		onLock := func(w, op string) bool { return strings.HasPrefix(w, op+` "`+name+"/") }
		if len(writes) != 2 || !onLock(writes[0], "PUT") || !onLock(writes[1], "DELETE") {
			t.Errorf("writes of upstream TryLock: got %d (%v), want 2 (the defect: a put and a delete of its key under %q)", len(writes), writes, name+"/")
		}
	})
}

// D6: an unlock is fenced on the create revision of the hold it ends.
func TestD6FencedUnlock(t *testing.T) {
	testflags.Parallel(t)
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
	testflags.Parallel(t)
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
