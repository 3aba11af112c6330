package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// multiLock is a MultiMutex as a lock of the family.
type multiLock struct {
	m *etcdlock.MultiMutex
	s *etcdlock.Session
}

// multiNested is what openMulti adds to a name for its second name.
const multiNested = "/m"

// openMulti opens a MultiMutex of name and of a name nested under it: both
// keys lie under name's prefix.
func openMulti(s *etcdlock.Session, name string) famLock {
	return multiLock{etcdlock.NewMultiMutex(s, name+multiNested, name), s}
}

func (l multiLock) Lock(ctx context.Context) error { return l.m.LockContext(ctx) }
func (l multiLock) TryLock(ctx context.Context, wait time.Duration) (bool, error) {
	return l.m.TryLockFor(ctx, wait)
}
func (l multiLock) Unlock(ctx context.Context) error { return l.m.UnlockContext(ctx) }
func (l multiLock) Token() int64                     { return l.m.Token() }
func (l multiLock) Done() <-chan struct{}            { return l.m.Done() }

// IsOwner: the first key is there, at the token.
func (l multiLock) IsOwner() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(keyOf(l.m.Names()[0], l.s.Lease())), "=", l.m.Token())
}

// funcLocker is a lock given by its lock and unlock functions, as a locker.
type funcLocker struct{ lock, unlock func(context.Context) error }

func (l funcLocker) Lock(ctx context.Context) error            { return l.lock(ctx) }
func (l funcLocker) TryLock(ctx context.Context) (bool, error) { return false, errors.New("no try") }
func (l funcLocker) Unlock(ctx context.Context) error          { return l.unlock(ctx) }
func (l funcLocker) Key() string                               { return "" }

// multiSetup starts an etcd, and returns a client of it, a Session on it,
// the test's context and n lock names of the test's own.
func multiSetup(t *testing.T, n int) (*clientv3.Client, *etcdlock.Session, context.Context, []string) {
	_, client := startServer(t)
	return client, newSession(t, client), testContext(t), multiNames(t, n)
}

// lockedMulti returns a MultiMutex of names on s, held by the calling
// goroutine.
func lockedMulti(t *testing.T, s *etcdlock.Session, names ...string) *etcdlock.MultiMutex {
	t.Helper()
	m := etcdlock.NewMultiMutex(s, names...)
	if err := m.LockContext(testContext(t)); err != nil {
		t.Fatalf("LockContext: got %v, want nil", err)
	}
	return m
}

// multiNames returns n lock names of the test's own.
func multiNames(t *testing.T, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = lockName(t) + "/" + string(rune('a'+i))
	}
	return names
}

// multiKeys returns, per name, the keys of lease under the name's prefix
// (every key for clientv3.NoLease), judged in etcd.
func multiKeys(t *testing.T, client *clientv3.Client, names []string, lease clientv3.LeaseID) [][]string {
	t.Helper()
	keys := make([][]string, len(names))
	for i, name := range names {
		keys[i] = keysOfLease(t, client, name, lease)
	}
	return keys
}

// noKeys fails the test if any of the names has a key of lease in etcd.
func noKeys(t *testing.T, client *clientv3.Client, names []string, lease clientv3.LeaseID, when string) {
	t.Helper()
	for i, keys := range multiKeys(t, client, names, lease) {
		if len(keys) > 0 {
			t.Errorf("%s: keys of %q: got %q, want none", when, names[i], keys)
		}
	}
}

// unlockLeavesNothing ends the calling goroutine's last hold of m, and
// checks in etcd that no key of names is left.
func unlockLeavesNothing(t *testing.T, client *clientv3.Client, m *etcdlock.MultiMutex, names []string) {
	t.Helper()
	if err := m.UnlockContext(testContext(t)); err != nil {
		t.Fatalf("the last UnlockContext: got %v, want nil", err)
	}
	noKeys(t, client, names, clientv3.NoLease, "after the last UnlockContext")
}

// createRevisions returns the create revision of each key, judged in etcd
// (0 for a key that is not there).
func createRevisions(t *testing.T, client *clientv3.Client, keys ...string) []int64 {
	t.Helper()
	revs := make([]int64, len(keys))
	for i, key := range keys {
		resp, err := client.Get(testContext(t), key)
		if err != nil {
			t.Fatalf("get %q: %v", key, err)
		}
		if len(resp.Kvs) == 1 {
			revs[i] = resp.Kvs[0].CreateRevision
		}
	}
	return revs
}

