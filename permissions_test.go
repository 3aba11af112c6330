package etcdlock_test

// Locks under etcd's authentication: a request etcd refuses was not applied,
// so it is an error every time and leaves nothing to clean up or wait for;
// and the permissions docs/api.md gives a lock are enough.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

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
func authClient(t *testing.T, endpoints []string, user, password string, opts ...grpc.DialOption) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		Username: user, Password: password, DialOptions: opts,
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

// TestLockPermissions: a role with read and write on name/ alone (what
// concurrency.Mutex and etcdctl lock need), or with the fence keys
// (etcdlock.fence.) besides, as 1.0.0 asked, and nothing else (no read of
// the Semaphore's limit record), is enough for every primitive of the lock
// name: to lock, to unlock, to clean up after a lost reply, to renew the
// Session's lease, and to close the Session. With the fence, the lease
// keeps its fence key; without (or with read on it alone), it has no key
// left.
func TestLockPermissions(t *testing.T) {
	testflags.Parallel(t)
	rw := clientv3.PermissionType(clientv3.PermReadWrite)
	for _, role := range []struct {
		name   string
		fenced bool
		fence  []permission // on the fence keys
	}{
		{"prefix", false, nil},
		{"1.0.0", true, []permission{prefixPermission("etcdlock.fence.", rw)}},
		// Compared, and refused only when the cleanup writes it.
		{"fence read", false, []permission{prefixPermission("etcdlock.fence.", clientv3.PermissionType(clientv3.PermRead))}},
	} {
		t.Run(role.name, func(t *testing.T) {
			testflags.Parallel(t)
			name := "perm/" + t.Name()
			perms := append([]permission{prefixPermission(name+"/", rw)}, role.fence...)
			env := authServer(t, perms...)
			root := env.root
			fault := &txnFault{}
			c := authClient(t, env.user.Endpoints(), "locker", "lockerpw", grpc.WithChainUnaryInterceptor(fault.intercept))
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
				// The first lock learns what the role refuses (the fence,
				// the limit record); the next loses its reply.
				if err := l.Lock(ctx); err != nil {
					t.Fatalf("%s: lock: got %v, want nil", o.name, err)
				}
				if err := l.Unlock(ctx); err != nil {
					t.Fatalf("%s: unlock: got %v, want nil", o.name, err)
				}
				fault.arm(0, 1, loseReply)
				if err := l.Lock(ctx); err == nil {
					t.Fatalf("%s: lock with its reply lost: got nil, want an error", o.name)
				}
				fault.arm(0, 0, nil)
				if err := l.Lock(ctx); err != nil {
					t.Fatalf("%s: lock: got %v, want nil", o.name, err)
				}
				if keys := lockKeys(t, root, name); len(keys) == 0 {
					t.Errorf("%s: keys while held: got none, want the hold's", o.name)
				}
				if err := l.Unlock(ctx); err != nil {
					t.Fatalf("%s: unlock: got %v, want nil", o.name, err)
				}
			}
			want := []string{}
			if role.fenced {
				want = []string{"etcdlock.fence." + fmt.Sprintf("%x", s.Lease())}
			}
			if keys := leaseKeys(t, root, s.Lease()); !slices.Equal(keys, want) {
				t.Errorf("keys on the lease: got %q, want %q", keys, want)
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
		})
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

// addUser adds to env's etcd the user user (password user+"pw") with a role
// of its own, named after it, that has perms, and returns a client of it,
// with opts.
func (env authEnv) addUser(t *testing.T, user string, perms []permission, opts ...grpc.DialOption) *clientv3.Client {
	t.Helper()
	ctx := testContext(t)
	steps := []func() error{
		func() error { _, err := env.root.RoleAdd(ctx, user); return err },
		func() error { _, err := env.root.UserAdd(ctx, user, user+"pw"); return err },
		func() error { _, err := env.root.UserGrantRole(ctx, user, user); return err },
	}
	for _, p := range perms {
		steps = append(steps, func() error {
			_, err := env.root.RoleGrantPermission(ctx, user, p.key, p.end, p.perm)
			return err
		})
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("user %s, step %d: %v", user, i, err)
		}
	}
	return authClient(t, env.root.Endpoints(), user, user+"pw", opts...)
}

// A latePut holds back the next Txn that puts a key under its prefix, once
// armed: its caller gives up (its context cancelled), and the Txn reaches
// etcd only when apply is called, as a request held up in the network or in
// a member's queue.
type latePut struct {
	prefix string
	mu     sync.Mutex
	cancel context.CancelFunc // armed: the caller's context
	held   func() error       // the Txn held back, to send
}

func (l *latePut) arm(cancel context.CancelFunc) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cancel = cancel
}

