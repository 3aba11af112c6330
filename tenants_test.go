package etcdlock_test

// Two teams on one etcd, each with a role on a prefix of its own and a
// client namespaced under it (README, Permissions: teams sharing an etcd):
// every key the library writes for a team, its locks, fence keys and
// records, lies under that team's prefix, so neither team can read, take,
// break or slow the other's locks. Judged in etcd, under real roles.

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/namespace"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// tenantClient returns a client of endpoints that logs in as user and puts
// every key under prefix: the client a team's services use.
func tenantClient(t *testing.T, endpoints []string, user, password, prefix string) *clientv3.Client {
	t.Helper()
	c := authClient(t, endpoints, user, password)
	c.KV = namespace.NewKV(c.KV, prefix)
	c.Watcher = namespace.NewWatcher(c.Watcher, prefix)
	c.Lease = namespace.NewLease(c.Lease, prefix)
	return c
}

// addTenant adds, as root, a user whose one role has read and write on the
// keys that start with prefix, and nothing else: README's recipe for a team.
func addTenant(t *testing.T, root *clientv3.Client, user, password, prefix string) {
	t.Helper()
	ctx := testContext(t)
	steps := []func() error{
		func() error { _, err := root.RoleAdd(ctx, user); return err },
		func() error {
			_, err := root.RoleGrantPermission(ctx, user, prefix, clientv3.GetPrefixRangeEnd(prefix), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := root.UserAdd(ctx, user, password); return err },
		func() error { _, err := root.UserGrantRole(ctx, user, user); return err },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("add tenant %s, step %d: %v", user, i, err)
		}
	}
}