func TestMultiLockUnlock(t *testing.T) {
	testflags.Parallel(t)
	client, s, ctx, names := multiSetup(t, 3)
	m := etcdlock.NewMultiMutex(s, names[2], names[0], names[1], names[0])
	if got := m.Names(); !slices.Equal(got, names) {
		t.Fatalf("Names: got %q, want %q", got, names)
	}
	if m.Token() != 0 || !isClosed(m.Done()) {
		t.Fatalf("before Lock: Token %d, Done closed %v; want 0, true", m.Token(), isClosed(m.Done()))
	}
	if err := m.LockContext(ctx); err != nil {
		t.Fatalf("LockContext: got %v, want nil", err)
	}
	keys := make([]string, len(names))
	for i, name := range names {
		keys[i] = keyOf(name, s.Lease())
		if got := lockKeys(t, client, name); !slices.Equal(got, keys[i:i+1]) {
			t.Errorf("keys of %q in etcd: got %q, want %q", name, got, keys[i:i+1])
		}
	}
	revs := createRevisions(t, client, keys...)
	for i, rev := range revs {
		if rev != m.Token() {
			t.Errorf("create revision of %q: got %d, want the token %d", keys[i], rev, m.Token())
		}
	}
	for _, name := range names {
		if got := etcdlock.NewMutex(s, name).Token(); got != m.Token() {
			t.Errorf("Mutex(%q).Token: got %d, want %d", name, got, m.Token())
		}
		// Each name's Mutex names its own key, and guards it.
		mu := etcdlock.NewMutex(s, name)
		if got := mu.Key(); got != keyOf(name, s.Lease()) {
			t.Errorf("Mutex(%q).Key: got %q, want %q", name, got, keyOf(name, s.Lease()))
		}
		if r, err := client.Txn(ctx).If(mu.IsOwner()).Then(clientv3.OpGet(keyOf(name, s.Lease()))).Commit(); err != nil || !r.Succeeded {
			t.Errorf("Mutex(%q).IsOwner while the MultiMutex holds: %v, %v; want true", name, r, err)
		}
		q, err := etcdlock.Inspect(ctx, client, name)
		if err != nil || len(q) != 1 || q[0].Key != keyOf(name, s.Lease()) || !q[0].Holds || q[0].Token != m.Token() || q[0].Kind != etcdlock.KindMutex {
			t.Errorf("Inspect(%q): got %+v, %v; want one holding Mutex key at the token", name, q, err)
		}
	}
	if isClosed(m.Done()) {
		t.Fatal("Done closed while held")
	}
	done := m.Done()
	if err := m.UnlockContext(ctx); err != nil {
		t.Fatalf("UnlockContext: got %v, want nil", err)
	}
	noKeys(t, client, names, clientv3.NoLease, "after UnlockContext")
	if !isClosed(done) || m.Token() != 0 {
		t.Errorf("after UnlockContext: Done closed %v, Token %d; want true, 0", isClosed(done), m.Token())
	}
	if err := m.UnlockContext(ctx); !errors.Is(err, etcdlock.ErrNotHeld) {
		t.Errorf("second UnlockContext: got %v, want ErrNotHeld", err)
	}
	// Again, with the sync.Locker methods.
	m.Lock()
	if m.Token() <= 0 {
		t.Errorf("Token after Lock: got %d, want > 0", m.Token())
	}
	m.Unlock()
	noKeys(t, client, names, clientv3.NoLease, "after Unlock")
}

func TestMultiReentrant(t *testing.T) {
	testflags.Parallel(t)
	client, s, ctx, names := multiSetup(t, 2)
	m := lockedMulti(t, s, names...)
	token := m.Token()
	// The same names, another handle, another order: the same lock.
	other := etcdlock.NewMultiMutex(s, names[1], names[0])
	if err := other.LockContext(ctx); err != nil {
		t.Fatalf("LockContext again: got %v, want nil", err)
	}
	if !other.TryLock() {
		t.Fatal("TryLock by the holder: got false, want true")
	}
	if other.Token() != token {
		t.Errorf("Token through the other handle: got %d, want %d", other.Token(), token)
	}
	for range 2 {
		if err := m.UnlockContext(ctx); err != nil {
			t.Fatalf("UnlockContext: %v", err)
		}
	}
	if got := multiKeys(t, client, names, s.Lease()); len(got[0]) != 1 || len(got[1]) != 1 {
		t.Errorf("keys with one hold left: got %q, want one per name", got)
	}
	unlockLeavesNothing(t, client, m, names)
}

