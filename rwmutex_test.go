package etcdlock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	recipe "go.etcd.io/etcd/client/v3/experimental/recipes"
	"google.golang.org/grpc"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// rlocker and wlocker adapt an RWMutex's read and write sides to the
// locker interface of lockInGoroutine.
type rlocker struct{ rw *etcdlock.RWMutex }

func (l rlocker) Lock(ctx context.Context) error            { return l.rw.RLockContext(ctx) }
func (l rlocker) TryLock(ctx context.Context) (bool, error) { return l.rw.TryRLockFor(ctx, 0) }
func (l rlocker) Unlock(ctx context.Context) error          { return l.rw.RUnlockContext(ctx) }
func (l rlocker) Key() string                               { return "" }

type wlocker struct{ rw *etcdlock.RWMutex }

func (l wlocker) Lock(ctx context.Context) error            { return l.rw.LockContext(ctx) }
func (l wlocker) TryLock(ctx context.Context) (bool, error) { return l.rw.TryLockFor(ctx, 0) }
func (l wlocker) Unlock(ctx context.Context) error          { return l.rw.UnlockContext(ctx) }
func (l wlocker) Key() string                               { return "" }

// TestRWMutexReadersShare: readers of several sessions hold together; a
// writer waits for all of them.
func TestRWMutexReadersShare(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	var readers []*etcdlock.RWMutex
	for range 3 {
		rw := etcdlock.NewRWMutex(newSession(t, client), name)
		if err := rw.RLockContext(ctx); err != nil {
			t.Fatalf("RLockContext while others read: %v", err)
		}
		readers = append(readers, rw)
	}
	w := lockInGoroutine(t, ctx, wlocker{etcdlock.NewRWMutex(newSession(t, client), name)})
	for i, rw := range readers {
		if !blocked(w.locked, 100*time.Millisecond) {
			t.Fatalf("writer got the lock with %d readers left", len(readers)-i)
		}
		if err := rw.RUnlockContext(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := waitErr(t, w.locked); err != nil {
		t.Fatalf("writer after the readers left: %v", err)
	}
	if err := w.Release(); err != nil {
		t.Fatal(err)
	}
}

// TestRWMutexFIFO: a reader that arrives after a queued writer waits behind
// it, and a try of it returns false and writes nothing: a writer is never
// passed by readers.
func TestRWMutexFIFO(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	r1 := etcdlock.NewRWMutex(newSession(t, client), name)
	if err := r1.RLockContext(ctx); err != nil {
		t.Fatal(err)
	}
	w := lockInGoroutine(t, ctx, wlocker{etcdlock.NewRWMutex(newSession(t, client), name)})
	eventually(t, "the writer queued", func() bool { return len(lockKeys(t, client, name+"/write")) == 1 })

	r2 := etcdlock.NewRWMutex(newSession(t, client), name)
	before := revision(t, client)
	if r2.TryRLock() {
		t.Fatal("TryRLock behind a queued writer: got true, want false")
	}
	if w := wroteSince(t, client, before); len(w) > 0 {
		t.Errorf("writes after the failed TryRLock: %v, want none", w)
	}
	late := lockInGoroutine(t, ctx, rlocker{r2})
	if !blocked(late.locked, 200*time.Millisecond) {
		t.Fatal("a reader arriving after a queued writer got the lock before it")
	}
	if err := r1.RUnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
	if err := waitErr(t, w.locked); err != nil {
		t.Fatal(err)
	}
	if !blocked(late.locked, 200*time.Millisecond) {
		t.Fatal("the late reader got the lock while the writer holds it")
	}
	if err := w.Release(); err != nil {
		t.Fatal(err)
	}
	if err := waitErr(t, late.locked); err != nil {
		t.Fatal(err)
	}
	if err := late.Release(); err != nil {
		t.Fatal(err)
	}
}

// TestRWMutexWriterNotStarved: readers that keep the read lock held at every
// moment, taking turns, do not keep a writer out (the unfair lock of
// Redisson #5379 would).
func TestRWMutexWriterNotStarved(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var reads atomic.Int64
	for i := range 3 {
		rw := etcdlock.NewRWMutex(newSession(t, client), name)
		wg.Go(func() {
			time.Sleep(time.Duration(i) * 20 * time.Millisecond)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := rw.RLockContext(ctx); err != nil {
					t.Errorf("reader: %v", err)
					return
				}
				reads.Add(1)
				time.Sleep(60 * time.Millisecond)
				if err := rw.RUnlockContext(ctx); err != nil {
					t.Errorf("reader: %v", err)
					return
				}
			}
		})
	}
	defer wg.Wait()
	defer close(stop)
	eventually(t, "readers taking turns", func() bool { return reads.Load() >= 6 })
	writer := etcdlock.NewRWMutex(newSession(t, client), name)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := writer.LockContext(wctx); err != nil {
		t.Fatalf("writer among readers that always hold: %v after %v", err, time.Since(start))
	}
	t.Logf("writer got the lock after %v among %d reads", time.Since(start), reads.Load())
	if err := writer.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRWMutexReentrant: per-goroutine holds; the writer may read (a local
// hold: no key), and its key lasts until its last hold ends; a reader asking
// for the write lock gets ErrWouldDeadlock, and Lock panics naming
// LockContext.
func TestRWMutexReentrant(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	s := newSession(t, client)
	rw := etcdlock.NewRWMutex(s, name)
	other := etcdlock.NewRWMutex(s, name) // the same lock

	rw.Lock()
	other.Lock()
	rw.RLock()
	if got := rw.HoldCount(); got != 3 {
		t.Errorf("HoldCount of the writer after Lock, Lock, RLock: got %d, want 3", got)
	}
	if keys := keysOfLease(t, client, name, s.Lease()); len(keys) != 1 || !strings.Contains(keys[0], "/write/") {
		t.Errorf("keys while writing and reading: got %q, want one write key", keys)
	}
	token := rw.Token()
	rw.Unlock()
	other.Unlock()
	if got := len(keysOfLease(t, client, name, s.Lease())); got != 1 {
		t.Errorf("keys after the write unlocks, with a read left: got %d, want 1 (still excluding)", got)
	}
	if rw.Token() != token {
		t.Errorf("Token with the nested read left: got %d, want %d", rw.Token(), token)
	}
	rw.RUnlock()
	if keys := keysOfLease(t, client, name, s.Lease()); len(keys) != 0 {
		t.Errorf("keys after the last unlock: got %q, want none", keys)
	}

	rw.RLock()
	rw.RLock()
	if err := rw.LockContext(ctx); !errors.Is(err, etcdlock.ErrWouldDeadlock) {
		t.Errorf("LockContext by a reader: got %v, want ErrWouldDeadlock", err)
	}
	if ok, err := rw.TryLockFor(ctx, time.Second); ok || !errors.Is(err, etcdlock.ErrWouldDeadlock) {
		t.Errorf("TryLockFor by a reader: got %v, %v, want false, ErrWouldDeadlock", ok, err)
	}
	if rw.TryLock() {
		t.Error("TryLock by a reader: got true")
	}
	assertPanics(t, "Lock by a reader", "LockContext", rw.Lock)
	if err := rw.UnlockContext(ctx); !errors.Is(err, etcdlock.ErrNotHeld) {
		t.Errorf("UnlockContext by a reader: got %v, want ErrNotHeld", err)
	}
	rw.RUnlock()
	rw.RUnlock()
	if err := rw.RUnlockContext(ctx); !errors.Is(err, etcdlock.ErrNotHeld) {
		t.Errorf("a third RUnlockContext: got %v, want ErrNotHeld", err)
	}
	assertPanics(t, "RUnlock without a hold", "RUnlockContext", rw.RUnlock)

	// Another goroutine of this process is another holder.
	rw.Lock()
	reader := lockInGoroutine(t, ctx, rlocker{rw})
	if !blocked(reader.locked, 200*time.Millisecond) {
		t.Fatal("another goroutine read while this one writes")
	}
	rw.Unlock()
	if err := waitErr(t, reader.locked); err != nil {
		t.Fatal(err)
	}
	if err := reader.Release(); err != nil {
		t.Fatal(err)
	}
	rl := rw.RLocker()
	rl.Lock()
	if rw.HoldCount() != 1 || rw.Token() == 0 {
		t.Errorf("RLocker's Lock: HoldCount %d, Token %d, want 1 and a token", rw.HoldCount(), rw.Token())
	}
	rl.Unlock()
}

// TestRWMutexRecipeInterop: ours and etcd's recipe RWMutex on one name
// exclude each other as two recipe RWMutexes would: writers exclude
// everyone, readers share.
func TestRWMutexRecipeInterop(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	rs := newUpstreamSession(t, client, 60)
	theirs := recipe.NewRWMutex(rs, name)
	ours := etcdlock.NewRWMutex(newSession(t, client), name)

	// Their writer: our reader waits.
	if err := theirs.Lock(); err != nil {
		t.Fatal(err)
	}
	if ours.TryRLock() {
		t.Fatal("our TryRLock while their writer holds: got true")
	}
	r := lockInGoroutine(t, ctx, rlocker{ours})
	if !blocked(r.locked, 200*time.Millisecond) {
		t.Fatal("our reader got the lock while their writer holds it")
	}
	if err := theirs.Unlock(); err != nil {
		t.Fatal(err)
	}
	if err := waitErr(t, r.locked); err != nil {
		t.Fatal(err)
	}

	// Our reader: their reader shares, their writer waits.
	if err := theirs.RLock(); err != nil {
		t.Fatal(err)
	}
	if err := theirs.RUnlock(); err != nil {
		t.Fatal(err)
	}
	w2 := recipe.NewRWMutex(newUpstreamSession(t, client, 60), name)
	wrote := result(w2.Lock)
	if !blocked(wrote, 200*time.Millisecond) {
		t.Fatal("their writer got the lock while our reader holds it")
	}
	if err := r.Release(); err != nil {
		t.Fatal(err)
	}
	if err := waitErr(t, wrote); err != nil {
		t.Fatal(err)
	}

	// Their writer holds: our writer waits, then gets it.
	w := lockInGoroutine(t, ctx, wlocker{ours})
	if !blocked(w.locked, 200*time.Millisecond) {
		t.Fatal("our writer got the lock while their writer holds it")
	}
	if err := w2.Unlock(); err != nil {
		t.Fatal(err)
	}
	if err := waitErr(t, w.locked); err != nil {
		t.Fatal(err)
	}
	// Our writer holds: their reader waits.
	read := result(theirs.RLock)
	if !blocked(read, 200*time.Millisecond) {
		t.Fatal("their reader got the lock while our writer holds it")
	}
	if err := w.Release(); err != nil {
		t.Fatal(err)
	}
	if err := waitErr(t, read); err != nil {
		t.Fatal(err)
	}
	if err := theirs.RUnlock(); err != nil {
		t.Fatal(err)
	}
}

// TestRecipeRWMutexPhantom (etcd #16221): the recipe's reader, whose lease
// is revoked while it waits, still returns from RLock with no error once
// the writer leaves: it "holds" a lock it has no key for. Ours returns
// ErrSessionExpired (TestFamilyWaiterLeaseRevoked).
func TestRecipeRWMutexPhantom(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	writer := etcdlock.NewRWMutex(newSession(t, client), name)
	if err := writer.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	rs := newUpstreamSession(t, startClient(t, client), 60)
	theirs := recipe.NewRWMutex(rs, name)
	read := result(theirs.RLock)
	eventually(t, "their reader queued", func() bool { return len(lockKeys(t, client, name+"/read")) == 1 })
	if _, err := client.Revoke(ctx, rs.Lease()); err != nil {
		t.Fatal(err)
	}
	if err := writer.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
	err := waitErr(t, read)
	keys := lockKeys(t, client, name+"/read")
	if err != nil || len(keys) != 0 {
		t.Fatalf("recipe RLock after its lease's revoke: got %v with read keys %q; want the defect: nil with no key", err, keys)
	}
	t.Log("recipe RLock returned nil after its lease was revoked: a read hold with no key (#16221)")
}

// watchEvents counts the watch responses with events that one client
// receives.
type watchEvents struct{ n atomic.Int64 }

func (c *watchEvents) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || method != "/etcdserverpb.Watch/Watch" {
		return cs, err
	}
	return &countingWatch{ClientStream: cs, c: c}, nil
}

type countingWatch struct {
	grpc.ClientStream
	c *watchEvents
}

func (s *countingWatch) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if resp, ok := m.(*pb.WatchResponse); ok && err == nil && len(resp.Events) > 0 {
		s.c.n.Add(1)
	}
	return err
}

// TestRWMutexNoHerd: a writer's release wakes the readers right behind it,
// which it unblocks, and no one queued behind the next writer.
func TestRWMutexNoHerd(t *testing.T) {
	testflags.Parallel(t)
	srv, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	var front, back watchEvents
	fc := serverClient(t, srv, nil, front.intercept)
	bc := serverClient(t, srv, nil, back.intercept)

	w1 := etcdlock.NewRWMutex(newSession(t, client), name)
	if err := w1.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	queue := func(c *clientv3.Client, l func(*etcdlock.RWMutex) locker) *worker {
		keys := len(lockKeys(t, client, name))
		w := lockInGoroutine(t, ctx, l(etcdlock.NewRWMutex(newSession(t, c), name)))
		eventually(t, "the waiter queued", func() bool { return len(lockKeys(t, client, name)) > keys })
		return w
	}
	read := func(rw *etcdlock.RWMutex) locker { return rlocker{rw} }
	write := func(rw *etcdlock.RWMutex) locker { return wlocker{rw} }
	var readers []*worker
	for range 5 {
		readers = append(readers, queue(fc, read))
	}
	w2 := queue(client, write)
	var late []*worker
	for range 5 {
		late = append(late, queue(bc, read))
	}
	time.Sleep(ownWait) // the waiters' watches on their own keys, too
	f0, b0 := front.n.Load(), back.n.Load()

	if err := w1.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
	for _, r := range readers {
		if err := waitErr(t, r.locked); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range late {
		if !blocked(r.locked, 0) {
			t.Fatal("a reader behind the second writer got the lock")
		}
	}
	if got := front.n.Load() - f0; got != int64(len(readers)) {
		t.Errorf("watch events of the readers behind the first writer: got %d, want %d (one each)", got, len(readers))
	}
	if got := back.n.Load() - b0; got != 0 {
		t.Errorf("watch events of the readers behind the second writer: got %d, want 0", got)
	}
	for _, r := range readers {
		if err := r.Release(); err != nil {
			t.Fatal(err)
		}
	}
	if err := waitErr(t, w2.locked); err != nil {
		t.Fatal(err)
	}
	if got := back.n.Load() - b0; got != 0 {
		t.Errorf("watch events of the late readers while the second writer waited: got %d, want 0", got)
	}
	if err := w2.Release(); err != nil {
		t.Fatal(err)
	}
	for _, r := range late {
		if err := waitErr(t, r.locked); err != nil {
			t.Fatal(err)
		}
		if err := r.Release(); err != nil {
			t.Fatal(err)
		}
	}
}

// ownWait is longer than a wait runs before it also watches its own key.
const ownWait = 300 * time.Millisecond

// onGoroutine returns a function that runs f on a goroutine of its own, the
// same one for every call, and waits for it: RWMutex holds and views belong
// to goroutines. The goroutine ends with the test.
func onGoroutine(t *testing.T) func(f func()) {
	ops := make(chan func())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for f := range ops {
			f()
		}
	}()
	t.Cleanup(func() { close(ops); <-stopped })
	return func(f func()) {
		ran := make(chan struct{})
		ops <- func() { defer close(ran); f() }
		<-ran
	}
}

// An rwView is what an RWMutex tells a goroutine of its hold.
type rwView struct {
	key   string
	token int64
	owner clientv3.Cmp
	done  <-chan struct{}
}

func viewOf(rw *etcdlock.RWMutex) rwView {
	return rwView{key: rw.Key(), token: rw.Token(), owner: rw.IsOwner(), done: rw.Done()}
}

// checkHeldView checks that v describes the hold of the key want, as etcd
// sees it: the key, its create revision as the token, an IsOwner guard that
// passes, and an open Done.
func checkHeldView(t *testing.T, client *clientv3.Client, who string, v rwView, want string) {
	t.Helper()
	ctx := testContext(t)
	resp, err := client.Get(ctx, want)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("%s's key %q in etcd: got %v, %v, want the key", who, want, resp, err)
	}
	if v.key != want {
		t.Errorf("%s's Key: got %q, want %q", who, v.key, want)
	}
	if rev := resp.Kvs[0].CreateRevision; v.token != rev {
		t.Errorf("%s's Token: got %d, want %d (its key's create revision)", who, v.token, rev)
	}
	if isClosed(v.done) {
		t.Errorf("%s's Done: closed, want open while it holds", who)
	}
	if tr, err := client.Txn(ctx).If(v.owner).Commit(); err != nil || !tr.Succeeded {
		t.Errorf("%s's IsOwner Txn: got %v, %v, want success while it holds", who, tr, err)
	}
}

