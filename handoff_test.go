package etcdlock_test

import (
	"sync"
	"testing"

	"github.com/etcdlock/etcdlock"
)

// TestLocalHandoff: with WithLocalHandoff(n), the hold passes between
// goroutines of the process without etcd writes and with the same token, at
// most n times in a row; then the key goes back to etcd's queue.
func TestLocalHandoff(t *testing.T) {
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
			if got := revision(t, client); got != rev {
				t.Errorf("hand-off %d moved etcd's revision from %d to %d, want no writes", i+1, rev, got)
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

func TestWithLocalHandoffInvalid(t *testing.T) {
	_, client := startServer(t)
	if _, err := etcdlock.NewSession(client, etcdlock.WithLocalHandoff(-1)); err == nil {
		t.Error("WithLocalHandoff(-1): got no error, want ErrInvalidArgument")
	}
}