// TestMultiExcludes: a Mutex, a concurrency.Mutex and a MultiMutex of
// another Session on one of the names exclude a MultiMutex, and are
// excluded by it; a try writes nothing while one name is held.
func TestMultiExcludes(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	names := multiNames(t, 3)
	s := newSession(t, client)
	m := etcdlock.NewMultiMutex(s, names...)
	other := newSession(t, startClient(t, client))
	up := newUpstreamSession(t, client, 10)

	holders := map[string]struct {
		lock, unlock func(context.Context) error
	}{
		"Mutex": {etcdlock.NewMutex(other, names[1]).LockContext, etcdlock.NewMutex(other, names[1]).UnlockContext},
		"concurrency.Mutex": func() struct{ lock, unlock func(context.Context) error } {
			um := concurrency.NewMutex(up, names[2])
			return struct{ lock, unlock func(context.Context) error }{um.Lock, um.Unlock}
		}(),
		"MultiMutex": {etcdlock.NewMultiMutex(other, names[0], "x"+names[0]).LockContext, etcdlock.NewMultiMutex(other, names[0], "x"+names[0]).UnlockContext},
	}
	for what, h := range holders {
		if err := h.lock(ctx); err != nil {
			t.Fatalf("%s: lock: %v", what, err)
		}
		if m.TryLock() {
			t.Fatalf("%s holds: TryLock got true, want false", what)
		}
		noKeys(t, client, names, s.Lease(), what+" holds, after TryLock")
		if ok, err := m.TryLockFor(ctx, 200*time.Millisecond); ok || err != nil {
			t.Fatalf("%s holds: TryLockFor got %v, %v; want false, nil", what, ok, err)
		}
		noKeys(t, client, names, s.Lease(), what+" holds, after TryLockFor")
		w := lockInGoroutine(t, ctx, funcLocker{m.LockContext, m.UnlockContext})
		if !blocked(w.locked, 300*time.Millisecond) {
			t.Fatalf("%s holds: LockContext returned, want it to wait", what)
		}
		if err := h.unlock(ctx); err != nil {
			t.Fatalf("%s: unlock: %v", what, err)
		}
		if err := waitErr(t, w.locked); err != nil {
			t.Fatalf("%s released: LockContext got %v, want nil", what, err)
		}
		// Now the MultiMutex holds: the other waits.
		hw := lockInGoroutine(t, ctx, funcLocker{h.lock, h.unlock})
		if !blocked(hw.locked, 300*time.Millisecond) {
			t.Fatalf("MultiMutex holds: %s's lock returned, want it to wait", what)
		}
		if err := w.Release(); err != nil {
			t.Fatalf("MultiMutex's UnlockContext: %v", err)
		}
		if err := waitErr(t, hw.locked); err != nil {
			t.Fatalf("MultiMutex released: %s's lock got %v, want nil", what, err)
		}
		if err := hw.Release(); err != nil {
			t.Fatalf("%s: unlock: %v", what, err)
		}
	}
	noKeys(t, client, names, clientv3.NoLease, "at the end")
}

