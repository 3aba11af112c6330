package etcdlock_test

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
)

func TestLockUnlock(t *testing.T) {
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

func TestReentrant(t *testing.T) {
	_, client := startServer(t)
	s := newSession(t, client)
	name := lockName(t)
	m1 := etcdlock.NewMutex(s, name)
	m2 := etcdlock.NewMutex(s, name)
	ctx := testContext(t)

	if err := m1.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	rev := revision(t, client)
	m2.Lock()
	if !m1.TryLock() {
		t.Fatal("TryLock by the holder = false, want true")
	}
	if ok, err := m2.TryLockFor(ctx, 0); !ok || err != nil {
		t.Fatalf("TryLockFor by the holder = %v, %v, want true, nil", ok, err)
	}
	if got := m1.HoldCount(); got != 4 {
		t.Errorf("HoldCount() = %d, want 4", got)
	}
	if got := m2.HoldCount(); got != 4 {
		t.Errorf("HoldCount() of the other handle = %d, want 4", got)
	}
	if got := revision(t, client); got != rev {
		t.Errorf("re-locks moved etcd's revision from %d to %d, want no writes", rev, got)
	}

	// Another goroutine of this process waits like a remote process would.
	other := result(func() error { return m2.LockContext(ctx) })
	for i := 3; i > 0; i-- {
		m1.Unlock()
		if got := m2.HoldCount(); got != i {
			t.Errorf("HoldCount() = %d, want %d", got, i)
		}
		if !blocked(other, 50*time.Millisecond) {
			t.Fatalf("another goroutine got the lock with %d holds left", i)
		}
		if keys := lockKeys(t, client, name); len(keys) != 1 {
			t.Errorf("keys with %d holds left = %q, want our one", i, keys)
		}
	}
	m2.Unlock()
	if err := waitErr(t, other); err != nil {
		t.Fatalf("LockContext of the waiting goroutine: %v", err)
	}
	if got := m1.HoldCount(); got != 0 {
		t.Errorf("HoldCount() of a goroutine that does not hold = %d, want 0", got)
	}
	if m1.Token() == 0 || m1.Key() == "" {
		t.Errorf("Token %d, Key %q while another goroutine of this process holds, want the process's hold", m1.Token(), m1.Key())
	}
}

// TestGoroutinesOfOneProcess runs many goroutines on one Session and lock:
// they exclude each other, and the process never has more than one key.
func TestGoroutinesOfOneProcess(t *testing.T) {
	_, client := startServer(t)
	s := newSession(t, client)
	name := lockName(t)
	ctx := testContext(t)

	var inside atomic.Int32
	var counter int
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 8 {
		wg.Go(func() {
			m := etcdlock.NewMutex(s, name) // a handle each: the same lock
			for range 10 {
				if err := m.LockContext(ctx); err != nil {
					errs <- err
					return
				}
				if n := inside.Add(1); n != 1 {
					errs <- errors.New("two goroutines inside the lock")
				}
				if g%2 == 0 { // a nested hold
					m.Lock()
					if n := m.HoldCount(); n != 2 {
						errs <- fmt.Errorf("HoldCount in a nested hold: got %d, want 2", n)
					}
					m.Unlock()
				}
				counter++
				inside.Add(-1)
				if err := m.UnlockContext(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	stop := make(chan struct{})
	maxKeys := make(chan int, 1)
	go func() {
		most := 0
		for {
			select {
			case <-stop:
				maxKeys <- most
				return
			default:
			}
			resp, err := client.Get(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err == nil {
				most = max(most, int(resp.Count))
			}
		}
	}()
	wg.Wait()
	close(stop)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if counter != 80 {
		t.Errorf("counter = %d, want 80", counter)
	}
	if most := <-maxKeys; most > 1 {
		t.Errorf("the process had %d keys at once, want at most 1", most)
	}
}

// TestMutualExclusionAcrossSessions: several sessions, several goroutines
// each, one counter read and written inside the lock.
func TestMutualExclusionAcrossSessions(t *testing.T) {
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

func TestTryLock(t *testing.T) {
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

// TestTryLockLocalHolder: a goroutine of the same process holding the lock
// makes TryLock fail without a round trip.
func TestTryLockLocalHolder(t *testing.T) {
	_, client := startServer(t)
	s := newSession(t, client)
	m := etcdlock.NewMutex(s, lockName(t))
	m.Lock()
	defer m.Unlock()
	got := make(chan bool)
	go func() { got <- m.TryLock() }()
	if <-got {
		t.Fatal("TryLock by another goroutine while held = true, want false")
	}
	go func() {
		ok, _ := m.TryLockFor(testContext(t), 20*time.Millisecond)
		got <- ok
	}()
	if <-got {
		t.Fatal("TryLockFor by another goroutine while held = true, want false")
	}
}

func TestLockContextCancelledWhileWaiting(t *testing.T) {
	_, client := startServer(t)
	name := lockName(t)
	ctx := testContext(t)
	holder := etcdlock.NewMutex(newSession(t, client), name)
	holder.Lock()

	waiterSession := newSession(t, client)
	waiter := etcdlock.NewMutex(waiterSession, name)
	wctx, cancel := context.WithCancel(ctx)
	ch := result(func() error { return waiter.LockContext(wctx) })
	eventually(t, "the waiter's key", func() bool { return len(lockKeys(t, client, name)) == 2 })
	cancel()
	if err := waitErr(t, ch); !errors.Is(err, context.Canceled) {
		t.Fatalf("LockContext = %v, want context.Canceled", err)
	}
	if keys := lockKeys(t, client, name); len(keys) != 1 {
		t.Errorf("keys after the cancelled wait = %q, want only the holder's", keys)
	}

	// A local waiter, queued behind a goroutine of its own process, too.
	local := etcdlock.NewMutex(waiterSession, name)
	release := make(chan struct{})
	go1 := result(func() error {
		if err := local.LockContext(ctx); err != nil {
			return err
		}
		<-release
		return local.UnlockContext(ctx)
	})
	eventually(t, "the first waiter's key", func() bool { return len(lockKeys(t, client, name)) == 2 })
	dctx, dcancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer dcancel()
	if err := local.LockContext(dctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("LockContext queued locally = %v, want context.DeadlineExceeded", err)
	}
	holder.Unlock()
	close(release)
	if err := waitErr(t, go1); err != nil {
		t.Fatal(err)
	}
	if keys := lockKeys(t, client, name); len(keys) != 0 {
		t.Errorf("keys at the end = %q, want none", keys)
	}
}
