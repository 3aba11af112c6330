package etcdlock_test

// 1.0.0's calls under the roles that sufficed for each in 1.0.0 (commit
// 795d145: its README's Permissions section and permissions_test.go), run
// against this version: a role that is enough for a call in 1.0.0 is
// enough for that call in every 1.x. The lock calls run under the lock's
// own prefix alone too, the role concurrency.Mutex and etcdctl lock need.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// A v1Call is one of 1.0.0's calls, run on the lock name through a client
// of the role under test; root is a client of etcd's root, for what the
// call needs of others (a holder to follow, a holder to wait for).
type v1Call struct {
	call string
	// read: 1.0.0's role for it was read on name/; else read and write on
	// name/ and etcdlock.fence.
	read bool
	run  func(ctx context.Context, t *testing.T, c, root *clientv3.Client, name string) error
}

// v1Roles are the roles each call runs under: 1.0.0's, and, for a call
// that locks, the lock's own prefix alone.
var v1Roles = []struct {
	user  string
	perms func(name string, read bool) []permission
}{
	{"v1", func(name string, read bool) []permission {
		if read {
			return []permission{prefixPermission(name+"/", clientv3.PermissionType(clientv3.PermRead))}
		}
		rw := clientv3.PermissionType(clientv3.PermReadWrite)
		return []permission{prefixPermission(name+"/", rw), prefixPermission("etcdlock.fence.", rw)}
	}},
	{"prefix", func(name string, read bool) []permission {
		if read {
			return nil // the same as 1.0.0's
		}
		return []permission{prefixPermission(name+"/", clientv3.PermissionType(clientv3.PermReadWrite))}
	}},
}

// TestV1Roles runs each of 1.0.0's calls under each role, and judges in
// etcd: the call succeeds, and leaves no key under name/.
func TestV1Roles(t *testing.T) {
	testflags.Parallel(t)
	env := authServer(t)
	calls := v1Calls()
	users := map[string]*clientv3.Client{}
	for _, role := range v1Roles {
		var perms []permission
		for _, c := range calls {
			perms = append(perms, role.perms(v1Name(role.user, c.call), c.read)...)
		}
		if len(perms) > 0 {
			users[role.user] = env.addUser(t, role.user, perms)
		}
	}
	for _, role := range v1Roles {
		for _, c := range calls {
			if role.perms("", c.read) == nil {
				continue
			}
			t.Run(role.user+"/"+c.call, func(t *testing.T) {
				name := v1Name(role.user, c.call)
				ctx := testContext(t)
				if err := c.run(ctx, t, users[role.user], env.root, name); err != nil {
					t.Fatalf("%s under %s's role: %v", c.call, role.user, err)
				}
				if keys := lockKeys(t, env.root, name); len(keys) != 0 {
					t.Errorf("keys after %s: got %q, want none", c.call, keys)
				}
			})
		}
	}
}

// v1Name returns the lock name of call under the role of user.
func v1Name(user, call string) string {
	return "v1/" + user + "/" + strings.NewReplacer("/", "-", " ", "-").Replace(call)
}

// heldIn returns an error unless etcd holds key, as a holder of name.
func heldIn(ctx context.Context, root *clientv3.Client, name, key string) error {
	q, err := etcdlock.Inspect(ctx, root, name)
	if err != nil {
		return err
	}
	for _, e := range q {
		if e.Key == key && e.Holds {
			return nil
		}
	}
	return fmt.Errorf("%s does not hold %s: the queue is %+v", key, name, q)
}

// session returns a Session of c, closed by t.Cleanup.
func session(t *testing.T, c *clientv3.Client, opts ...etcdlock.SessionOption) *etcdlock.Session {
	return newSession(t, c, opts...)
}

// lockUnlock locks l, checks in etcd that key holds, and unlocks it.
func lockUnlock(ctx context.Context, root *clientv3.Client, name string, lock, unlock func(context.Context) error, key func() string) error {
	if err := lock(ctx); err != nil {
		return err
	}
	if err := heldIn(ctx, root, name, key()); err != nil {
		return err
	}
	return unlock(ctx)
}