// TestMultiSameSession: two goroutines of one Session, with overlapping
// names, exclude each other; a goroutine waiting for its local turn writes
// nothing.
func TestMultiSameSession(t *testing.T) {
	testflags.Parallel(t)
	client, s, ctx, names := multiSetup(t, 3)
	first := etcdlock.NewMultiMutex(s, names[0], names[1])
	second := etcdlock.NewMultiMutex(s, names[1], names[2])
	if err := first.LockContext(ctx); err != nil {
		t.Fatalf("LockContext: %v", err)
	}
	if second.TryLock() {
		t.Fatal("TryLock of an overlapping MultiMutex by another goroutine: got true, want false")
	}
	w := lockInGoroutine(t, ctx, funcLocker{second.LockContext, second.UnlockContext})
	if !blocked(w.locked, 300*time.Millisecond) {
		t.Fatal("overlapping MultiMutex: LockContext returned, want it to wait")
	}
	if got := lockKeys(t, client, names[2]); len(got) != 0 {
		t.Errorf("keys of %q while the second waits for its turn: got %q, want none", names[2], got)
	}
	if err := first.UnlockContext(ctx); err != nil {
		t.Fatalf("UnlockContext: %v", err)
	}
	if err := waitErr(t, w.locked); err != nil {
		t.Fatalf("LockContext after the release: got %v, want nil", err)
	}
	if got := lockKeys(t, client, names[0]); len(got) != 0 {
		t.Errorf("keys of %q: got %q, want none", names[0], got)
	}
	// second holds in another goroutine: this one's unlock is not its own.
	if err := second.UnlockContext(ctx); !errors.Is(err, etcdlock.ErrNotHeld) {
		t.Errorf("UnlockContext by another goroutine: got %v, want ErrNotHeld", err)
	}
	if err := w.Release(); err != nil {
		t.Errorf("UnlockContext by the holder: got %v, want nil", err)
	}
	noKeys(t, client, names, clientv3.NoLease, "at the end")
}

func TestMultiWouldDeadlock(t *testing.T) {
	testflags.Parallel(t)
	client, s, ctx, names := multiSetup(t, 2)
	m := etcdlock.NewMultiMutex(s, names...)
	mu := etcdlock.NewMutex(s, names[1])

	// A Mutex held, then the MultiMutex asked.
	if err := mu.LockContext(ctx); err != nil {
		t.Fatalf("Mutex.LockContext: %v", err)
	}
	if err := m.LockContext(ctx); !errors.Is(err, etcdlock.ErrWouldDeadlock) {
		t.Errorf("MultiMutex.LockContext while holding a Mutex of one name: got %v, want ErrWouldDeadlock", err)
	}
	if ok, err := m.TryLockFor(ctx, time.Second); ok || !errors.Is(err, etcdlock.ErrWouldDeadlock) {
		t.Errorf("TryLockFor: got %v, %v; want false, ErrWouldDeadlock", ok, err)
	}
	assertPanics(t, "Lock", "LockContext", m.Lock)
	if got := lockKeys(t, client, names[0]); len(got) != 0 {
		t.Errorf("keys of %q: got %q, want none", names[0], got)
	}
	if err := mu.UnlockContext(ctx); err != nil {
		t.Fatalf("Mutex.UnlockContext: %v", err)
	}

	// The MultiMutex held, then a Mutex of one name asked.
	if err := m.LockContext(ctx); err != nil {
		t.Fatalf("MultiMutex.LockContext: %v", err)
	}
	if err := mu.LockContext(ctx); !errors.Is(err, etcdlock.ErrWouldDeadlock) {
		t.Errorf("Mutex.LockContext while holding the MultiMutex: got %v, want ErrWouldDeadlock", err)
	}
	assertPanics(t, "Mutex.Lock", "LockContext", mu.Lock)
	if err := mu.UnlockContext(ctx); !errors.Is(err, etcdlock.ErrNotHeld) {
		t.Errorf("Mutex.UnlockContext of a name held through the MultiMutex: got %v, want ErrNotHeld", err)
	}
	// Another MultiMutex sharing a name.
	if err := etcdlock.NewMultiMutex(s, names[0], "x"+names[0]).LockContext(ctx); !errors.Is(err, etcdlock.ErrWouldDeadlock) {
		t.Errorf("another MultiMutex sharing a name: got %v, want ErrWouldDeadlock", err)
	}
	unlockLeavesNothing(t, client, m, names)
}

