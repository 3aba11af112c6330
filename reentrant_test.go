package etcdlock_test

// In-process state: reentrant holds, goroutines of one process as one
// holder in etcd, the goroutine id behind it, and the local hand-off.

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/petermattis/goid"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

func TestReentrant(t *testing.T) {
	testflags.Parallel(t)
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
	if w := wroteSince(t, client, rev); len(w) > 0 {
		t.Errorf("re-locks wrote %v, want no writes", w)
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
	testflags.Parallel(t)
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

// TestTryLockLocalHolder: a goroutine of the same process holding the lock
// makes TryLock fail without a round trip.
func TestTryLockLocalHolder(t *testing.T) {
	testflags.Parallel(t)
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

// TestLocalHandoff: with WithLocalHandoff(n), the hold passes between
// goroutines of the process without etcd writes and with the same token, at
// most n times in a row; then the key goes back to etcd's queue.
func TestLocalHandoff(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	const n = 3
	s := newSession(t, client, etcdlock.WithLocalHandoff(n))
	name := lockName(t)
	m := etcdlock.NewMutex(s, name)
	ctx := testContext(t)

	m.Lock()
	first := m.Token()
	rev := revision(t, client)

	// Queue n+1 goroutines behind the holder, in order.
	var wg sync.WaitGroup
	tokens := make([]int64, n+1)
	release := make([]chan struct{}, n+1)
	acquired := make(chan int, n+1)
	for i := range n + 1 {
		release[i] = make(chan struct{})
		wg.Go(func() {
			if err := m.LockContext(ctx); err != nil {
				t.Errorf("LockContext %d: %v", i, err)
				return
			}
			tokens[i] = m.Token()
			acquired <- i
			<-release[i]
			m.Unlock()
		})
		eventually(t, "the goroutine queued", func() bool { return etcdlock.Queued(s, name) == i+1 })
	}
	m.Unlock()
	for i := range n + 1 {
		if got := <-acquired; got != i {
			t.Fatalf("goroutine %d got the lock, want %d (FIFO)", got, i)
		}
		if i < n {
			if tokens[i] != first {
				t.Errorf("token after hand-off %d = %d, want the same token %d", i+1, tokens[i], first)
			}
			if w := wroteSince(t, client, rev); len(w) > 0 {
				t.Errorf("hand-off %d wrote %v, want no writes", i+1, w)
			}
		} else if tokens[i] <= first {
			t.Errorf("token after %d hand-offs = %d, want a new, higher token than %d (the key went back to etcd)", n, tokens[i], first)
		}
		close(release[i])
	}
	wg.Wait()
	if keys := lockKeys(t, client, name); len(keys) != 0 {
		t.Errorf("keys at the end = %q, want none", keys)
	}
}

// TestLocalHandoffDoesNotStarveOthers: another process waiting gets the lock
// after at most n+1 local holds.
func TestLocalHandoffDoesNotStarveOthers(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	const n = 2
	s := newSession(t, client, etcdlock.WithLocalHandoff(n))
	name := lockName(t)
	ctx := testContext(t)
	m := etcdlock.NewMutex(s, name)
	m.Lock()

	var mu sync.Mutex
	localHolds, holdsBeforeRemote := 0, -1
	remote := etcdlock.NewMutex(newSession(t, client), name)
	remoteDone := result(func() error {
		if err := remote.LockContext(ctx); err != nil {
			return err
		}
		mu.Lock()
		holdsBeforeRemote = localHolds
		mu.Unlock()
		return remote.UnlockContext(ctx)
	})
	eventually(t, "the remote waiter's key", func() bool { return len(lockKeys(t, client, name)) == 2 })

	// Local goroutines keep coming; each one re-queues behind the next.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := m.LockContext(ctx); err != nil {
					t.Errorf("LockContext: %v", err)
					return
				}
				mu.Lock()
				localHolds++
				mu.Unlock()
				m.Unlock()
			}
		})
	}
	eventually(t, "local goroutines queued", func() bool { return etcdlock.Queued(s, name) >= 2 })
	m.Unlock()
	if err := waitErr(t, remoteDone); err != nil {
		t.Fatalf("remote LockContext: %v", err)
	}
	close(stop)
	wg.Wait()
	if holds := holdsBeforeRemote; holds > n+1 {
		t.Errorf("local holds before the remote waiter = %d, want at most %d", holds, n+1)
	}
}

// stackGoid returns the calling goroutine's id from the "goroutine N [" header
// of runtime.Stack: slow, but the runtime's own word.
func stackGoid(t *testing.T) int64 {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	rest, ok := bytes.CutPrefix(buf, []byte("goroutine "))
	if !ok {
		t.Errorf("stack header: got %q, want \"goroutine N [\"", buf)
		return -1
	}
	n, _, ok := bytes.Cut(rest, []byte(" ["))
	if !ok {
		t.Errorf("stack header: got %q, want \"goroutine N [\"", buf)
		return -1
	}
	id, err := strconv.ParseInt(string(n), 10, 64)
	if err != nil {
		t.Errorf("goroutine id in %q: %v", buf, err)
		return -1
	}
	return id
}

// TestGoid: goid.Get, which reads the runtime's goroutine struct at an offset
// copied from the Go version it was written for, agrees with runtime.Stack in
// many goroutines, including ones running at the same time. The reentrant
// lock's holder is identified by it.
func TestGoid(t *testing.T) {
	if got, want := goid.Get(), stackGoid(t); got != want {
		t.Fatalf("goid.Get in the test goroutine: got %d, want %d", got, want)
	}
	const goroutines = 200
	ids := make(chan int64, goroutines)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			<-start
			for range 10 {
				if got, want := goid.Get(), stackGoid(t); got != want {
					t.Errorf("goid.Get: got %d, want %d", got, want)
					return
				}
				runtime.Gosched()
			}
			ids <- goid.Get()
		})
	}
	close(start)
	wg.Wait()
	close(ids)
	seen := make(map[int64]bool)
	for id := range ids {
		if seen[id] {
			t.Errorf("goid.Get: got id %d in two goroutines, want distinct ids", id)
		}
		seen[id] = true
	}
}
