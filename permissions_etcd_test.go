package etcdlock_test

// etcd's own tests of its locks and elections under authentication, ported
// as they are to this package's Lead and Mutex: the role they grant is the
// one etcd's recipes need, and it must be enough here too.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// TestElectionWithAuthEnabled is etcd's test of the same name
// (tests/integration/clientv3/concurrency/election_test.go, etcd issue
// #17502), with Lead for concurrency.Election's Campaign: user1's role may
// read and write [/foo1, /foo2), user2's [/bar1, /bar2); each campaigns
// twice at once on a name in its range, user2 a moment later. Every
// campaign must lead, with no error, under those roles alone. etcd's
// Sessions are orphaned, so that its second campaigns wait for the first's
// lease to expire; Lead resigns when f returns, so these do not wait.
func TestElectionWithAuthEnabled(t *testing.T) {
	testflags.Parallel(t)
	rw := clientv3.PermissionType(clientv3.PermReadWrite)
	env := authServer(t)
	c1 := env.addUser(t, "user1", []permission{{"/foo1", "/foo2", rw}})
	c2 := env.addUser(t, "user2", []permission{{"/bar1", "/bar2", rw}})
	campaigns := []struct {
		name  string
		c     *clientv3.Client
		pfx   string
		sleep time.Duration
	}{
		{"client1 first campaign", c1, "/foo1/a", 0},
		{"client1 second campaign", c1, "/foo1/a", 0},
		{"client2 first campaign", c2, "/bar1/b", 500 * time.Millisecond},
		{"client2 second campaign", c2, "/bar1/b", 600 * time.Millisecond},
	}
	ctx := testContext(t)
	var wg sync.WaitGroup
	errs := make(chan error, len(campaigns))
	for _, cp := range campaigns {
		wg.Go(func() {
			time.Sleep(cp.sleep)
			err := leadOnce(ctx, func(ctx context.Context, f func(context.Context) error) error {
				return etcdlock.Lead(ctx, cp.c, cp.pfx, f, etcdlock.WithTTL(10*time.Second))
			}, func(ctx context.Context) error {
				l, err := etcdlock.LeaderOf(ctx, env.root, cp.pfx)
				if err != nil {
					return err
				}
				h, ok := etcdlock.HoldFrom(ctx)
				if !ok || h.Key != l.Key {
					return fmt.Errorf("leads as %+v, but etcd's leader is %s", h, l.Key)
				}
				return nil
			})
			if err != nil {
				errs <- fmt.Errorf("[Campaign] %s: %w", cp.name, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, pfx := range []string{"/foo1/a", "/bar1/b"} {
		if keys := lockKeys(t, env.root, pfx); len(keys) != 0 {
			t.Errorf("keys of %s after the campaigns: got %q, want none", pfx, keys)
		}
	}
}

// TestCtlV3LockWithAuth is etcd's testLock (tests/e2e/ctl_v3_lock_test.go,
// of etcdctl lock) under a role granted read and write on the lock's
// prefix alone, as etcd documents for locks (etcd issue #10544): here
// /jobs/nightly/, for the lock /jobs/nightly. A holder; a waiter that must
// block and then gives up; another that must block, and holds once the
// holder's process ends (its Session closes), with another key.
func TestCtlV3LockWithAuth(t *testing.T) {
	testflags.Parallel(t)
	name := "/jobs/nightly"
	env := authServer(t, prefixPermission(name+"/", clientv3.PermissionType(clientv3.PermReadWrite)))
	ctx := testContext(t)
	lock := func(ctx context.Context) (*etcdlock.Session, <-chan string, <-chan error) {
		s := newSession(t, env.user)
		keys, errs := make(chan string, 1), make(chan error, 1)
		go func() {
			m := etcdlock.NewMutex(s, name)
			if err := m.LockContext(ctx); err != nil {
				errs <- err
				return
			}
			keys <- m.Key()
		}()
		return s, keys, errs
	}

	holder, ch, errs := lock(ctx)
	var l1 string
	select {
	case l1 = <-ch:
	case err := <-errs:
		t.Fatalf("locking: %v", err)
	case <-time.After(testTimeout):
		t.Fatal("timed out locking")
	}

	bctx, interrupt := context.WithCancel(ctx)
	_, bch, berrs := lock(bctx)
	select {
	case <-time.After(100 * time.Millisecond):
	case <-bch:
		t.Fatal("should block")
	case err := <-berrs:
		t.Fatalf("the blocked waiter: %v", err)
	}

	_, ach, aerrs := lock(ctx)
	select {
	case <-time.After(100 * time.Millisecond):
	case <-ach:
		t.Fatal("should block")
	case err := <-aerrs:
		t.Fatalf("the waiter that will hold: %v", err)
	}

	interrupt()
	if err := <-berrs; !errors.Is(err, context.Canceled) {
		t.Fatalf("the interrupted waiter: got %v, want context.Canceled", err)
	}
	if err := holder.Close(); err != nil {
		t.Fatalf("the holder's Close: %v", err)
	}
	select {
	case l2 := <-ach:
		if l2 == l1 {
			t.Fatalf("expected another key, got l1=%q, l2=%q", l1, l2)
		}
	case err := <-aerrs:
		t.Fatalf("the waiter that will hold: %v", err)
	case <-time.After(testTimeout):
		t.Fatal("timed out from waiting to holding")
	}
}