func TestMultiBadInput(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	s := newSession(t, client)
	ctx := testContext(t)
	for _, tc := range []struct {
		what string
		m    *etcdlock.MultiMutex
		want error
	}{
		{"nil Session", etcdlock.NewMultiMutex(nil, "a"), etcdlock.ErrInvalidArgument},
		{"no names", etcdlock.NewMultiMutex(s), etcdlock.ErrInvalidArgument},
		{"an empty name", etcdlock.NewMultiMutex(s, "a", ""), etcdlock.ErrInvalidName},
		{"nil MultiMutex", nil, etcdlock.ErrInvalidArgument},
	} {
		if err := tc.m.LockContext(ctx); !errors.Is(err, tc.want) {
			t.Errorf("%s: LockContext got %v, want %v", tc.what, err, tc.want)
		}
		if ok, err := tc.m.TryLockFor(ctx, time.Second); ok || !errors.Is(err, tc.want) {
			t.Errorf("%s: TryLockFor got %v, %v; want false, %v", tc.what, ok, err, tc.want)
		}
		if err := tc.m.UnlockContext(ctx); !errors.Is(err, tc.want) {
			t.Errorf("%s: UnlockContext got %v, want %v", tc.what, err, tc.want)
		}
		if tc.m.TryLock() || tc.m.Token() != 0 || !isClosed(tc.m.Done()) {
			t.Errorf("%s: TryLock, Token, Done: want false, 0, closed", tc.what)
		}
		assertPanics(t, tc.what+": Lock", "LockContext", tc.m.Lock)
	}
	var nilCtx context.Context // a nil context is the bad input under test
	if err := etcdlock.NewMultiMutex(s, "a").LockContext(nilCtx); !errors.Is(err, etcdlock.ErrInvalidArgument) {
		t.Errorf("nil context: got %v, want ErrInvalidArgument", err)
	}
}

// TestMultiCancelLeavesNothing: a LockContext whose ctx ends while it waits
// leaves no key in any queue, and the queue moves on.
func TestMultiCancelLeavesNothing(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	names := multiNames(t, 3)
	s := newSession(t, client)
	holder := newSession(t, startClient(t, client))
	mu := etcdlock.NewMutex(holder, names[2])
	if err := mu.LockContext(ctx); err != nil {
		t.Fatalf("Mutex.LockContext: %v", err)
	}
	m := etcdlock.NewMultiMutex(s, names...)
	wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if err := m.LockContext(wctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("LockContext with a deadline: got %v, want DeadlineExceeded", err)
	}
	noKeys(t, client, names, s.Lease(), "after the deadline")
	cctx, cancel := context.WithCancel(ctx)
	waiting := result(func() error { return m.LockContext(cctx) })
	eventually(t, "the MultiMutex's keys", func() bool { return len(keysOfLease(t, client, names[0], s.Lease())) == 1 })
	cancel()
	if err := waitErr(t, waiting); !errors.Is(err, context.Canceled) {
		t.Fatalf("LockContext cancelled: got %v, want Canceled", err)
	}
	noKeys(t, client, names, s.Lease(), "after the cancel")
	if err := mu.UnlockContext(ctx); err != nil {
		t.Fatalf("Mutex.UnlockContext: %v", err)
	}
	if !m.TryLock() {
		t.Fatal("TryLock once free: got false, want true")
	}
	m.Unlock()
}

// TestMultiDoneOnDeletedKey: Done closes when one key of the hold is
// deleted by hand, and the release deletes the others, saying the hold was
// lost.
func TestMultiDoneOnDeletedKey(t *testing.T) {
	testflags.Parallel(t)
	client, s, ctx, names := multiSetup(t, 3)
	m := lockedMulti(t, s, names...)
	done := m.Done()
	if _, ok := closedWithin(done, 300*time.Millisecond); ok {
		t.Fatal("Done closed while every key is there")
	}
	if _, err := client.Delete(ctx, keyOf(names[1], s.Lease())); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, ok := closedWithin(done, 5*time.Second); !ok {
		t.Fatal("Done still open 5 s after a key was deleted")
	}
	if err := m.UnlockContext(ctx); !errors.Is(err, etcdlock.ErrLockLost) {
		t.Errorf("UnlockContext after the loss: got %v, want ErrLockLost", err)
	}
	noKeys(t, client, names, clientv3.NoLease, "after UnlockContext")
}

