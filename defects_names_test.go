package etcdlock_test

// Upstream defect D11 (docs/design.md §1): a lock's name taken as a plain prefix,
// so that a lock nested under it ("a/b" under "a") blocks it, and what fixes
// that must not break exclusion.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

func TestD11SameTxnNestedKey(t *testing.T) {
	testflags.Parallel(t)
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
	testflags.Parallel(t)
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
