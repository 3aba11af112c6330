package etcdlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// TestDo: f runs holding the lock; Do returns f's error and releases after
// f returns; f's context is cancelled once f has returned.
func TestDo(t *testing.T) {
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	m := etcdlock.NewMutex(newSession(t, client), name)
	boom := errors.New("boom")
	var kept context.Context
	err := m.Do(ctx, func(fctx context.Context) error {
		kept = fctx
		if m.Token() <= 0 || m.HoldCount() != 1 {
			t.Errorf("inside f: Token %d, HoldCount %d, want > 0, 1", m.Token(), m.HoldCount())
		}
		if keys := lockKeys(t, client, name); len(keys) != 1 {
			t.Errorf("keys inside f: got %q, want 1", keys)
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Errorf("Do: got %v, want f's error", err)
	}
	if kept.Err() == nil {
		t.Error("f's context not cancelled after f returned")
	}
	if keys := lockKeys(t, client, name); len(keys) != 0 {
		t.Errorf("keys after Do: got %q, want none", keys)
	}
	if err := m.Do(ctx, func(context.Context) error { return nil }); err != nil {
		t.Errorf("Do with f returning nil: got %v, want nil", err)
	}
	if err := m.Do(ctx, nil); !errors.Is(err, etcdlock.ErrInvalidArgument) {
		t.Errorf("Do with a nil f: got %v, want ErrInvalidArgument", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	ran := false
	if err := m.Do(cancelled, func(context.Context) error { ran = true; return nil }); !errors.Is(err, context.Canceled) || ran {
		t.Errorf("Do with a cancelled ctx: got %v (f ran: %v), want context.Canceled and f not run", err, ran)
	}
}

// TestDoWaitsForF: when ctx ends, f's context is cancelled but the lock is
// held until f returns, however long it takes.
func TestDoWaitsForF(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	name := lockName(t)
	m := etcdlock.NewMutex(newSession(t, client), name)
	ctx, cancel := context.WithCancel(testContext(t))
	stillHeld := make(chan bool, 1)
	err := m.Do(ctx, func(fctx context.Context) error {
		cancel()
		<-fctx.Done()
		time.Sleep(300 * time.Millisecond) // f is slow to stop
		stillHeld <- len(lockKeys(t, client, name)) == 1
		return fctx.Err()
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Do: got %v, want f's context.Canceled", err)
	}
	if !<-stillHeld {
		t.Error("the lock was released while f still ran after its context was cancelled")
	}
	if keys := lockKeys(t, client, name); len(keys) != 0 {
		t.Errorf("keys after Do: got %q, want none", keys)
	}
}

// TestDoLoss: our key deleted while f runs cancels f's context within 2 s,
// and Do returns ErrLockLost.
func TestDoLoss(t *testing.T) {
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	s := newSession(t, client)
	m := etcdlock.NewMutex(s, name)
	err := m.Do(ctx, func(fctx context.Context) error {
		if _, err := client.Delete(ctx, keyOf(name, s.Lease())); err != nil {
			t.Fatal(err)
		}
		select {
		case <-fctx.Done():
		case <-time.After(2 * time.Second):
			t.Error("f's context still open 2s after the key was deleted")
		}
		return nil
	})
	if !errors.Is(err, etcdlock.ErrLockLost) {
		t.Errorf("Do after the loss: got %v, want ErrLockLost", err)
	}
}

// TestDoScope: inside f, goroutines with f's context re-enter the lock at
// once (an errgroup does not deadlock on the lock its parent holds), and so
// does a nested Do; other goroutines wait; a context kept after f returned
// grants nothing.
func TestDoScope(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	s := newSession(t, client)
	m := etcdlock.NewMutex(s, name)
	same := etcdlock.NewMutex(s, name) // another handle on the same lock

	var kept context.Context
	err := m.Do(ctx, func(fctx context.Context) error {
		kept = fctx
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				if err := same.LockContext(fctx); err != nil {
					t.Errorf("LockContext in f's scope: %v", err)
					return
				}
				if ok, err := m.TryLockFor(fctx, 0); !ok || err != nil {
					t.Errorf("TryLockFor in f's scope: got %v, %v, want true", ok, err)
				}
				for range 2 {
					if err := m.UnlockContext(fctx); err != nil {
						t.Errorf("UnlockContext in f's scope: %v", err)
					}
				}
				if err := m.UnlockContext(fctx); !errors.Is(err, etcdlock.ErrNotHeld) {
					t.Errorf("a third UnlockContext in f's scope: got %v, want ErrNotHeld (Do's own hold is not theirs)", err)
				}
			})
		}
		wg.Wait()
		if keys := lockKeys(t, client, name); len(keys) != 1 {
			t.Errorf("keys after the scope's unlocks: got %q, want Do's key", keys)
		}
		// A goroutine outside the scope waits like any other caller.
		outside := make(chan error, 1)
		go func() {
			octx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer cancel()
			outside <- m.LockContext(octx)
		}()
		if err := <-outside; !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("LockContext outside the scope while f runs: got %v, want DeadlineExceeded", err)
		}
		// A nested Do, and holds a goroutine leaves behind.
		return m.Do(fctx, func(gctx context.Context) error {
			return <-result(func() error { return m.LockContext(gctx) })
		})
	})
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	if keys := lockKeys(t, client, name); len(keys) != 0 {
		t.Errorf("keys after Do: got %q, want none (holds left in the scope end with it)", keys)
	}

	// The kept context, even stripped of its cancel, grants nothing.
	other := etcdlock.NewMutex(newSession(t, client), name)
	if err := other.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	late, cancel := context.WithTimeout(context.WithoutCancel(kept), 200*time.Millisecond)
	defer cancel()
	if err := m.LockContext(late); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("LockContext with a context kept from f, while another session holds: got %v, want DeadlineExceeded", err)
	}
	if err := m.UnlockContext(late); !errors.Is(err, etcdlock.ErrNotHeld) {
		t.Errorf("UnlockContext with a kept context: got %v, want ErrNotHeld", err)
	}
	if err := other.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestDoPanic: f's panic releases the lock and goes on up.
func TestDoPanic(t *testing.T) {
	_, client := startServer(t)
	name := lockName(t)
	m := etcdlock.NewMutex(newSession(t, client), name)
	r := catchPanic(func() {
		_ = m.Do(testContext(t), func(context.Context) error { panic("f failed") })
	})
	if r != "f failed" {
		t.Errorf("panic: got %v, want f's", r)
	}
	if keys := lockKeys(t, client, name); len(keys) != 0 {
		t.Errorf("keys after f panicked: got %q, want none", keys)
	}
}