// TestMultiWaiterRequeued: a key of a waiting MultiMutex deleted by hand
// makes it queue all its keys again, at one new revision.
func TestMultiWaiterRequeued(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	names := multiNames(t, 2)
	holder := newSession(t, startClient(t, client))
	mu := etcdlock.NewMutex(holder, names[1])
	if err := mu.LockContext(ctx); err != nil {
		t.Fatalf("Mutex.LockContext: %v", err)
	}
	s := newSession(t, client)
	m := etcdlock.NewMultiMutex(s, names...)
	waiting := result(func() error { return m.LockContext(ctx) })
	eventually(t, "the MultiMutex's keys", func() bool { return len(keysOfLease(t, client, names[1], s.Lease())) == 1 })
	before := createRevisions(t, client, keyOf(names[0], s.Lease()))[0]
	if _, err := client.Delete(ctx, keyOf(names[1], s.Lease())); err != nil {
		t.Fatalf("delete: %v", err)
	}
	eventually(t, "the keys queued again", func() bool {
		revs := createRevisions(t, client, keyOf(names[0], s.Lease()), keyOf(names[1], s.Lease()))
		return revs[0] > before && revs[0] == revs[1]
	})
	if err := mu.UnlockContext(ctx); err != nil {
		t.Fatalf("Mutex.UnlockContext: %v", err)
	}
	if err := waitErr(t, waiting); err != nil {
		t.Fatalf("LockContext: got %v, want nil", err)
	}
	revs := createRevisions(t, client, keyOf(names[0], s.Lease()), keyOf(names[1], s.Lease()))
	// The hold is the process's, as a Mutex's: another goroutine sees its
	// token too, but holds nothing itself.
	if m.Token() != revs[0] {
		t.Errorf("Token in another goroutine: got %d, want the hold's %d", m.Token(), revs[0])
	}
	if h, ok := m.Held(); ok {
		t.Errorf("Held in another goroutine: got %+v, want none", h)
	}
	if revs[0] != revs[1] || revs[0] <= before {
		t.Errorf("create revisions: got %v, want one revision after %d", revs, before)
	}
}

// The deadlock test of issue 23: Sessions that each take random subsets of
// the same names at once never wait in a cycle, where the same workload
// taken lock by lock does.

// multiRun is what a run of the workload saw.
type multiRun struct {
	holds, timeouts atomic.Int64
}

// multiWorkload runs workers Sessions (each on a client of its own) that
// each, until the run's time is up, take a random subset of 2 to 3 of
// names, hold it a little, and release it: at once with a MultiMutex, or
// lock by lock with Mutexes in a random order (lockByLock). Each
// acquisition may take at most wait. At each hold it judges in etcd that
// each name's oldest key is the holder's, at the hold's token, in one read;
// and in memory that no two holders of a name overlap.
func multiWorkload(t *testing.T, client *clientv3.Client, names []string, workers int, d, wait time.Duration, lockByLock bool, seed uint64) *multiRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d+wait+testTimeout)
	defer cancel()
	var run multiRun
	holders := make([]atomic.Int32, len(names))
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for w := range workers {
		s := newSession(t, startClient(t, client))
		rng := rand.New(rand.NewPCG(seed, uint64(w)))
		wg.Go(func() {
			for time.Now().Before(end) && !t.Failed() {
				idx := rng.Perm(len(names))[:2+rng.IntN(2)]
				picked := make([]string, len(idx))
				for i, j := range idx {
					picked[i] = names[j]
				}
				actx, cancel := context.WithTimeout(ctx, wait)
				unlock, token, err := multiTake(actx, s, picked, lockByLock)
				cancel()
				switch {
				case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
					run.timeouts.Add(1)
					if !lockByLock {
						t.Errorf("worker %d: taking %q: no hold after %v", w, picked, wait)
					}
					continue
				case err != nil:
					t.Errorf("worker %d: taking %q: %v", w, picked, err)
					return
				}
				for _, j := range idx {
					if n := holders[j].Add(1); n != 1 {
						t.Errorf("%q: %d holders at once", names[j], n)
					}
				}
				if !lockByLock {
					if err := firstInEvery(ctx, s, picked, token); err != nil {
						t.Errorf("worker %d: %v", w, err)
					}
				}
				run.holds.Add(1)
				time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
				for _, j := range idx {
					holders[j].Add(-1)
				}
				if err := unlock(ctx); err != nil {
					t.Errorf("worker %d: releasing %q: %v", w, picked, err)
					return
				}
			}
		})
	}
	wg.Wait()
	return &run
}

