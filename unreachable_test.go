package etcdlock_test

// etcd unreachable: every call is bounded, and what it leaves is cleaned up
// once etcd is back.

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// TestDownLockContextDeadline: with etcd unreachable, LockContext and
// TryLockFor return by their deadline + 1 s (asserted: + 2 s), whether the
// cut comes before the call or while it waits; once etcd is back, no key of
// the failed calls is left.
func TestDownLockContextDeadline(t *testing.T) {
	testflags.Parallel(t)
	healthy, pc, proxy := startProxied(t)
	defer proxy.Unblackhole()
	ctx := testContext(t)
	name := lockName(t)
	s := aliveSession(t, pc, 30*time.Second)

	// Each call on a lock of its own, so that none waits for the turn that
	// an earlier call's background delete keeps.
	var names []string
	timed := func(what string, d time.Duration, call func(*etcdlock.Mutex, context.Context) error) {
		t.Helper()
		n := fmt.Sprintf("%s-%d", name, len(names))
		names = append(names, n)
		cctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		start := time.Now()
		err := call(etcdlock.NewMutex(s, n), cctx)
		checkBound(t, fmt.Sprintf("%s with a %v deadline, etcd down", what, d), time.Since(start), d+deadlineSlack)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s with a %v deadline, etcd down: got %v, want context.DeadlineExceeded", what, d, err)
		}
	}

	// Cut before the call.
	proxy.Blackhole()
	for _, d := range []time.Duration{0, 10 * time.Millisecond, 300 * time.Millisecond} {
		timed("LockContext", d, (*etcdlock.Mutex).LockContext)
		timed("TryLockFor", d, func(m *etcdlock.Mutex, ctx context.Context) error {
			ok, err := m.TryLockFor(ctx, 10*time.Second)
			if ok {
				return errors.New("held")
			}
			return err
		})
	}
	proxy.Unblackhole()
	for _, n := range names {
		eventually(t, "no key left after etcd came back", func() bool { return len(lockKeys(t, healthy, n)) == 0 })
	}
	m := etcdlock.NewMutex(s, name)

	// Cut while waiting behind another holder: our key is in etcd.
	holder := etcdlock.NewMutex(newSession(t, healthy), name)
	holder.Lock()
	const d = 500 * time.Millisecond
	start := time.Now()
	ch := result(func() error {
		cctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		return m.LockContext(cctx)
	})
	eventually(t, "the waiter's key", func() bool { return len(lockKeys(t, healthy, name)) == 2 })
	proxy.Blackhole()
	err := waitErr(t, ch)
	checkBound(t, fmt.Sprintf("LockContext with a %v deadline, cut off while waiting", d), time.Since(start), d+deadlineSlack)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("LockContext cut off while waiting: got %v, want context.DeadlineExceeded", err)
	}
	proxy.Unblackhole()
	eventually(t, "the waiter's key deleted after etcd came back", func() bool { return len(lockKeys(t, healthy, name)) == 1 })
	holder.Unlock()
}

// TestDownUnlockAndClose: with etcd unreachable, UnlockContext returns
// within 3 s (asserted: 6 s) and Session.Close within 5 s; a delete that
// etcd did not confirm is retried until it lands, once etcd is back.
func TestDownUnlockAndClose(t *testing.T) {
	testflags.Parallel(t)
	healthy, pc, proxy := startProxied(t)
	defer proxy.Unblackhole()
	ctx := testContext(t)
	name := lockName(t)

	s := aliveSession(t, pc, 30*time.Second)
	m := etcdlock.NewMutex(s, name)
	m.Lock()
	proxy.Blackhole()
	start := time.Now()
	err := m.UnlockContext(ctx)
	checkBound(t, "UnlockContext, etcd down", time.Since(start), unlockBound)
	if err == nil {
		t.Error("UnlockContext, etcd down: got nil, want etcd's error")
	}
	if got := m.HoldCount(); got != 0 {
		t.Errorf("HoldCount after UnlockContext: got %d, want 0", got)
	}
	proxy.Unblackhole()
	eventually(t, "the key deleted in the background", func() bool { return len(lockKeys(t, healthy, name)) == 0 })
	if !leaseAlive(t, healthy, s.Lease()) {
		t.Fatal("lease gone: the key was deleted by expiry, not by the retried delete")
	}

	s2 := aliveSession(t, pc, 2*time.Second)
	m2 := etcdlock.NewMutex(s2, name)
	m2.Lock()
	proxy.Blackhole()
	start = time.Now()
	err = s2.Close()
	checkBound(t, "Session.Close, etcd down", time.Since(start), closeBound)
	t.Logf("Session.Close, etcd down: %v", err)
	if err := m2.LockContext(ctx); !errors.Is(err, etcdlock.ErrSessionExpired) {
		t.Errorf("LockContext after Close: got %v, want ErrSessionExpired", err)
	}
	proxy.Unblackhole()
	eventually(t, "the closed session's lease gone", func() bool { return !leaseAlive(t, healthy, s2.Lease()) })
	if got := lockKeys(t, healthy, name); len(got) != 0 {
		t.Errorf("keys after the lease expired: got %q, want none", got)
	}
}