// checkEmptyView checks the answers of an RWMutex to a goroutine that holds
// nothing: no key, token 0, a closed Done and an IsOwner guard that fails.
func checkEmptyView(t *testing.T, client *clientv3.Client, who string, v rwView) {
	t.Helper()
	if v.key != "" || v.token != 0 {
		t.Errorf("%s, holding nothing: Key %q, Token %d, want \"\" and 0", who, v.key, v.token)
	}
	if !isClosed(v.done) {
		t.Errorf("%s, holding nothing: Done open, want closed", who)
	}
	if tr, err := client.Txn(testContext(t)).If(v.owner).Commit(); err != nil || tr.Succeeded {
		t.Errorf("%s, holding nothing: IsOwner Txn got %v, %v, want failure", who, tr, err)
	}
}

// TestRWMutexViewsPerGoroutine: Key, Token, IsOwner and Done of an RWMutex
// describe the calling goroutine's hold, never another reader's: when reader
// A unlocks, reader B's Done stays open and its IsOwner guard still passes.
// A goroutine that holds nothing gets the zero answers; a writer sees its
// write hold, through its nested reads too.
func TestRWMutexViewsPerGoroutine(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	rw := etcdlock.NewRWMutex(newSession(t, client), name)
	onA, onB, onW := onGoroutine(t), onGoroutine(t), onGoroutine(t)

	var errA, errB error
	onA(func() { errA = rw.RLockContext(ctx) })
	onB(func() { errB = rw.RLockContext(ctx) })
	if errA != nil || errB != nil {
		t.Fatalf("RLockContext of A and B: got %v, %v, want nil", errA, errB)
	}
	keys := lockKeys(t, client, name) // oldest first: A's, then B's
	if len(keys) != 2 {
		t.Fatalf("keys of two readers: got %q, want 2", keys)
	}
	var a, b rwView
	onA(func() { a = viewOf(rw) })
	onB(func() { b = viewOf(rw) })
	checkHeldView(t, client, "reader A", a, keys[0])
	checkHeldView(t, client, "reader B", b, keys[1])
	checkEmptyView(t, client, "a goroutine of the same process", viewOf(rw))

	onA(func() { errA = rw.RUnlockContext(ctx) })
	if errA != nil {
		t.Fatalf("A's RUnlockContext: %v", errA)
	}
	if !isClosed(a.done) {
		t.Error("A's Done after A's unlock: open, want closed")
	}
	checkHeldView(t, client, "reader B, after A's unlock (its view from before)", b, keys[1])
	onB(func() { b = viewOf(rw) })
	checkHeldView(t, client, "reader B, after A's unlock", b, keys[1])
	onA(func() { a = viewOf(rw) })
	checkEmptyView(t, client, "reader A, after its unlock", a)
	onB(func() { errB = rw.RUnlockContext(ctx) })
	if errB != nil {
		t.Fatalf("B's RUnlockContext: %v", errB)
	}

	var errW error
	var w, nested rwView
	onW(func() {
		if errW = rw.LockContext(ctx); errW == nil {
			w = viewOf(rw)
			rw.RLock()
			nested = viewOf(rw)
		}
	})
	if errW != nil {
		t.Fatalf("writer's LockContext: %v", errW)
	}
	keys = lockKeys(t, client, name)
	if len(keys) != 1 || !strings.Contains(keys[0], "/write/") {
		t.Fatalf("keys of the writer: got %q, want one write key", keys)
	}
	checkHeldView(t, client, "the writer", w, keys[0])
	checkHeldView(t, client, "the writer, reading too", nested, keys[0])
	checkEmptyView(t, client, "a goroutine of the same process, while another writes", viewOf(rw))
	onW(func() {
		rw.RUnlock()
		errW = rw.UnlockContext(ctx)
	})
	if errW != nil {
		t.Fatalf("writer's UnlockContext: %v", errW)
	}
	if !isClosed(w.done) {
		t.Error("the writer's Done after its unlock: open, want closed")
	}
}
