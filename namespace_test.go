package etcdlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
)

// newSharedSession returns a Session on a client of the shared etcdtest
// server, namespaced under a prefix of the test's own.
func newSharedSession(t *testing.T) (*etcdtest.Namespace, *etcdlock.Session) {
	t.Helper()
	ns := etcdtest.Shared(t)
	s, err := etcdlock.NewSession(ns.Client)
	if err != nil {
		t.Fatalf("new session: got %v, want nil", err)
	}
	t.Cleanup(func() { s.Close() })
	return ns, s
}

// checkUnderPrefix checks that every key of the lock name, as Inspect of
// the namespaced client reports it, is stored under the namespace's prefix
// and nowhere else, where Inspect of a plain client finds it too.
func checkUnderPrefix(t *testing.T, ns *etcdtest.Namespace, name string, holders int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	entries, err := etcdlock.Inspect(ctx, ns.Client, name)
	if err != nil {
		t.Fatalf("inspect: got %v, want nil", err)
	}
	if len(entries) != holders {
		t.Fatalf("inspect: got %d entries, want %d", len(entries), holders)
	}
	raw, err := clientv3.New(clientv3.Config{Endpoints: ns.Client.Endpoints()})
	if err != nil {
		t.Fatalf("client: got %v, want nil", err)
	}
	defer raw.Close()
	for _, e := range entries {
		if !e.Holds || !strings.HasPrefix(e.Key, name+"/") {
			t.Fatalf("inspect: got %+v, want a holder under %s/", e, name)
		}
		resp, err := raw.Get(ctx, ns.Prefix+e.Key)
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("raw get %s%s: got %v (%v), want the key", ns.Prefix, e.Key, resp, err)
		}
	}
	// Outside the namespace, as etcdlock holders sees it, the lock is
	// called Prefix+name.
	outside, err := etcdlock.Inspect(ctx, raw, ns.Prefix+name)
	if err != nil || len(outside) != holders {
		t.Fatalf("inspect %s%s outside the namespace: got %d entries (%v), want %d", ns.Prefix, name, len(outside), err, holders)
	}
	resp, err := raw.Get(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Fatalf("raw get %s/ outside the namespace: got %v (%v), want no keys", name, resp, err)
	}
}

// TestNamespacedLocks runs the lock kinds, Inspect and Lead through
// namespaced clients of the shared server, in parallel, each on the same
// lock name: they must not see each other.
func TestNamespacedLocks(t *testing.T) {
	const name = "locks/shared"
	t.Run("Mutex", func(t *testing.T) {
		t.Parallel()
		ns, s := newSharedSession(t)
		m := etcdlock.NewMutex(s, name)
		if err := m.LockContext(t.Context()); err != nil {
			t.Fatalf("lock: got %v, want nil", err)
		}
		checkUnderPrefix(t, ns, name, 1)
		if err := m.UnlockContext(t.Context()); err != nil {
			t.Fatalf("unlock: got %v, want nil", err)
		}
		checkUnderPrefix(t, ns, name, 0)
	})
	t.Run("RWMutex", func(t *testing.T) {
		t.Parallel()
		ns, s := newSharedSession(t)
		_, s2 := newSharedSession(t) // another namespace: no conflict
		rw := etcdlock.NewRWMutex(s, name)
		if err := rw.RLockContext(t.Context()); err != nil {
			t.Fatalf("rlock: got %v, want nil", err)
		}
		other := etcdlock.NewRWMutex(s2, name)
		if !other.TryLock() {
			t.Fatalf("try lock in another namespace: got false, want true")
		}
		checkUnderPrefix(t, ns, name, 1)
		other.Unlock()
		if err := rw.RUnlockContext(t.Context()); err != nil {
			t.Fatalf("runlock: got %v, want nil", err)
		}
	})
	t.Run("Semaphore", func(t *testing.T) {
		t.Parallel()
		ns, s := newSharedSession(t)
		sem := etcdlock.NewSemaphore(s, name, 2)
		var permits []*etcdlock.Permit
		for range 2 {
			p, err := sem.Acquire(t.Context())
			if err != nil {
				t.Fatalf("acquire: got %v, want nil", err)
			}
			permits = append(permits, p)
		}
		checkUnderPrefix(t, ns, name, 2)
		for _, p := range permits {
			if err := p.Release(t.Context()); err != nil {
				t.Fatalf("release: got %v, want nil", err)
			}
		}
	})
	t.Run("Lead", func(t *testing.T) {
		t.Parallel()
		ns := etcdtest.Shared(t)
		ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
		defer cancel()
		errLed := errors.New("led")
		err := etcdlock.Lead(ctx, ns.Client, name, func(ctx context.Context) error {
			checkUnderPrefix(t, ns, name, 1)
			return errLed // ends Lead
		})
		if !errors.Is(err, errLed) {
			t.Fatalf("lead: got %v, want %v", err, errLed)
		}
		checkUnderPrefix(t, ns, name, 0)
	})
}