// syncLocker is ours with Lock done by Mutex.Lock, the sync.Locker, which
// retries until it holds and takes no context.
type syncLocker struct{ ours }

func (l syncLocker) Lock(context.Context) error {
	l.m.Lock()
	return nil
}

// TestDownLockRetries: Lock, started while etcd is unreachable, keeps
// retrying and takes the lock once etcd is back.
func TestDownLockRetries(t *testing.T) {
	testflags.Parallel(t)
	healthy, pc, proxy := startProxied(t)
	defer proxy.Unblackhole()
	name := lockName(t)
	s := aliveSession(t, pc, 10*time.Second)
	m := etcdlock.NewMutex(s, name)

	proxy.Blackhole()
	w := lockInGoroutine(t, testContext(t), syncLocker{ours{m}})
	if !blocked(w.locked, time.Second) {
		t.Fatal("Lock returned while etcd was unreachable")
	}
	proxy.Unblackhole()
	back := time.Now()
	if err := waitErr(t, w.locked); err != nil {
		t.Fatalf("Lock: got %v, want it to hold", err)
	}
	t.Logf("Lock acquired %v after etcd came back", time.Since(back).Round(time.Millisecond))
	keys := lockKeys(t, healthy, name)
	if len(keys) != 1 || keys[0] != keyOf(name, s.Lease()) || m.Token() <= 0 {
		t.Errorf("after Lock: got keys %q, token %d, want [%s] and a token", keys, m.Token(), keyOf(name, s.Lease()))
	}
	if err := w.Release(); err != nil {
		t.Errorf("UnlockContext after Lock: got %v, want nil", err)
	}
}

// TestDownWaiterSessionExpires: a waiter whose own session ends returns
// ErrSessionExpired within 1 s of Session.Done (asserted: 2 s), while the
// holder still holds.
func TestDownWaiterSessionExpires(t *testing.T) {
	testflags.Parallel(t)
	for _, how := range []string{"revoked", "blackholed"} {
		t.Run(how, func(t *testing.T) {
			healthy, pc, proxy := startProxied(t)
			defer proxy.Unblackhole()
			ctx := testContext(t)
			name := lockName(t)
			holder := etcdlock.NewMutex(newSession(t, healthy), name)
			holder.Lock()
			defer holder.Unlock()

			ws := aliveSession(t, pc, 2*time.Second)
			waiter := etcdlock.NewMutex(ws, name)
			var returnedAt atomic.Int64
			ch := result(func() error {
				err := waiter.LockContext(ctx)
				returnedAt.Store(time.Now().UnixNano())
				return err
			})
			eventually(t, "the waiter's key", func() bool { return len(lockKeys(t, healthy, name)) == 2 })
			doneAt := closeTime(ws.Done())
			start := time.Now()
			if how == "revoked" {
				if _, err := healthy.Revoke(ctx, ws.Lease()); err != nil {
					t.Fatalf("revoke: got %v, want nil", err)
				}
			} else {
				proxy.Blackhole()
			}
			err := waitErr(t, ch)
			if !errors.Is(err, etcdlock.ErrSessionExpired) {
				t.Fatalf("LockContext of a waiter whose session ended: got %v, want ErrSessionExpired", err)
			}
			eventually(t, "Session.Done", func() bool { return !doneAt().IsZero() })
			returned := time.Unix(0, returnedAt.Load())
			lag := returned.Sub(doneAt())
			t.Logf("%s: Session.Done %v after the fault, LockContext returned %v after Session.Done",
				how, doneAt().Sub(start).Round(time.Millisecond), lag.Round(time.Millisecond))
			if lag > expiredBound {
				t.Errorf("LockContext returned %v after Session.Done, want ≤ %v", lag, expiredBound)
			}
		})
	}
}

// TestSessionCloseAfterCancel: with etcd unreachable, Close racing the
// revoke that cancelling the WithContext context started returns within
// 5 s, and sends no second revoke after the first has answered.
func TestSessionCloseAfterCancel(t *testing.T) {
	testflags.Parallel(t)
	var revokes atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == "/etcdserverpb.Lease/LeaseRevoke" {
			revokes.Add(1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	c, proxy := proxiedServerClient(t, etcdtest.Start(t), count, nil)
	defer proxy.Unblackhole()
	sctx, cancel := context.WithCancel(testContext(t))
	s := newSession(t, c, etcdlock.WithContext(sctx), etcdlock.WithTTL(2*time.Second))

	proxy.Blackhole()
	cancel()
	eventually(t, "the revoke started by the cancel", func() bool { return revokes.Load() == 1 })
	start := time.Now()
	err := s.Close()
	checkBound(t, "Close, etcd down, after the cancel's revoke started", time.Since(start), closeBound)
	if err == nil {
		t.Error("Close: got nil, want the revoke's error (etcd is unreachable)")
	}
	if n := revokes.Load(); n != 1 {
		t.Errorf("revokes sent: got %d, want 1", n)
	}
}