// contended has a holder of root hold name while wait waits, and releases
// it: wait must then return.
func contended(ctx context.Context, t *testing.T, root *clientv3.Client, name string, wait func(context.Context) error) error {
	holder := etcdlock.NewMutex(session(t, root), name)
	if err := holder.LockContext(ctx); err != nil {
		return err
	}
	done := result(func() error { return wait(ctx) })
	if !blocked(done, 100*time.Millisecond) {
		_ = holder.UnlockContext(ctx)
		return fmt.Errorf("did not wait for the holder: %v", <-done)
	}
	if err := holder.UnlockContext(ctx); err != nil {
		return err
	}
	return waitErr(t, done)
}

func v1Calls() []v1Call {
	mutex := func(call string, do func(ctx context.Context, t *testing.T, c *clientv3.Client, m *etcdlock.Mutex, root *clientv3.Client, name string) error) v1Call {
		return v1Call{call: call, run: func(ctx context.Context, t *testing.T, c, root *clientv3.Client, name string) error {
			return do(ctx, t, c, etcdlock.NewMutex(session(t, c), name), root, name)
		}}
	}
	rw := func(call string, do func(ctx context.Context, t *testing.T, c *clientv3.Client, rw *etcdlock.RWMutex, root *clientv3.Client, name string) error) v1Call {
		return v1Call{call: call, run: func(ctx context.Context, t *testing.T, c, root *clientv3.Client, name string) error {
			return do(ctx, t, c, etcdlock.NewRWMutex(session(t, c), name), root, name)
		}}
	}
	sem := func(call string, do func(ctx context.Context, t *testing.T, c *clientv3.Client, sem *etcdlock.Semaphore, root *clientv3.Client, name string) error) v1Call {
		return v1Call{call: call, run: func(ctx context.Context, t *testing.T, c, root *clientv3.Client, name string) error {
			return do(ctx, t, c, etcdlock.NewSemaphore(session(t, c), name, 2), root, name)
		}}
	}
	multi := func(call string, do func(ctx context.Context, t *testing.T, c *clientv3.Client, m *etcdlock.MultiMutex, root *clientv3.Client, name string) error) v1Call {
		return v1Call{call: call, run: func(ctx context.Context, t *testing.T, c, root *clientv3.Client, name string) error {
			return do(ctx, t, c, etcdlock.NewMultiMutex(session(t, c), name+"/a", name+"/b"), root, name+"/a")
		}}
	}
	try := func(ok bool, err error) error {
		if err == nil && !ok {
			return errors.New("not acquired")
		}
		return err
	}
	permit := func(ctx context.Context, root *clientv3.Client, name string, p *etcdlock.Permit, err error) error {
		if err != nil {
			return err
		}
		if err := heldIn(ctx, root, name, p.Key()); err != nil {
			return err
		}
		return p.Release(ctx)
	}
	lead := func(ctx context.Context, root *clientv3.Client, name string) func(context.Context) error {
		return func(context.Context) error {
			l, err := etcdlock.LeaderOf(ctx, root, name)
			if err != nil {
				return err
			}
			return heldIn(ctx, root, name, l.Key)
		}
	}
	// reading has a holder of root hold name while read reads.
	reading := func(call string, read func(ctx context.Context, c *clientv3.Client, name, key string) error) v1Call {
		return v1Call{call: call, read: true, run: func(ctx context.Context, t *testing.T, c, root *clientv3.Client, name string) error {
			holder := etcdlock.NewSemaphore(session(t, root), name, 2)
			if !strings.Contains(call, "Semaphore") {
				m := etcdlock.NewMutex(session(t, root), name)
				if err := m.LockContext(ctx); err != nil {
					return err
				}
				defer m.UnlockContext(ctx)
				return read(ctx, c, name, m.Key())
			}
			p, err := holder.Acquire(ctx)
			if err != nil {
				return err
			}
			defer p.Release(ctx)
			return read(ctx, c, name, p.Key())
		}}
	}
	inspect := func(ctx context.Context, c *clientv3.Client, name, key string) error {
		q, err := etcdlock.Inspect(ctx, c, name)
		switch {
		case err != nil:
			return err
		case len(q) != 1 || q[0].Key != key || !q[0].Holds:
			return fmt.Errorf("got %+v, want %s holding", q, key)
		}
		return nil
	}
	return []v1Call{
		mutex("Mutex.Lock", func(ctx context.Context, t *testing.T, c *clientv3.Client, m *etcdlock.Mutex, root *clientv3.Client, name string) error {
			m.Lock()
			err := heldIn(ctx, root, name, m.Key())
			m.Unlock()
			return err
		}),
		mutex("Mutex.LockContext", func(ctx context.Context, t *testing.T, c *clientv3.Client, m *etcdlock.Mutex, root *clientv3.Client, name string) error {
			return lockUnlock(ctx, root, name, m.LockContext, m.UnlockContext, m.Key)
		}),
		mutex("Mutex.TryLock", func(ctx context.Context, t *testing.T, c *clientv3.Client, m *etcdlock.Mutex, root *clientv3.Client, name string) error {
			return lockUnlock(ctx, root, name, func(context.Context) error { return try(m.TryLock(), nil) }, m.UnlockContext, m.Key)
		}),
		mutex("Mutex.TryLockFor", func(ctx context.Context, t *testing.T, c *clientv3.Client, m *etcdlock.Mutex, root *clientv3.Client, name string) error {
			return lockUnlock(ctx, root, name, func(ctx context.Context) error { return try(m.TryLockFor(ctx, time.Second)) }, m.UnlockContext, m.Key)
		}),
		mutex("Mutex.LockContext, contended", func(ctx context.Context, t *testing.T, c *clientv3.Client, m *etcdlock.Mutex, root *clientv3.Client, name string) error {
			return contended(ctx, t, root, name, func(ctx context.Context) error {
				return lockUnlock(ctx, root, name, m.LockContext, m.UnlockContext, m.Key)
			})
		}),
		mutex("Mutex.Do", func(ctx context.Context, t *testing.T, c *clientv3.Client, m *etcdlock.Mutex, root *clientv3.Client, name string) error {
			return m.Do(ctx, func(ctx context.Context) error {
				h, ok := etcdlock.HoldFrom(ctx)
				if !ok {
					return errors.New("HoldFrom: no hold in f's context")
				}
				return heldIn(ctx, root, name, h.Key)
			})
		}),
		mutex("Mutex.IsOwner, Done, Held, HoldCount, Token", func(ctx context.Context, t *testing.T, c *clientv3.Client, m *etcdlock.Mutex, root *clientv3.Client, name string) error {
			if err := m.LockContext(ctx); err != nil {
				return err
			}
			defer m.UnlockContext(ctx)
			if h, ok := m.Held(); !ok || h.Token != m.Token() || m.HoldCount() != 1 || isClosed(m.Done()) {
				return fmt.Errorf("the hold: got %+v, %d holds, want the lock's", h, m.HoldCount())
			}
			// IsOwner in a Txn of the caller's, under the same role.
			txn, err := c.Txn(ctx).If(m.IsOwner()).Then(clientv3.OpGet(m.Key())).Commit()
			if err != nil || !txn.Succeeded {
				return fmt.Errorf("a Txn guarded by IsOwner: got %v, %v", txn, err)
			}
			return nil
		}),
		rw("RWMutex.Lock", func(ctx context.Context, t *testing.T, c *clientv3.Client, rw *etcdlock.RWMutex, root *clientv3.Client, name string) error {
			rw.Lock()
			err := heldIn(ctx, root, name, rw.Key())
			rw.Unlock()
			return err
		}),
		rw("RWMutex.RLock", func(ctx context.Context, t *testing.T, c *clientv3.Client, rw *etcdlock.RWMutex, root *clientv3.Client, name string) error {
			rw.RLock()
			err := heldIn(ctx, root, name, rw.Key())
			rw.RUnlock()
			return err
		}),
		rw("RWMutex.LockContext", func(ctx context.Context, t *testing.T, c *clientv3.Client, rw *etcdlock.RWMutex, root *clientv3.Client, name string) error {
			return lockUnlock(ctx, root, name, rw.LockContext, rw.UnlockContext, rw.Key)
		}),
		rw("RWMutex.RLockContext", func(ctx context.Context, t *testing.T, c *clientv3.Client, rw *etcdlock.RWMutex, root *clientv3.Client, name string) error {
			return lockUnlock(ctx, root, name, rw.RLockContext, rw.RUnlockContext, rw.Key)
		}),
		rw("RWMutex.TryLock, TryRLock", func(ctx context.Context, t *testing.T, c *clientv3.Client, rw *etcdlock.RWMutex, root *clientv3.Client, name string) error {
			if err := lockUnlock(ctx, root, name, func(context.Context) error { return try(rw.TryLock(), nil) }, rw.UnlockContext, rw.Key); err != nil {
				return err
			}
			return lockUnlock(ctx, root, name, func(context.Context) error { return try(rw.TryRLock(), nil) }, rw.RUnlockContext, rw.Key)
		}),
		rw("RWMutex.TryLockFor, TryRLockFor", func(ctx context.Context, t *testing.T, c *clientv3.Client, rw *etcdlock.RWMutex, root *clientv3.Client, name string) error {
			if err := lockUnlock(ctx, root, name, func(ctx context.Context) error { return try(rw.TryLockFor(ctx, time.Second)) }, rw.UnlockContext, rw.Key); err != nil {
				return err
			}
			return lockUnlock(ctx, root, name, func(ctx context.Context) error { return try(rw.TryRLockFor(ctx, time.Second)) }, rw.RUnlockContext, rw.Key)
		}),
		rw("RWMutex.RLocker", func(ctx context.Context, t *testing.T, c *clientv3.Client, rw *etcdlock.RWMutex, root *clientv3.Client, name string) error {
			l := rw.RLocker()
			l.Lock()
			err := heldIn(ctx, root, name, rw.Key())
			l.Unlock()
			return err
		}),
		sem("Semaphore.Acquire", func(ctx context.Context, t *testing.T, c *clientv3.Client, sem *etcdlock.Semaphore, root *clientv3.Client, name string) error {
			p, err := sem.Acquire(ctx)
			return permit(ctx, root, name, p, err)
		}),
		sem("Semaphore.TryAcquire", func(ctx context.Context, t *testing.T, c *clientv3.Client, sem *etcdlock.Semaphore, root *clientv3.Client, name string) error {
			p, err := sem.TryAcquire(ctx, 0)
			return permit(ctx, root, name, p, err)
		}),
		sem("Semaphore.Acquire, contended", func(ctx context.Context, t *testing.T, c *clientv3.Client, sem *etcdlock.Semaphore, root *clientv3.Client, name string) error {
			others := etcdlock.NewSemaphore(session(t, root), name, 2)
			first, err := others.Acquire(ctx)
			if err != nil {
				return err
			}
			second, err := others.Acquire(ctx)
			if err != nil {
				return err
			}
			done := result(func() error { p, err := sem.Acquire(ctx); return permit(ctx, root, name, p, err) })
			if !blocked(done, 100*time.Millisecond) {
				return fmt.Errorf("a third permit at limit 2: %v", <-done)
			}
			if err := first.Release(ctx); err != nil {
				return err
			}
			err = waitErr(t, done)
			return errors.Join(err, second.Release(ctx))
		}),
		multi("MultiMutex.LockContext", func(ctx context.Context, t *testing.T, c *clientv3.Client, m *etcdlock.MultiMutex, root *clientv3.Client, name string) error {
			return lockUnlock(ctx, root, name, m.LockContext, m.UnlockContext, func() string {
				h, _ := m.Held()
				return h.Keys()[0]
			})
		}),
		multi("MultiMutex.TryLock, TryLockFor", func(ctx context.Context, t *testing.T, c *clientv3.Client, m *etcdlock.MultiMutex, root *clientv3.Client, name string) error {
			key := func() string { h, _ := m.Held(); return h.Keys()[0] }
			if err := lockUnlock(ctx, root, name, func(context.Context) error { return try(m.TryLock(), nil) }, m.UnlockContext, key); err != nil {
				return err
			}
			return lockUnlock(ctx, root, name, func(ctx context.Context) error { return try(m.TryLockFor(ctx, time.Second)) }, m.UnlockContext, key)
		}),
		{call: "NewSession WithRenewal, WithIdentity; Close", run: func(ctx context.Context, t *testing.T, c, root *clientv3.Client, name string) error {
			s, err := etcdlock.NewSession(c, etcdlock.WithRenewal(), etcdlock.WithIdentity("v1"), etcdlock.WithTTL(2*time.Second))
			if err != nil {
				return err
			}
			m := etcdlock.NewMutex(s, name)
			if err := m.LockContext(ctx); err != nil {
				return err
			}
			if err := heldIn(ctx, root, name, m.Key()); err != nil {
				return err
			}
			return s.Close() // revokes the lease: the key goes with it
		}},
		{call: "NewSession WithLease", run: func(ctx context.Context, t *testing.T, c, root *clientv3.Client, name string) error {
			g, err := c.Grant(ctx, 5)
			if err != nil {
				return err
			}
			m := etcdlock.NewMutex(session(t, c, etcdlock.WithLease(g.ID)), name)
			return lockUnlock(ctx, root, name, m.LockContext, m.UnlockContext, m.Key)
		}},
		{call: "Lead", run: func(ctx context.Context, t *testing.T, c, root *clientv3.Client, name string) error {
			return leadOnce(ctx, func(ctx context.Context, f func(context.Context) error) error {
				return etcdlock.Lead(ctx, c, name, f, etcdlock.WithTTL(2*time.Second))
			}, lead(ctx, root, name))
		}},
		{call: "Session.Lead", run: func(ctx context.Context, t *testing.T, c, root *clientv3.Client, name string) error {
			s := session(t, c)
			return leadOnce(ctx, func(ctx context.Context, f func(context.Context) error) error { return s.Lead(ctx, name, f) }, lead(ctx, root, name))
		}},
		reading("Inspect", inspect),
		reading("Inspect of a Semaphore's queue", inspect),
		reading("LeaderOf", func(ctx context.Context, c *clientv3.Client, name, key string) error {
			l, err := etcdlock.LeaderOf(ctx, c, name)
			if err == nil && l.Key != key {
				err = fmt.Errorf("got %s, want %s", l.Key, key)
			}
			return err
		}),
		reading("Follow of a Semaphore's queue", func(ctx context.Context, c *clientv3.Client, name, key string) error {
			fctx, stop := context.WithCancel(ctx)
			defer stop()
			for q := range etcdlock.Follow(fctx, c, name) {
				if len(q) == 1 && q[0].Key == key && q[0].Holds {
					return nil
				}
			}
			return errors.New("Follow ended without the holder")
		}),
		reading("FollowLeader", func(ctx context.Context, c *clientv3.Client, name, key string) error {
			fctx, stop := context.WithCancel(ctx)
			defer stop()
			for l := range etcdlock.FollowLeader(fctx, c, name) {
				if l.Key == key {
					return nil
				}
			}
			return errors.New("FollowLeader ended without the holder")
		}),
	}
}

// leadOnce runs lead (Lead, or Session.Lead) with an f that runs check
// once it leads, then ends the lead, and returns check's error: Lead runs
// f, term after term, until its context ends, so f ends it.
func leadOnce(ctx context.Context, lead func(ctx context.Context, f func(context.Context) error) error, check func(context.Context) error) error {
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	checked := errors.New("f never ran")
	err := lead(lctx, func(fctx context.Context) error {
		checked = check(fctx)
		cancel()
		return nil
	})
	if !errors.Is(err, context.Canceled) || ctx.Err() != nil {
		return fmt.Errorf("lead: %w", err)
	}
	return checked
}