// multiTake takes the names on s, at once or lock by lock (releasing what
// it took when it fails), and returns the release and the token (at once:
// the shared token).
func multiTake(ctx context.Context, s *etcdlock.Session, names []string, lockByLock bool) (func(context.Context) error, int64, error) {
	if !lockByLock {
		m := etcdlock.NewMultiMutex(s, names...)
		if err := m.LockContext(ctx); err != nil {
			return nil, 0, err
		}
		return m.UnlockContext, m.Token(), nil
	}
	var taken []*etcdlock.Mutex
	unlock := func(ctx context.Context) error {
		var errs []error
		for _, m := range slices.Backward(taken) {
			errs = append(errs, m.UnlockContext(ctx))
		}
		return errors.Join(errs...)
	}
	for _, name := range names {
		m := etcdlock.NewMutex(s, name)
		if err := m.LockContext(ctx); err != nil {
			_ = unlock(context.WithoutCancel(ctx))
			return nil, 0, err
		}
		taken = append(taken, m)
	}
	return unlock, 0, nil
}

// firstInEvery judges in etcd, in one read, that the key of s for each
// name is the oldest of its queue, created at token.
func firstInEvery(ctx context.Context, s *etcdlock.Session, names []string, token int64) error {
	var ops []clientv3.Op
	for _, name := range names {
		ops = append(ops, clientv3.OpGet(name+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)))
	}
	resp, err := s.Client().Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return fmt.Errorf("read the queues: %w", err)
	}
	for i, name := range names {
		kvs := resp.Responses[i].GetResponseRange().Kvs
		if want := keyOf(name, s.Lease()); len(kvs) != 1 || string(kvs[0].Key) != want || kvs[0].CreateRevision != token {
			return fmt.Errorf("holder of %q at revision %d: got %v, want %s at %d", name, resp.Header.Revision, kvs, want, token)
		}
	}
	return nil
}

// multiRunFor is how long the deadlock test's workload runs: 10 s in the
// long run, 3 s in the quick suite; ETCDLOCK_MULTI_LONG sets it (1: 10 minutes, or a
// duration such as 30s, the run docs/benchmarks.md reports).
func multiRunFor(t *testing.T) time.Duration {
	if os.Getenv("ETCDLOCK_MULTI_LONG") == "" && !testflags.Long() {
		return 3 * time.Second
	}
	return faultsFor(t, "ETCDLOCK_MULTI_LONG", 10*time.Second)
}

// TestMultiNoDeadlock: Sessions that take random subsets of the same names
// at once all get every hold, with one holder per name at a time.
func TestMultiNoDeadlock(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	names := multiNames(t, 5)
	d := multiRunFor(t)
	run := multiWorkload(t, client, names, 4, d, 20*time.Second, false, 23)
	t.Logf("MultiMutex: %d holds in %v by 4 Sessions over %d names, %d acquisitions past 20 s", run.holds.Load(), d, len(names), run.timeouts.Load())
	if run.holds.Load() == 0 {
		t.Fatal("no hold at all")
	}
	for _, name := range names {
		if keys := lockKeys(t, client, name); len(keys) != 0 {
			t.Errorf("keys of %q after the run: got %q, want none", name, keys)
		}
	}
}