// keyRevisions returns every key under pfx with its create revision.
func keyRevisions(t *testing.T, client *clientv3.Client, pfx string) map[string]int64 {
	t.Helper()
	resp, err := client.Get(testContext(t), pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	keys := make(map[string]int64, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		keys[string(kv.Key)] = kv.CreateRevision
	}
	return keys
}

// TestTenantsKeptApart: team B holds a Mutex (with a waiter behind it), an
// RWMutex's read lock and a permit of a Semaphore whose limit it recorded,
// and its fence keys are in etcd. Team A, with the same recipe on its own
// prefix, takes the same names in its own namespace without touching B's;
// outside its namespace, every call of A's on B's names, keys, records and
// leases is refused. Meanwhile B's keys stay as they were (the same create
// revisions), B's holds stay held, and B's waiter gets the lock when B lets
// go.
func TestTenantsKeptApart(t *testing.T) {
	testflags.Parallel(t)
	env := authServer(t, prefixPermission("teamA/", clientv3.PermissionType(clientv3.PermReadWrite)))
	root, eps := env.root, env.root.Endpoints()
	addTenant(t, root, "teamb", "teambpw", "teamB/")
	a := tenantClient(t, eps, "locker", "lockerpw", "teamA/")
	b := tenantClient(t, eps, "teamb", "teambpw", "teamB/")
	aRaw := env.user // A's credentials, outside its namespace
	ctx := testContext(t)
	const name, pool, shared = "jobs/nightly", "pool", "config"

	sb := newSession(t, b, etcdlock.WithTTL(time.Minute))
	mb := etcdlock.NewMutex(sb, name)
	if err := mb.LockContext(ctx); err != nil {
		t.Fatalf("B: lock: %v", err)
	}
	waiter := lockInGoroutine(t, ctx, oursOn(newSession(t, b), name))
	eventually(t, "B's waiter's key", func() bool { return len(lockKeys(t, b, name)) == 2 })
	rb := etcdlock.NewRWMutex(sb, shared)
	if err := rb.RLockContext(ctx); err != nil {
		t.Fatalf("B: read lock: %v", err)
	}
	if err := etcdlock.SetLimit(ctx, b, pool, 1); err != nil {
		t.Fatalf("B: SetLimit: %v", err)
	}
	pb, err := etcdlock.NewSemaphore(sb, pool, 3).Acquire(ctx)
	if err != nil {
		t.Fatalf("B: Acquire: %v", err)
	}
	// A fence key of B's: the one a lost reply makes a Session write.
	if _, err := b.Put(ctx, "etcdlock.fence.b", "", clientv3.WithLease(sb.Lease())); err != nil {
		t.Fatalf("B: put a fence key: %v", err)
	}
	before := keyRevisions(t, root, "teamB/")
	t.Logf("B's keys in etcd: %v", before)

	// A, in its own namespace, takes the same names: another lock.
	sa := newSession(t, a)
	ma := etcdlock.NewMutex(sa, name)
	if ok, err := ma.TryLockFor(ctx, 0); !ok || err != nil {
		t.Fatalf("A: TryLock of %q in its own namespace: got %v, %v, want true", name, ok, err)
	}
	if err := etcdlock.SetLimit(ctx, a, pool, 2); err != nil {
		t.Fatalf("A: SetLimit in its own namespace: %v", err)
	}

	// A, outside its namespace, on B's.
	sRaw := newSession(t, aRaw)
	entry := etcdlock.QueueEntry{Key: "teamB/" + mb.Key(), Lease: sb.Lease(), Token: mb.Token(), Holds: true}
	attempts := []struct {
		what string
		call func(context.Context) error
	}{
		{"lock B's name", etcdlock.NewMutex(sRaw, "teamB/"+name).LockContext},
		{"try B's name", func(ctx context.Context) error {
			_, err := etcdlock.NewMutex(sRaw, "teamB/"+name).TryLockFor(ctx, 0)
			return err
		}},
		{"write-lock B's RWMutex", etcdlock.NewRWMutex(sRaw, "teamB/"+shared).LockContext},
		{"acquire B's Semaphore", func(ctx context.Context) error {
			_, err := etcdlock.NewSemaphore(sRaw, "teamB/"+pool, 3).Acquire(ctx)
			return err
		}},
		{"inspect B's queue", func(ctx context.Context) error {
			_, err := etcdlock.Inspect(ctx, aRaw, "teamB/"+name)
			return err
		}},
		{"release B's holder", func(ctx context.Context) error {
			return etcdlock.Release(ctx, aRaw, "teamB/"+name, entry)
		}},
		{"set B's limit", func(ctx context.Context) error { return etcdlock.SetLimit(ctx, aRaw, "teamB/"+pool, 5) }},
		{"read B's limit", func(ctx context.Context) error {
			_, err := etcdlock.ReadLimit(ctx, aRaw, "teamB/"+pool)
			return err
		}},
		{"check B's fence", func(ctx context.Context) error {
			f := pb.Fence()
			f.Name, f.Key = "teamB/"+f.Name, "teamB/"+f.Key
			return etcdlock.CheckFence(ctx, aRaw, f)
		}},
		{"read B's keys", func(ctx context.Context) error {
			_, err := aRaw.Get(ctx, "teamB/", clientv3.WithPrefix())
			return err
		}},
		{"delete B's keys", func(ctx context.Context) error {
			_, err := aRaw.Delete(ctx, "teamB/", clientv3.WithPrefix())
			return err
		}},
		{"delete B's fence keys", func(ctx context.Context) error {
			_, err := aRaw.Delete(ctx, "teamB/etcdlock.fence.", clientv3.WithPrefix())
			return err
		}},
		{"queue a key before B's waiter", func(ctx context.Context) error {
			_, err := aRaw.Put(ctx, "teamB/"+name+"/0", "")
			return err
		}},
		{"revoke B's lease", func(ctx context.Context) error {
			_, err := aRaw.Revoke(ctx, sb.Lease())
			return err
		}},
		{"put a key of its own on B's lease", func(ctx context.Context) error {
			_, err := aRaw.Put(ctx, "teamA/x", "", clientv3.WithLease(sb.Lease()))
			return err
		}},
		{"watch B's queue", func(ctx context.Context) error {
			for resp := range aRaw.Watch(clientv3.WithRequireLeader(ctx), "teamB/"+name+"/", clientv3.WithPrefix()) {
				if err := resp.Err(); err != nil {
					if strings.HasSuffix(err.Error(), rpctypes.ErrPermissionDenied.Error()) {
						return rpctypes.ErrPermissionDenied // a watch's refusal comes as text
					}
					return err
				}
			}
			return ctx.Err()
		}},
	}
	for _, at := range attempts {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := at.call(actx)
		cancel()
		if !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Errorf("A: %s: got %v, want permission denied", at.what, err)
		}
	}

	if after := keyRevisions(t, root, "teamB/"); !maps.Equal(after, before) {
		t.Errorf("B's keys after A's tries: got %v, want %v", after, before)
	}
	if keys := keysUnder(t, root, ""); len(keys) != len(before)+len(keyRevisions(t, root, "teamA/")) {
		t.Errorf("keys outside the two teams' prefixes: every key is %q", keys)
	}
	for what, done := range map[string]<-chan struct{}{"Mutex": mb.Done(), "read lock": rb.Done(), "permit": pb.Done()} {
		if isClosed(done) {
			t.Errorf("B's %s: Done closed while A tried", what)
		}
	}
	if err := etcdlock.CheckFence(ctx, b, pb.Fence()); err != nil {
		t.Errorf("B's permit: CheckFence: %v", err)
	}
	if n, err := etcdlock.ReadLimit(ctx, b, pool); err != nil || n != 1 {
		t.Errorf("B's limit: got %d, %v, want 1", n, err)
	}
	select {
	case err := <-waiter.locked:
		t.Fatalf("B's waiter: Lock returned %v while B held the lock", err)
	default:
	}
	if err := mb.UnlockContext(ctx); err != nil {
		t.Fatalf("B: unlock: %v", err)
	}
	select {
	case err := <-waiter.locked:
		if err != nil {
			t.Fatalf("B's waiter: %v", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("B's waiter: no lock after B let go")
	}
	if err := ma.UnlockContext(ctx); err != nil {
		t.Errorf("A: unlock in its own namespace: %v", err)
	}
	if err := rb.RUnlockContext(ctx); err != nil {
		t.Errorf("B: read unlock: %v", err)
	}
	release(t, pb)
}

// TestTenantsIdleSession: what a team's role cannot keep from another. etcd
// lets any user revoke a lease with no key attached, and attach a key of
// its own to it (its check, etcd-io/etcd#8031, is on the keys the lease
// has): a Session that holds nothing can be ended by another team that
// guesses its lease ID. Its next lock returns ErrSessionExpired, and a
// Session made WithRenewal takes a new lease and locks on it; a Session that
// holds a lock has its key on the lease, and the revoke is refused (as
// TestTenantsKeptApart shows).
func TestTenantsIdleSession(t *testing.T) {
	testflags.Parallel(t)
	env := authServer(t, prefixPermission("teamA/", clientv3.PermissionType(clientv3.PermReadWrite)))
	root, eps := env.root, env.root.Endpoints()
	addTenant(t, root, "teamb", "teambpw", "teamB/")
	b := tenantClient(t, eps, "teamb", "teambpw", "teamB/")
	aRaw := env.user
	ctx := testContext(t)

	plain := newSession(t, b, etcdlock.WithTTL(time.Minute))
	if _, err := aRaw.Revoke(ctx, plain.Lease()); err != nil {
		t.Fatalf("A revokes B's idle lease: got %v, want etcd to allow it", err)
	}
	if err := etcdlock.NewMutex(plain, "jobs/nightly").LockContext(ctx); !errors.Is(err, etcdlock.ErrSessionExpired) {
		t.Errorf("B locks on the Session whose lease A revoked: got %v, want ErrSessionExpired", err)
	}

	renewing := newSession(t, b, etcdlock.WithTTL(time.Minute), etcdlock.WithRenewal())
	first := renewing.Lease()
	if _, err := aRaw.Revoke(ctx, first); err != nil {
		t.Fatalf("A revokes B's idle lease: got %v, want etcd to allow it", err)
	}
	// A lock under way on the revoked lease returns ErrSessionExpired (as
	// WithRenewal says); the next ones wait for the new lease.
	m := etcdlock.NewMutex(renewing, "jobs/nightly")
	var err error
	eventually(t, "B's lock on a new lease", func() bool {
		err = m.LockContext(ctx)
		return !errors.Is(err, etcdlock.ErrSessionExpired)
	})
	if err != nil {
		t.Fatalf("B locks on a Session made WithRenewal whose lease A revoked: %v", err)
	}
	if renewing.Lease() == first {
		t.Errorf("the Session kept the revoked lease %x", first)
	}
	if _, err := aRaw.Revoke(ctx, renewing.Lease()); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("A revokes B's lease while B holds a lock on it: got %v, want permission denied", err)
	}
	if err := m.UnlockContext(ctx); err != nil {
		t.Errorf("B unlocks: %v", err)
	}
}
