package etcdlock_test

// Locks under etcd's authentication: a request etcd refuses was not applied,
// so it is an error every time and leaves nothing to clean up or wait for;
// and the permissions docs/api.md gives a lock are enough.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/queue"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// A grant is a permission on a range of keys: [key, end), or key alone when
// end is "", or every key from key on when end is "\x00".
type permission struct {
	key, end string
	perm     clientv3.PermissionType
}

// prefixPermission returns a permission on every key that starts with pfx.
func prefixPermission(pfx string, perm clientv3.PermissionType) permission {
	return permission{pfx, clientv3.GetPrefixRangeEnd(pfx), perm}
}

// An authEnv is an embedded etcd with authentication on: a client of its
// root user, and a client of the user "locker" (password "lockerpw"), whose
// one role is role.
type authEnv struct {
	srv        *etcdtest.Server
	root, user *clientv3.Client
	role       string
}

// authServer starts an embedded etcd with authentication on, where the
// role of the user "locker" has perms. Authentication is turned off again
// before the server stops.
func authServer(t *testing.T, perms ...permission) authEnv {
	t.Helper()
	if os.Getenv(etcdtest.EnvEndpoints) != "" {
		// Auth is on or off for a whole etcd: turned on in one shared by
		// other tests, it would lock them out.
		t.Skip("turns etcd's auth on: needs an etcd of its own, not the one ETCDTEST_ENDPOINTS shares")
	}
	srv, open := startServer(t)
	ctx := testContext(t)
	role := "locker"
	steps := []func() error{
		func() error { _, err := open.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := open.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := open.RoleAdd(ctx, role); return err },
		func() error { _, err := open.UserAdd(ctx, "locker", "lockerpw"); return err },
		func() error { _, err := open.UserGrantRole(ctx, "locker", role); return err },
	}
	for _, p := range perms {
		steps = append(steps, func() error {
			_, err := open.RoleGrantPermission(ctx, role, p.key, p.end, p.perm)
			return err
		})
	}
	steps = append(steps, func() error { _, err := open.AuthEnable(ctx); return err })
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("auth setup, step %d: %v", i, err)
		}
	}
	root := authClient(t, open.Endpoints(), "root", "rootpw")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		if _, err := root.AuthDisable(ctx); err != nil {
			t.Errorf("auth disable: %v", err)
		}
	})
	return authEnv{srv, root, authClient(t, open.Endpoints(), "locker", "lockerpw"), role}
}

// authClient returns a client of endpoints that logs in as user, closed by
// t.Cleanup.
func authClient(t *testing.T, endpoints []string, user, password string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		Username: user, Password: password,
	})
	if err != nil {
		t.Fatalf("client of %s: %v", user, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestRefusedIsNoMaybe: under a role that may read but not write the lock's
// keys, every lock call returns etcd's refusal, every time, at once: a
// refused request was not applied, so there is nothing to clean up and
// nothing to wait for. Once the role may write, the same locks work.
func TestRefusedIsNoMaybe(t *testing.T) {
	testflags.Parallel(t)
	env := authServer(t, permission{"\x00", "\x00", clientv3.PermissionType(clientv3.PermRead)})
	root, user, role := env.root, env.user, env.role
	s := newSession(t, user)
	name := lockName(t)
	opens := []struct {
		name string
		open func(*etcdlock.Session, string) famLock
	}{{"mutex", openMutex}, {"writer", openWriter}, {"reader", openReader}, {"semaphore", openSemaphore(2)}, {"multi", openMulti}}
	locks := make([]famLock, len(opens))
	for i, o := range opens {
		locks[i] = o.open(s, name+"/"+o.name)
	}
	refused := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Errorf("%s: got %v, want permission denied", what, err)
		}
	}
	for round := range 3 {
		for i, l := range locks {
			what := opens[i].name
			ctx, cancel := context.WithTimeout(testContext(t), time.Second)
			refused(what+": lock", l.Lock(ctx))
			ok, err := l.TryLock(ctx, 0)
			if ok {
				t.Errorf("%s: TryLock: got true, want false", what)
			}
			refused(what+": try", err)
			ok, err = l.TryLock(ctx, 200*time.Millisecond)
			if ok {
				t.Errorf("%s: TryLock for 200 ms: got true, want false", what)
			}
			refused(what+": try for 200 ms", err)
			cancel()
		}
		if t.Failed() {
			t.Fatalf("round %d failed", round)
		}
	}
	if keys := lockKeys(t, root, name); len(keys) != 0 {
		t.Errorf("keys after the refused calls: got %v, want none", keys)
	}
	if resp, err := root.TimeToLive(testContext(t), s.Lease(), clientv3.WithAttachedKeys()); err != nil || len(resp.Keys) != 0 {
		t.Errorf("keys on the Session's lease after the refused calls: got %q (%v), want none", resp.Keys, err)
	}

	if _, err := root.RoleGrantPermission(testContext(t), role, "\x00", "\x00", clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
		t.Fatalf("grant write: %v", err)
	}
	for i, l := range locks {
		ctx := testContext(t)
		if err := l.Lock(ctx); err != nil {
			t.Errorf("%s: lock once the role may write: got %v, want nil", opens[i].name, err)
			continue
		}
		if err := l.Unlock(ctx); err != nil {
			t.Errorf("%s: unlock: %v", opens[i].name, err)
		}
	}
}

