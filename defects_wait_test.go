package etcdlock_test

// Upstream defects of waiting and of the loss signal (docs/design.md §1): D4, a
// waiter's watch that starts unsynced; D8, a waiter whose own lease ends;
// D10, a loss signal that comes after the lease can expire. As in
// defects_test.go, each runs on etcdlock and on concurrency.Mutex.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

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
	}, prefix: serverPrefix(t, srv)}
	wc := serverClient(t, srv, nil, rec.intercept)

	// scenario: a holder on a plain client, two waiters on the recorded one,
	// unrelated writes while they wait; each in turn gets the lock. It
	// returns the watches created on the lock's keys, and the waiters' keys.
	scenario := func(t *testing.T, name string, holder, w1, w2 locker) ([]watchCreate, []string) {
		ctx := testContext(t)
		nWatches := func() int {
			n := 0
			for _, c := range rec.list() {
				if strings.Contains(c.key, name+"/") {
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
		own := []string{w1.Key()}
		writes()
		if err := first.Release(); err != nil {
			t.Fatal(err)
		}
		if err := waitErr(t, second.locked); err != nil {
			t.Fatalf("second waiter: %v", err)
		}
		own = append(own, w2.Key())
		if err := second.Release(); err != nil {
			t.Fatal(err)
		}
		var out []watchCreate
		for _, c := range rec.list() {
			if strings.Contains(c.key, name+"/") {
				out = append(out, c)
			}
		}
		return out, own
	}

	t.Run("ours", func(t *testing.T) {
		name := lockName(t)
		creates, own := scenario(t, name,
			oursOn(newSession(t, client), name),
			oursOn(newSession(t, wc), name),
			oursOn(newSession(t, wc), name))
		for _, c := range creates {
			if c.end == "" && slices.Contains(own, strings.TrimPrefix(c.key, rec.prefix)) {
				// A wait's watch of its own key, opened after 100 ms of
				// waiting (a slow wait, on a loaded machine), starts at
				// that key's revision + 1 by design: the history of one
				// key, so that a delete in between is not missed.
				continue
			}
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
		creates, _ := scenario(t, name,
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

// D8: a waiter whose own session ends returns ErrSessionExpired promptly,
// not when the holder leaves.
func TestD8WaiterSessionRevoked(t *testing.T) {
	testflags.Parallel(t)
	srv, client := startServer(t)
	admin := startClient(t, client)
	var fault txnFault
	rec := &watchRecorder{rev: func() int64 { return 0 }, prefix: serverPrefix(t, srv)}
	wc := serverClient(t, srv, fault.intercept, rec.intercept)

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