// TestMultiLockByLockDeadlocks: the same names taken lock by lock in two
// orders wait in a cycle until a timeout breaks it, judged in etcd; taken
// at once, in the same orders, they never do.
func TestMultiLockByLockDeadlocks(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	names := multiNames(t, 2)
	orders := [][]string{{names[0], names[1]}, {names[1], names[0]}}
	sessions := []*etcdlock.Session{newSession(t, startClient(t, client)), newSession(t, startClient(t, client))}

	// Lock by lock, with a barrier between the first lock and the second:
	// each holds the lock the other waits for.
	const wait = 3 * time.Second
	var barrier sync.WaitGroup
	barrier.Add(2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			first := etcdlock.NewMutex(sessions[i], orders[i][0])
			if err := first.LockContext(ctx); err != nil {
				errs[i] = err
				barrier.Done()
				return
			}
			defer func() { _ = first.UnlockContext(ctx) }()
			barrier.Done()
			barrier.Wait()
			wctx, cancel := context.WithTimeout(ctx, wait)
			defer cancel()
			second := etcdlock.NewMutex(sessions[i], orders[i][1])
			if errs[i] = second.LockContext(wctx); errs[i] == nil {
				_ = second.UnlockContext(ctx)
			}
		})
	}
	// The cycle, in etcd: in each queue, one Session holds and the other
	// waits, crosswise.
	eventually(t, "both waiting", func() bool {
		for _, name := range names {
			if len(lockKeys(t, client, name)) != 2 {
				return false
			}
		}
		return true
	})
	for i, name := range names {
		q, err := etcdlock.Inspect(ctx, client, name)
		if err != nil || len(q) != 2 || q[0].Lease != sessions[i].Lease() || q[1].Lease != sessions[1-i].Lease() {
			t.Fatalf("queue of %q: got %+v, %v; want Session %d holding and %d waiting", name, q, err, i, 1-i)
		}
	}
	wg.Wait()
	timedOut := 0
	for i, err := range errs {
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			timedOut++
		case err != nil:
			t.Fatalf("lock by lock, Session %d: %v", i, err)
		}
	}
	if timedOut == 0 {
		t.Fatal("lock by lock, in two orders: both got both locks, want a wait in a cycle until a timeout")
	}
	t.Logf("lock by lock: %d of 2 timed out after %v in a cycle", timedOut, wait)

	// At once, in the same two orders, started together many times: every
	// acquisition holds.
	for round := range 20 {
		var start sync.WaitGroup
		start.Add(1)
		for i := range 2 {
			wg.Go(func() {
				start.Wait()
				m := etcdlock.NewMultiMutex(sessions[i], orders[i]...)
				wctx, cancel := context.WithTimeout(ctx, wait)
				defer cancel()
				if err := m.LockContext(wctx); err != nil {
					t.Errorf("round %d, Session %d: LockContext: %v", round, i, err)
					return
				}
				if err := m.UnlockContext(ctx); err != nil {
					t.Errorf("round %d, Session %d: UnlockContext: %v", round, i, err)
				}
			})
		}
		start.Done()
		wg.Wait()
	}

	// The random workload, lock by lock, for comparison: timeouts counted,
	// not asserted (a cycle needs an unlucky interleaving).
	if testflags.Long() {
		run := multiWorkload(t, client, multiNames(t, 5), 4, 3*time.Second, time.Second, true, 23)
		t.Logf("lock by lock, random orders: %d holds, %d acquisitions timed out after 1 s", run.holds.Load(), run.timeouts.Load())
	}
}

// TestMultiObserved: an observer gets one event of each kind per
// acquisition, hold and release, of primitive KindMulti, with the names and
// the shared token.
func TestMultiObserved(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	var mu sync.Mutex
	var events []etcdlock.Event
	s := newSession(t, client, etcdlock.WithObserver(etcdlock.ObserverFunc(func(e etcdlock.Event) {
		if e.Primitive == etcdlock.KindMulti {
			mu.Lock()
			events = append(events, e)
			mu.Unlock()
		}
	})))
	names := multiNames(t, 2)
	m := lockedMulti(t, s, names[1], names[0])
	token := m.Token()
	unlockLeavesNothing(t, client, m, names)
	want := []etcdlock.EventKind{etcdlock.AcquireStarted, etcdlock.AcquireEnded, etcdlock.HoldEnded, etcdlock.Released}
	var got []etcdlock.EventKind
	eventually(t, "the events", func() bool {
		mu.Lock()
		defer mu.Unlock()
		got = got[:0]
		for _, e := range events {
			got = append(got, e.Kind)
		}
		return len(events) >= len(want)
	})
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(got, want) {
		t.Fatalf("events: got %v, want %v", got, want)
	}
	for _, e := range events {
		if e.Lock != names[0]+","+names[1] {
			t.Errorf("%s: Lock %q, want %q", e.Kind, e.Lock, names[0]+","+names[1])
		}
		if e.Kind != etcdlock.AcquireStarted && (e.Token != token || e.Key != keyOf(names[0], s.Lease())) {
			t.Errorf("%s: Key %q, Token %d; want %q, %d", e.Kind, e.Key, e.Token, keyOf(names[0], s.Lease()), token)
		}
	}
}