func (l *latePut) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	r, ok := req.(*pb.TxnRequest)
	l.mu.Lock()
	cancel := l.cancel
	if ok && cancel != nil && slices.ContainsFunc(r.Success, func(op *pb.RequestOp) bool {
		return op.GetRequestPut() != nil && strings.HasPrefix(string(op.GetRequestPut().Key), l.prefix)
	}) {
		l.cancel = nil
		again := proto.Clone(r)
		l.held = func() error {
			ctx, stop := context.WithTimeout(context.Background(), testTimeout)
			defer stop()
			return invoker(ctx, method, again, new(pb.TxnResponse), cc, opts...)
		}
		l.mu.Unlock()
		cancel()
		<-ctx.Done()
		return status.FromContextError(ctx.Err()).Err()
	}
	l.mu.Unlock()
	return invoker(ctx, method, req, reply, cc, opts...)
}

// apply sends the Txn held back, and returns its error.
func (l *latePut) apply(t *testing.T) error {
	t.Helper()
	l.mu.Lock()
	held := l.held
	l.held = nil
	l.mu.Unlock()
	if held == nil {
		t.Fatal("no Txn was held back")
	}
	return held()
}

// TestLatePutWithoutFence: the one guarantee a role without the fence key
// weakens. A put that etcd applies after its caller gave up and after its
// cleanup ran (DESIGN: a request applied late) fails under a role that may
// write the fence, and leaves nothing; under a role with the lock's prefix
// alone it succeeds, and its key stays in etcd, on the Session's lease,
// holding the lock for nobody. What the library still promises then,
// judged in etcd: no second holder (another Session is refused the lock),
// and the key goes with its lease: the Session's next lock of the name
// adopts it, with the key's own token, and its unlock deletes it; a Close
// would revoke it.
func TestLatePutWithoutFence(t *testing.T) {
	testflags.Parallel(t)
	name := "perm/" + t.Name()
	rw := clientv3.PermissionType(clientv3.PermReadWrite)
	env := authServer(t, prefixPermission(name+"/", rw))
	other := newSession(t, env.user)
	for _, role := range []struct {
		name  string
		perms []permission
		late  bool // the late put succeeds
	}{
		{"fenced", []permission{prefixPermission(name+"/", rw), prefixPermission("etcdlock.fence.", rw)}, false},
		{"prefix", []permission{prefixPermission(name+"/", rw)}, true},
	} {
		t.Run(role.name, func(t *testing.T) {
			late := &latePut{prefix: name + "/"}
			s := newSession(t, env.addUser(t, role.name, role.perms, grpc.WithChainUnaryInterceptor(late.intercept)))
			m := etcdlock.NewMutex(s, name)
			ctx := testContext(t)
			// The first lock learns what the role refuses.
			if err := m.LockContext(ctx); err != nil {
				t.Fatalf("lock: %v", err)
			}
			if err := m.UnlockContext(ctx); err != nil {
				t.Fatalf("unlock: %v", err)
			}
			lctx, cancel := context.WithCancel(ctx)
			late.arm(cancel)
			if err := m.LockContext(lctx); !errors.Is(err, context.Canceled) {
				t.Fatalf("lock given up: got %v, want context.Canceled", err)
			}
			if keys := lockKeys(t, env.root, name); len(keys) != 0 {
				t.Fatalf("keys after the lock gave up: got %q, want none", keys)
			}
			lateErr := late.apply(t)
			keys := lockKeys(t, env.root, name)
			if !role.late {
				if lateErr != nil || len(keys) != 0 {
					t.Fatalf("the late put: got %v and keys %q, want it applied, and fenced: no key", lateErr, keys)
				}
				return
			}
			if lateErr != nil || len(keys) != 1 {
				t.Fatalf("the late put: got %v and keys %q, want one key left", lateErr, keys)
			}
			q, err := etcdlock.Inspect(ctx, env.root, name)
			if err != nil || len(q) != 1 || !q[0].Holds || q[0].Lease != s.Lease() {
				t.Fatalf("the queue after the late put: got %+v (%v), want one holder, of the Session's lease", q, err)
			}
			if ok, err := etcdlock.NewMutex(other, name).TryLockFor(ctx, 0); ok || err != nil {
				t.Fatalf("another Session's TryLock beside the key left: got %v, %v, want false, nil", ok, err)
			}
			if err := m.LockContext(ctx); err != nil {
				t.Fatalf("the Session's next lock: %v", err)
			}
			if m.Token() != q[0].Token {
				t.Errorf("the next lock's token: got %d, want the key left's, %d", m.Token(), q[0].Token)
			}
			if err := m.UnlockContext(ctx); err != nil {
				t.Fatalf("unlock: %v", err)
			}
			if keys := lockKeys(t, env.root, name); len(keys) != 0 {
				t.Errorf("keys after the unlock: got %q, want none", keys)
			}
			if ok, err := etcdlock.NewMutex(other, name).TryLockFor(ctx, 0); !ok || err != nil {
				t.Errorf("another Session's TryLock after the unlock: got %v, %v, want true, nil", ok, err)
			}
		})
	}
}

