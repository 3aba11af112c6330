package etcdlock_test

// Mutex across Sessions: lock and unlock, tokens, exclusion, FIFO, tries,
// bad input, unlock errors and IsOwner.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

func TestLockUnlock(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	s := newSession(t, client)
	name := lockName(t)
	m := etcdlock.NewMutex(s, name)
	ctx := testContext(t)

	if err := m.LockContext(ctx); err != nil {
		t.Fatalf("LockContext: %v", err)
	}
	want := keyOf(name, s.Lease())
	if got := m.Key(); got != want {
		t.Errorf("Key() = %q, want %q", got, want)
	}
	resp, err := client.Get(ctx, want)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("get %q: %v, %d keys, want 1", want, err, len(resp.Kvs))
	}
	if got, want := m.Token(), resp.Kvs[0].CreateRevision; got != want {
		t.Errorf("Token() = %d, want the key's create revision %d", got, want)
	}
	if got, want := clientv3.LeaseID(resp.Kvs[0].Lease), s.Lease(); got != want {
		t.Errorf("key lease = %x, want %x", got, want)
	}
	if got := m.HoldCount(); got != 1 {
		t.Errorf("HoldCount() = %d, want 1", got)
	}
	if err := m.UnlockContext(ctx); err != nil {
		t.Fatalf("UnlockContext: %v", err)
	}
	if keys := lockKeys(t, client, name); len(keys) != 0 {
		t.Errorf("keys after unlock = %q, want none", keys)
	}
	if m.Key() != "" || m.Token() != 0 || m.HoldCount() != 0 {
		t.Errorf("after unlock: Key %q, Token %d, HoldCount %d, want \"\", 0, 0", m.Key(), m.Token(), m.HoldCount())
	}
}

func TestTokensIncrease(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	name := lockName(t)
	ctx := testContext(t)
	var last int64
	for i := range 5 {
		s := newSession(t, client)
		m := etcdlock.NewMutex(s, name)
		if err := m.LockContext(ctx); err != nil {
			t.Fatalf("LockContext %d: %v", i, err)
		}
		if tok := m.Token(); tok <= last {
			t.Errorf("token %d = %d, want > %d", i, tok, last)
		} else {
			last = tok
		}
		if err := m.UnlockContext(ctx); err != nil {
			t.Fatalf("UnlockContext %d: %v", i, err)
		}
	}
}

