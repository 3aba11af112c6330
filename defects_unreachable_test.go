package etcdlock_test

// Upstream defects with etcd unreachable (docs/design.md §1): D7, cleanup that
// blocks or is left undone; D9, a sync.Locker that panics on a transient
// failure. As in defects_test.go, each runs on etcdlock and on
// concurrency.Mutex.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// D7: cleanup is bounded while etcd is unreachable, and finishes once it is
// back.
func TestD7BoundedCleanup(t *testing.T) {
	testflags.Parallel(t)
	// proxied returns a client through a proxy of its own, with a watch
	// recorder, so that a test can see when a waiter is waiting.
	proxied := func(t *testing.T, srv *etcdtest.Server) (*clientv3.Client, *etcdtest.Proxy, *watchRecorder) {
		rec := &watchRecorder{rev: func() int64 { return 0 }, prefix: serverPrefix(t, srv)}
		c, proxy := proxiedServerClient(t, srv, nil, rec.intercept)
		t.Cleanup(proxy.Unblackhole)
		return c, proxy, rec
	}

	t.Run("ours", func(t *testing.T) {
		t.Parallel() // its own server: the three run side by side, also in the full run
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
		t.Parallel() // its own server: the three run side by side, also in the full run
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
		t.Parallel() // its own server: the three run side by side, also in the full run
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

// D9: Lock (sync.Locker) retries a transient failure instead of panicking.
func TestD9LockerTransientFailure(t *testing.T) {
	srv, client := startServer(t)
	var fault txnFault
	ic := serverClient(t, srv, fault.intercept, nil)
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