// TestSemaphoreWithoutLimitRecord: a role that served a Semaphore in 1.0.0
// (read and write on name/ and the fence keys, no read of the limit record
// etcdlock.limit.name) acquires and releases permits, and a role with read
// on name/ alone inspects its queue (and a holder learns that one waits);
// both count the holders with the limit
// the Semaphore was made with, as 1.0.0 did, which is exact while no limit
// is recorded. The weaker case, once one is (SetLimit): a Semaphore that
// cannot read the record counts with its own limit, so that a record lower
// than that is not kept by it (here 2 permits held under a record of 1);
// the holders stay within its own limit, and a Semaphore that reads the
// record waits.
func TestSemaphoreWithoutLimitRecord(t *testing.T) {
	testflags.Parallel(t)
	name := "perm/" + t.Name()
	rw := clientv3.PermissionType(clientv3.PermReadWrite)
	env := authServer(t, prefixPermission(name+"/", rw), prefixPermission("etcdlock.fence.", rw))
	reader := env.addUser(t, "reader", []permission{prefixPermission(name+"/", clientv3.PermissionType(clientv3.PermRead))})
	ctx := testContext(t)
	sem := func(c *clientv3.Client) *etcdlock.Semaphore { return etcdlock.NewSemaphore(newSession(t, c), name, 2) }
	a, err := sem(env.user).Acquire(ctx)
	if err != nil {
		t.Fatalf("Acquire without read on %s: %v", queue.LimitKey(name), err)
	}
	b, err := sem(env.user).TryAcquire(ctx, 0)
	if err != nil {
		t.Fatalf("TryAcquire without read on %s: %v", queue.LimitKey(name), err)
	}
	c := acquireInGoroutine(ctx, sem(env.user))
	eventually(t, "the third queued", func() bool { return len(lockKeys(t, env.root, name)) == 3 })
	if !waiting(c, 200*time.Millisecond) {
		t.Fatal("a third permit at limit 2")
	}
	for _, client := range []*clientv3.Client{reader, env.root} {
		q, err := etcdlock.Inspect(ctx, client, name)
		if err != nil || len(q) != 3 || !q[0].Holds || !q[1].Holds || q[2].Holds {
			t.Fatalf("Inspect: got %+v (%v), want 2 holders and a waiter", q, err)
		}
	}

	if _, ok := closedWithin(b.Waiting(), testTimeout); !ok {
		t.Error("Waiting of a holder with a waiter behind it: not closed")
	}
	// What needs the record asks for it, by name.
	if _, err := etcdlock.ReadLimit(ctx, env.user, name); !errors.Is(err, rpctypes.ErrPermissionDenied) || !strings.Contains(err.Error(), "read on "+name+"/ and on "+queue.LimitKey(name)) {
		t.Errorf("ReadLimit without read on the record: got %v, want permission denied naming it", err)
	}
	if err := etcdlock.SetLimit(ctx, env.user, name, 1); !errors.Is(err, rpctypes.ErrPermissionDenied) || !strings.Contains(err.Error(), queue.LimitKey(name)) {
		t.Errorf("SetLimit without the record: got %v, want permission denied naming it", err)
	}
	if err := etcdlock.SetLimit(ctx, env.root, name, 1); err != nil {
		t.Fatal(err)
	}
	release(t, a)
	// By the record, b (kept) holds alone; c counts with its own limit.
	third := admitted(t, c)
	d := acquireInGoroutine(ctx, sem(env.root))
	eventually(t, "the fourth queued", func() bool { return len(lockKeys(t, env.root, name)) == 3 })
	if !waiting(d, 200*time.Millisecond) {
		t.Fatal("a Semaphore that reads the record got a permit beside 2 held under a record of 1")
	}
	q, err := etcdlock.Inspect(ctx, env.root, name)
	if err != nil || len(q) != 3 || !q[0].Holds || q[1].Holds || q[2].Holds {
		t.Fatalf("Inspect by the record: got %+v (%v), want b alone holding", q, err)
	}
	release(t, b)
	release(t, third)
	release(t, admitted(t, d))
}