// TestMutualExclusionAcrossSessions: several sessions, several goroutines
// each, one counter read and written inside the lock.
func TestMutualExclusionAcrossSessions(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	name := lockName(t)
	ctx := testContext(t)
	var inside atomic.Int32
	var counter int
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for range 4 {
		s := newSession(t, client)
		for range 2 {
			wg.Go(func() {
				m := etcdlock.NewMutex(s, name)
				for range 10 {
					if err := m.LockContext(ctx); err != nil {
						errs <- err
						return
					}
					if inside.Add(1) != 1 {
						errs <- errors.New("two holders inside the lock")
					}
					c := counter
					time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
					counter = c + 1
					inside.Add(-1)
					if err := m.UnlockContext(ctx); err != nil {
						errs <- err
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if counter != 80 {
		t.Errorf("counter = %d, want 80", counter)
	}
	if keys := lockKeys(t, client, name); len(keys) != 0 {
		t.Errorf("keys left = %q, want none", keys)
	}
}

func TestFIFOAcrossSessions(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	name := lockName(t)
	ctx := testContext(t)
	holder := etcdlock.NewMutex(newSession(t, client), name)
	if err := holder.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	var order []int
	var mu sync.Mutex
	var done []<-chan error
	for i := range 4 {
		m := etcdlock.NewMutex(newSession(t, client), name)
		done = append(done, result(func() error {
			if err := m.LockContext(ctx); err != nil {
				return err
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			return m.UnlockContext(ctx)
		}))
		// Wait until this waiter's key is in the queue before starting the next.
		eventually(t, "waiter in the queue", func() bool { return len(lockKeys(t, client, name)) == i+2 })
	}
	if err := holder.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
	for _, ch := range done {
		if err := waitErr(t, ch); err != nil {
			t.Fatal(err)
		}
	}
	for i, got := range order {
		if got != i {
			t.Fatalf("order = %v, want 0 1 2 3", order)
		}
	}
}

// A waiter whose predecessor's delete never arrives (a watch event lost by
// etcd) still gets the lock, within a TTL of the delete: it reads its place
// again at least once per TTL.
func TestLostWatchEvent(t *testing.T) {
	testflags.Parallel(t)
	srv, client := startServer(t)
	var d eventDropper
	rec := &watchRecorder{rev: func() int64 { return 0 }, prefix: serverPrefix(t, srv)}
	wc := serverClient(t, srv, nil, chainStreams(rec.intercept, d.intercept))
	const ttl = 2 * time.Second
	name := lockName(t)

	h := etcdlock.NewMutex(newSession(t, client), name)
	if err := h.LockContext(testContext(t)); err != nil {
		t.Fatal(err)
	}
	s := newSession(t, wc, etcdlock.WithTTL(ttl))
	m := etcdlock.NewMutex(s, name)
	w := lockInGoroutine(t, testContext(t), ours{m})
	eventually(t, "the waiter's watch on the holder's key", func() bool { return rec.watching(h.Key()) })
	d.arm(h.Key())
	released := time.Now()
	if err := h.UnlockContext(testContext(t)); err != nil {
		t.Fatal(err)
	}
	// The promise is one TTL; allow twice TTL + 1 s on a loaded machine.
	select {
	case err := <-w.locked:
		if err != nil {
			t.Fatalf("waiter: got %v, want the lock", err)
		}
		t.Logf("waiter got the lock %v after the lost delete (TTL %v)", time.Since(released), ttl)
	case <-time.After(2 * (ttl + time.Second)):
		t.Fatalf("waiter still waiting %v after its predecessor's delete was lost, want the lock within TTL (%v)", 2*(ttl+time.Second), ttl)
	}
	if n := d.count(); n != 1 {
		t.Errorf("delete events swallowed: got %d, want 1 (the test did not lose the event)", n)
	}
}

func TestTryLock(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	name := lockName(t)
	ctx := testContext(t)
	a := etcdlock.NewMutex(newSession(t, client), name)
	b := etcdlock.NewMutex(newSession(t, client), name)

	if !a.TryLock() {
		t.Fatal("TryLock on a free lock = false, want true")
	}
	if b.TryLock() {
		t.Fatal("TryLock on a lock held by another session = true, want false")
	}
	ok, err := b.TryLockFor(ctx, 100*time.Millisecond)
	if ok || err != nil {
		t.Fatalf("TryLockFor while held = %v, %v, want false, nil (the wait ran out)", ok, err)
	}
	if keys := lockKeys(t, client, name); len(keys) != 1 || keys[0] != a.Key() {
		t.Errorf("keys after failed tries = %q, want only the holder's %q", keys, a.Key())
	}

	got := make(chan bool, 1)
	go func() {
		ok, err := b.TryLockFor(ctx, testTimeout)
		if err != nil {
			t.Errorf("TryLockFor: %v", err)
		}
		if ok {
			b.Unlock()
		}
		got <- ok
	}()
	eventually(t, "the waiter's key", func() bool { return len(lockKeys(t, client, name)) == 2 })
	a.Unlock()
	if !<-got {
		t.Fatal("TryLockFor with a long wait = false after the holder left, want true")
	}
}

// TestBadInput: every bad input gets a clear error from the context methods,
// false from TryLock, a panic naming the context method from Lock and Unlock,
// and writes nothing to etcd.
func TestBadInput(t *testing.T) {
	testflags.Parallel(t)
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
	if _, ok := closedWithin(expired.Done(), testTimeout); !ok {
		t.Fatal("Done() of a Session whose lease was revoked: still open")
	}

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
			if w := wroteSince(t, client, before); len(w) > 0 {
				t.Errorf("writes: %v, want none", w)
			}
		})
	}
}

func TestUnlockNotHeld(t *testing.T) {
	testflags.Parallel(t)
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
	testflags.Parallel(t)
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
	testflags.Parallel(t)
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

// TestWaiterKeyDeletedWithHolder: the only waiter takes the holder's delete
// as the hold, with no read, but not when its own key went first or in the
// same Txn: then it queues again with a new key, and its token is that
// key's.
func TestWaiterKeyDeletedWithHolder(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	for _, sameTxn := range []bool{false, true} {
		t.Run(fmt.Sprintf("same Txn %v", sameTxn), func(t *testing.T) {
			name := lockName(t)
			holder := etcdlock.NewMutex(newSession(t, client), name)
			if err := holder.LockContext(ctx); err != nil {
				t.Fatal(err)
			}
			s := newSession(t, client)
			w := lockInGoroutine(t, ctx, oursOn(s, name))
			ours := keyOf(name, s.Lease())
			eventually(t, "the waiter queued", func() bool { return len(lockKeys(t, client, name)) == 2 })
			time.Sleep(ownWait)
			var deleted int64
			if sameTxn {
				resp, err := client.Txn(ctx).Then(clientv3.OpDelete(ours), clientv3.OpDelete(holder.Key())).Commit()
				if err != nil {
					t.Fatal(err)
				}
				deleted = resp.Header.Revision
			} else {
				resp, err := client.Delete(ctx, ours)
				if err != nil {
					t.Fatal(err)
				}
				deleted = resp.Header.Revision
				if _, err := client.Delete(ctx, holder.Key()); err != nil {
					t.Fatal(err)
				}
			}
			if err := waitErr(t, w.locked); err != nil {
				t.Fatalf("waiter: %v", err)
			}
			got := etcdlock.NewMutex(s, name).Token()
			if got <= deleted {
				t.Errorf("waiter's token: got %d, want a key put after its own was deleted at %d", got, deleted)
			}
			if keys := lockKeys(t, client, name); len(keys) != 1 || keys[0] != ours {
				t.Errorf("keys: got %q, want the waiter's new key", keys)
			}
			if err := w.Release(); err != nil {
				t.Fatal(err)
			}
			if err := holder.UnlockContext(ctx); !errors.Is(err, etcdlock.ErrLockLost) {
				t.Errorf("holder's unlock: got %v, want ErrLockLost", err)
			}
		})
	}
}

// TestWaiterSkipsGoneKeys: waiters ahead of us that leave, several at once,
// move us up the queue, and we get the lock only when the last key ahead of
// us goes, whether our reads saw it (the newest keys ahead) or not (further
// ahead).
func TestWaiterSkipsGoneKeys(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	holder := lockInGoroutine(t, ctx, oursOn(newSession(t, client), name))
	if err := waitErr(t, holder.locked); err != nil {
		t.Fatal(err)
	}
	var ahead []*worker
	var keys []string
	for i := range 5 {
		s := newSession(t, client)
		ahead = append(ahead, lockInGoroutine(t, ctx, oursOn(s, name)))
		keys = append(keys, keyOf(name, s.Lease()))
		eventually(t, "the waiter queued", func() bool { return len(lockKeys(t, client, name)) == i+2 })
	}
	us := lockInGoroutine(t, ctx, oursOn(newSession(t, client), name))
	eventually(t, "us queued", func() bool { return len(lockKeys(t, client, name)) == 7 })

	// The two keys just ahead of us go in one Txn, then the next two.
	// (Their waiters queue again, behind us.)
	for _, gone := range [][]int{{4, 3}, {2, 1}} {
		if _, err := client.Txn(ctx).Then(clientv3.OpDelete(keys[gone[0]]), clientv3.OpDelete(keys[gone[1]])).Commit(); err != nil {
			t.Fatal(err)
		}
		if !blocked(us.locked, 300*time.Millisecond) {
			t.Fatalf("we got the lock with waiters %v gone, while the holder and waiter 0 are ahead", gone)
		}
	}
	if err := holder.Release(); err != nil {
		t.Fatal(err)
	}
	if err := waitErr(t, ahead[0].locked); err != nil {
		t.Fatal(err)
	}
	if !blocked(us.locked, 300*time.Millisecond) {
		t.Fatal("we got the lock while waiter 0 holds it")
	}
	if err := ahead[0].Release(); err != nil {
		t.Fatal(err)
	}
	if err := waitErr(t, us.locked); err != nil {
		t.Fatalf("after every key ahead went: got %v, want the lock", err)
	}
	if err := us.Release(); err != nil {
		t.Fatal(err)
	}
}