// TestLockPermissions: a role with read and write on name/ and on the
// fence keys (etcdlock.fence.), read on the Semaphore's limit record
// (etcdlock.limit.name), and nothing else, is enough for every primitive of
// the lock name: to lock, to unlock, to clean up after a lost reply, to
// renew the Session's lease, and to close the Session.
func TestLockPermissions(t *testing.T) {
	testflags.Parallel(t)
	name := "perm/" + t.Name()
	env := authServer(t,
		prefixPermission(name+"/", clientv3.PermissionType(clientv3.PermReadWrite)),
		prefixPermission("etcdlock.fence.", clientv3.PermissionType(clientv3.PermReadWrite)),
		permission{queue.LimitKey(name), "", clientv3.PermissionType(clientv3.PermRead)})
	root, user := env.root, env.user
	fault := &txnFault{}
	c, err := clientv3.New(clientv3.Config{
		Endpoints: user.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		Username: "locker", Password: "lockerpw",
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(fault.intercept)},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := etcdlock.NewSession(c, etcdlock.WithRenewal(), etcdlock.WithTTL(2*time.Second))
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	ctx := testContext(t)
	for _, o := range []struct {
		name string
		open func(*etcdlock.Session, string) famLock
	}{{"mutex", openMutex}, {"writer", openWriter}, {"reader", openReader}, {"semaphore", openSemaphore(2)}, {"multi", openMulti}} {
		l := o.open(s, name)
		fault.arm(0, 1, loseReply)
		if err := l.Lock(ctx); err == nil {
			t.Fatalf("%s: lock with its reply lost: got nil, want an error", o.name)
		}
		fault.arm(0, 0, nil)
		if err := l.Lock(ctx); err != nil {
			t.Fatalf("%s: lock: got %v, want nil", o.name, err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatalf("%s: unlock: got %v, want nil", o.name, err)
		}
	}
	if keys := leaseKeys(t, root, s.Lease()); len(keys) != 1 || keys[0] != "etcdlock.fence."+fmt.Sprintf("%x", s.Lease()) {
		t.Errorf("keys on the lease: got %q, want the fence alone", keys)
	}
	revokeAndRenew(t, root, s)
	m := etcdlock.NewMutex(s, name)
	if err := m.LockContext(ctx); err != nil {
		t.Fatalf("LockContext on the renewed lease: %v", err)
	}
	held := s.Lease()
	if err := s.Close(); err != nil {
		t.Errorf("Close: got %v, want nil", err)
	}
	if leaseAlive(t, root, held) {
		t.Error("the lease outlived Close")
	}
}

// TestLeadPermissions: a role with read and write on name/, the fence keys
// and Lead's records (etcdlock.term.NAME, etcdlock.handover.NAME) is enough
// for Lead to lead, count its terms (on a lease of the count's own) and
// hand over; once the candidates stop, the count alone is left, on its
// lease. Without the records, TestLeadRole100.
func TestLeadPermissions(t *testing.T) {
	testflags.Parallel(t)
	name := "perm/" + t.Name()
	rw := clientv3.PermissionType(clientv3.PermReadWrite)
	_, termKey := recordKeys(name)
	env := authServer(t, prefixPermission(name+"/", rw), prefixPermission("etcdlock.fence.", rw),
		prefixPermission("etcdlock.handover.", rw), permission{termKey, "", rw})
	ctx := testContext(t)
	d := newDuties(t, env.user, name)
	a := leadAs(ctx, env.user, name, "a", d)
	if r := d.next(); r.who != "a" || r.term != 1 || r.etcdTerm != 1 {
		t.Errorf("the first term under the role: got %+v, want a's, counted 1", r)
	}
	// c is queued between: only the record, written under the role, makes
	// b lead next.
	c := leadAs(ctx, env.user, name, "c", d)
	queued(t, env.root, name, 2)
	b := leadAs(ctx, env.user, name, "b", d)
	queued(t, env.root, name, 3)
	d.end("a", etcdlock.HandOver("b"))
	if r := d.next(); r.who != "b" || r.term != 2 || r.etcdTerm != 2 {
		t.Errorf("after a handed over to b: got %+v, want b's term, counted 2", r)
	}
	_ = a.stop(t)
	_ = b.stop(t)
	_ = c.stop(t)

	keys := allKeys(t, env.root)
	if len(keys) != 1 || keys[0].key != termKey || keys[0].lease == 0 {
		t.Errorf("keys once the candidates stopped: got %v, want the count %s alone, on a lease", keys, termKey)
	}
}

// TestSetLimitPermissions: SetLimit reads the queue and writes the record,
// and, where keys wait, puts the first waiters' keys again: a role with
// read on name/ and read and write on the record sets a limit while no key
// waits, and gets etcd's refusal, writing nothing, once one does; with
// write on name/ too, the limit is set and the waiter admitted.
func TestSetLimitPermissions(t *testing.T) {
	testflags.Parallel(t)
	name := "perm/" + t.Name()
	env := authServer(t,
		prefixPermission(name+"/", clientv3.PermissionType(clientv3.PermRead)),
		permission{queue.LimitKey(name), "", clientv3.PermissionType(clientv3.PermReadWrite)})
	root, user := env.root, env.user
	ctx := testContext(t)
	holder, err := etcdlock.NewSemaphore(newSession(t, root), name, 1).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := etcdlock.SetLimit(ctx, user, name, 1); err != nil {
		t.Fatalf("SetLimit with no waiter: %v", err)
	}
	waiter := acquireInGoroutine(ctx, etcdlock.NewSemaphore(newSession(t, root), name, 1))
	eventually(t, "the waiter queued", func() bool { return len(lockKeys(t, root, name)) == 2 })
	if err := etcdlock.SetLimit(ctx, user, name, 2); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("SetLimit with a waiter, no write on %s/: got %v, want permission denied", name, err)
	}
	if n, err := etcdlock.ReadLimit(ctx, root, name); err != nil || n != 1 {
		t.Fatalf("the limit after the refusal: got %d, %v, want 1", n, err)
	}
	if !waiting(waiter, 200*time.Millisecond) {
		t.Fatal("the waiter got in at limit 1")
	}
	rw := clientv3.PermissionType(clientv3.PermReadWrite)
	if _, err := root.RoleGrantPermission(ctx, env.role, name+"/", clientv3.GetPrefixRangeEnd(name+"/"), rw); err != nil {
		t.Fatal(err)
	}
	if err := etcdlock.SetLimit(ctx, user, name, 2); err != nil {
		t.Fatalf("SetLimit with write on %s/: %v", name, err)
	}
	release(t, admitted(t, waiter))
	release(t, holder)
}