// TestRoleRegranted: a role refused the fence key and the limit record for
// a while (an operator changing its grants) gets them back: a Session's
// acquisitions go without them while refused, and compare the fence and
// read the record again a TTL after the grants came back, on the same
// Session. Judged by the Txns etcd is sent.
func TestRoleRegranted(t *testing.T) {
	testflags.Parallel(t)
	name := "regrant/" + t.Name()
	rw, ro := clientv3.PermissionType(clientv3.PermReadWrite), clientv3.PermissionType(clientv3.PermRead)
	fencePerm, recordPerm := prefixPermission("etcdlock.fence.", rw), permission{queue.LimitKey(name), "", ro}
	env := authServer(t, prefixPermission(name+"/", rw), fencePerm, recordPerm)
	var mu sync.Mutex
	var fenced, recorded bool // the last acquisition's Txn compared the fence, read the record
	watch := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if txn, ok := req.(*pb.TxnRequest); ok && len(txn.Success) > 0 && txn.Success[0].GetRequestPut() != nil {
			mu.Lock()
			fenced, recorded = false, false
			for _, c := range txn.Compare {
				fenced = fenced || strings.HasPrefix(string(c.Key), "etcdlock.fence.")
			}
			for _, op := range txn.Success {
				if r := op.GetRequestRange(); r != nil && string(r.Key) == queue.LimitKey(name) {
					recorded = true
				}
			}
			mu.Unlock()
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	c, err := clientv3.New(clientv3.Config{
		Endpoints: env.user.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		Username: "locker", Password: "lockerpw",
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(watch)},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const ttl = 2 * time.Second
	sem := etcdlock.NewSemaphore(newSession(t, c, etcdlock.WithTTL(ttl)), name, 2)
	ctx := testContext(t)
	acquire := func(want bool, when string) {
		t.Helper()
		p, err := sem.Acquire(ctx)
		if err != nil {
			t.Fatalf("%s: Acquire: %v", when, err)
		}
		release(t, p)
		mu.Lock()
		defer mu.Unlock()
		if fenced != want || recorded != want {
			t.Errorf("%s: the acquisition compared the fence %v, read the record %v; want %v", when, fenced, recorded, want)
		}
	}
	acquire(true, "granted")
	for _, p := range []permission{fencePerm, recordPerm} {
		if _, err := env.root.RoleRevokePermission(ctx, env.role, p.key, p.end); err != nil {
			t.Fatal(err)
		}
	}
	acquire(false, "refused")
	for _, p := range []permission{fencePerm, recordPerm} {
		if _, err := env.root.RoleGrantPermission(ctx, env.role, p.key, p.end, p.perm); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(ttl)
	acquire(true, "granted again, a TTL on")
}

// TestRefusalReadLost: under a role on the lock's prefix alone, the read
// that tells which key etcd refused (the fence) loses its reply. That read
// tells nothing: the call returns etcd's refusal, and the next call reads
// again, finds the fence refused and locks. Were the lost read taken for
// "readable", every call would be refused for a TTL.
func TestRefusalReadLost(t *testing.T) {
	testflags.Parallel(t)
	name := "refusalread/" + t.Name()
	env := authServer(t, prefixPermission(name+"/", clientv3.PermissionType(clientv3.PermReadWrite)))
	var lost atomic.Int32
	intercept := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if txn, ok := req.(*pb.TxnRequest); ok && len(txn.Compare) == 0 && len(txn.Success) > 0 {
			reads := true
			for _, op := range txn.Success {
				r := op.GetRequestRange()
				reads = reads && r != nil && strings.HasPrefix(string(r.Key), "etcdlock.fence.")
			}
			if reads && lost.Add(1) == 1 {
				_ = invoker(ctx, method, req, reply, cc, opts...)
				return status.Error(codes.Unavailable, "test: reply lost")
			}
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	c, err := clientv3.New(clientv3.Config{
		Endpoints: env.user.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		Username: "locker", Password: "lockerpw",
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(intercept)},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := etcdlock.NewMutex(newSession(t, c, etcdlock.WithTTL(time.Minute)), name)
	ctx := testContext(t)
	if err := m.LockContext(ctx); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("lock, the read after the refusal lost: got %v, want permission denied", err)
	}
	if lost.Load() == 0 {
		t.Fatal("no read of the fence was sent after the refusal")
	}
	if err := m.LockContext(ctx); err != nil {
		t.Fatalf("the next lock: got %v, want nil (the fence found refused, done without)", err)
	}
	if err := m.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
	if keys := lockKeys(t, env.root, name); len(keys) != 0 {
		t.Errorf("keys left: %q", keys)
	}
}
