package etcdlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
)

// TestBadInput: every bad input gets a clear error from the context methods,
// false from TryLock, a panic naming the context method from Lock and Unlock,
// and writes nothing to etcd.
func TestBadInput(t *testing.T) {
	_, client := startServer(t)
	good := newSession(t, client)
	closed, err := etcdlock.NewSession(client)
	if err != nil {
		t.Fatal(err)
	}
	if err := closed.Close(); err != nil {
		t.Fatal(err)
	}
	expired, err := etcdlock.NewSession(client, etcdlock.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = expired.Close() })
	if _, err := client.Revoke(testContext(t), expired.Lease()); err != nil {
		t.Fatal(err)
	}
	<-expired.Done()

	for _, tc := range []struct {
		name      string
		m         *etcdlock.Mutex
		ctx       context.Context
		want      error
		lockPanic string // what the Lock panic names; "" for no Lock call
	}{
		{"nil session", etcdlock.NewMutex(nil, "x"), context.Background(), etcdlock.ErrInvalidArgument, "LockContext"},
		{"nil Mutex", nil, context.Background(), etcdlock.ErrInvalidArgument, "LockContext"},
		{"empty name", etcdlock.NewMutex(good, ""), context.Background(), etcdlock.ErrInvalidName, "LockContext"},
		{"nil context", etcdlock.NewMutex(good, "x"), nil, etcdlock.ErrInvalidArgument, ""},
		{"closed session", etcdlock.NewMutex(closed, "x"), context.Background(), etcdlock.ErrSessionExpired, "LockContext"},
		{"expired session", etcdlock.NewMutex(expired, "x"), context.Background(), etcdlock.ErrSessionExpired, "LockContext"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := revision(t, client)
			if err := tc.m.LockContext(tc.ctx); !errors.Is(err, tc.want) {
				t.Errorf("LockContext = %v, want %v", err, tc.want)
			}
			if ok, err := tc.m.TryLockFor(tc.ctx, time.Second); ok || !errors.Is(err, tc.want) {
				t.Errorf("TryLockFor = %v, %v, want false, %v", ok, err, tc.want)
			}
			if tc.ctx != nil && tc.m.TryLock() {
				t.Error("TryLock = true, want false")
			}
			if err := tc.m.UnlockContext(tc.ctx); err == nil {
				t.Error("UnlockContext = nil, want an error")
			}
			if tc.m.HoldCount() != 0 || tc.m.Key() != "" || tc.m.Token() != 0 {
				t.Errorf("HoldCount %d, Key %q, Token %d, want 0, \"\", 0", tc.m.HoldCount(), tc.m.Key(), tc.m.Token())
			}
			select {
			case <-tc.m.Done():
			default:
				t.Error("Done() is open while nothing is held")
			}
			if tc.lockPanic != "" {
				assertPanics(t, "Lock", tc.lockPanic, tc.m.Lock)
				assertPanics(t, "Unlock", "UnlockContext", tc.m.Unlock)
			}
			// The comparison of a Mutex that holds nothing is always false.
			resp, err := client.Txn(testContext(t)).If(tc.m.IsOwner()).Commit()
			if err != nil || resp.Succeeded {
				t.Errorf("Txn(If(IsOwner())) = %v, %v, want not succeeded", resp, err)
			}
			if after := revision(t, client); after != before {
				t.Errorf("revision moved from %d to %d, want nothing written", before, after)
			}
		})
	}
}

func TestUnlockNotHeld(t *testing.T) {
	_, client := startServer(t)
	s := newSession(t, client)
	m := etcdlock.NewMutex(s, lockName(t))
	ctx := testContext(t)
	if err := m.UnlockContext(ctx); !errors.Is(err, etcdlock.ErrNotHeld) {
		t.Errorf("UnlockContext of a free lock = %v, want ErrNotHeld", err)
	}
	assertPanics(t, "Unlock of a free lock", "UnlockContext", m.Unlock)

	m.Lock()
	other := result(func() error { return m.UnlockContext(ctx) })
	if err := waitErr(t, other); !errors.Is(err, etcdlock.ErrNotHeld) {
		t.Errorf("UnlockContext by a goroutine that holds nothing = %v, want ErrNotHeld", err)
	}
	if got := m.HoldCount(); got != 1 {
		t.Errorf("HoldCount() after the other goroutine's unlock = %d, want 1 (unchanged)", got)
	}
	if len(lockKeys(t, client, lockName(t))) != 1 {
		t.Error("the holder's key is gone after another goroutine's failed unlock")
	}
	m.Unlock()
}

// TestUnlockLost: the key deleted under the holder; UnlockContext ends the
// hold and reports the loss.
func TestUnlockLost(t *testing.T) {
	_, client := startServer(t)
	s := newSession(t, client)
	m := etcdlock.NewMutex(s, lockName(t))
	ctx := testContext(t)
	m.Lock()
	if _, err := client.Delete(ctx, m.Key()); err != nil {
		t.Fatal(err)
	}
	if err := m.UnlockContext(ctx); !errors.Is(err, etcdlock.ErrLockLost) {
		t.Errorf("UnlockContext after the key was deleted = %v, want ErrLockLost", err)
	}
	// The Session goes on: the lock can be taken again.
	if err := m.LockContext(ctx); err != nil {
		t.Fatalf("LockContext after a lost hold: %v", err)
	}
	if err := m.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestIsOwner: a Txn guarded by IsOwner succeeds while held and fails once
// the hold ended, even after the process locks again.
func TestIsOwner(t *testing.T) {
	_, client := startServer(t)
	s := newSession(t, client)
	m := etcdlock.NewMutex(s, lockName(t))
	ctx := testContext(t)
	m.Lock()
	guard := m.IsOwner()
	put := func(cmp clientv3.Cmp) bool {
		resp, err := client.Txn(ctx).If(cmp).Then(clientv3.OpPut("guarded", "x")).Commit()
		if err != nil {
			t.Fatal(err)
		}
		return resp.Succeeded
	}
	if !put(guard) {
		t.Fatal("guarded Txn while held failed, want it to succeed")
	}
	m.Unlock()
	if put(guard) {
		t.Error("guarded Txn after unlock succeeded, want it to fail")
	}
	m.Lock()
	defer m.Unlock()
	if put(guard) {
		t.Error("Txn guarded by an earlier hold succeeded in a later hold, want it to fail")
	}
	if !put(m.IsOwner()) {
		t.Error("Txn guarded by the current hold failed")
	}
}
