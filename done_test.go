package etcdlock_test

// Mutex.Done, the loss signal: when it closes and when it must not.

import (
	"errors"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

func TestDoneNotHeld(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	s := newSession(t, client)
	m := etcdlock.NewMutex(s, lockName(t))

	for what, mu := range map[string]*etcdlock.Mutex{
		"a fresh Mutex":           m,
		"the empty name":          etcdlock.NewMutex(s, ""),
		"a Mutex with no Session": etcdlock.NewMutex(nil, lockName(t)),
	} {
		d := mu.Done()
		if d == nil {
			t.Fatalf("Done() of %s: got nil, want a closed channel", what)
		}
		if !isClosed(d) {
			t.Errorf("Done() of %s: got an open channel, want a closed one", what)
		}
	}

	m.Lock()
	held := m.Done()
	m.Unlock()
	if !isClosed(held) {
		t.Errorf("Done() of a hold after its unlock: got an open channel, want a closed one")
	}
	if d := m.Done(); d == nil || !isClosed(d) {
		t.Errorf("Done() after the last unlock: got an open or nil channel, want a closed one")
	}
}

func TestDonePerHold(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	s := newSession(t, client)
	name := lockName(t)
	m := etcdlock.NewMutex(s, name)
	other := etcdlock.NewMutex(s, name)

	m.Lock()
	d1 := m.Done()
	if isClosed(d1) {
		t.Fatal("Done() while held: got a closed channel, want an open one")
	}
	if got := other.Done(); got != d1 {
		t.Error("Done() of another handle with the same Session and name: got another channel, want the hold's")
	}
	fromOther := make(chan (<-chan struct{}))
	go func() { fromOther <- m.Done() }()
	if got := <-fromOther; got != d1 {
		t.Error("Done() read by another goroutine: got another channel, want the hold's")
	}

	m.Lock()
	other.Lock()
	if got := m.Done(); got != d1 || isClosed(d1) {
		t.Error("Done() after re-locks: got a new or closed channel, want the same open one")
	}
	other.Unlock()
	m.Unlock()
	if got := m.Done(); got != d1 || isClosed(d1) {
		t.Error("Done() after non-final unlocks: got a new or closed channel, want the same open one")
	}

	m.Unlock()
	if !isClosed(d1) {
		t.Error("Done() of a hold after its last unlock: got an open channel, want it closed")
	}

	m.Lock()
	d2 := m.Done()
	if d2 == d1 || isClosed(d2) {
		t.Error("Done() of a new hold: got the old or a closed channel, want a new open one")
	}
	m.Unlock()
	if !isClosed(d2) {
		t.Error("Done() of the second hold after its unlock: got an open channel, want it closed")
	}
}

// TestDoneKeyDeleted: our key deleted by another client closes Done within
// 2 s, and ends that hold only: the Session, its other locks and new holds
// go on.
func TestDoneKeyDeleted(t *testing.T) {
	testflags.Parallel(t)
	srv, client := startServer(t)
	other := srv.Client(t)
	ctx := testContext(t)
	s := newSession(t, client, etcdlock.WithTTL(5*time.Second))
	name := lockName(t)
	m := etcdlock.NewMutex(s, name)
	sibling := etcdlock.NewMutex(s, name+"-sibling")
	m.Lock()
	sibling.Lock()
	d, sd := m.Done(), sibling.Done()
	siblingToken := sibling.Token()

	if _, err := other.Delete(ctx, m.Key()); err != nil {
		t.Fatalf("delete %q: got %v, want nil", m.Key(), err)
	}
	took, ok := closedWithin(d, doneBound)
	if !ok {
		t.Fatalf("Done() %v after our key was deleted: got open, want closed", doneBound)
	}
	t.Logf("Done closed %v after our key was deleted", took.Round(time.Millisecond))

	if isClosed(s.Done()) {
		t.Fatal("Session.Done() after one lock's key was deleted: got closed, want open")
	}
	if isClosed(sd) {
		t.Error("Done() of another lock on the Session: got closed, want open")
	}
	if got := lockKeys(t, other, name+"-sibling"); len(got) != 1 || sibling.Token() != siblingToken {
		t.Errorf("the other lock: got keys %q and token %d, want its key and token %d", got, sibling.Token(), siblingToken)
	}
	if err := m.UnlockContext(ctx); !errors.Is(err, etcdlock.ErrLockLost) {
		t.Errorf("UnlockContext of the lost hold: got %v, want ErrLockLost", err)
	}

	if err := m.LockContext(ctx); err != nil {
		t.Fatalf("LockContext after the loss: got %v, want nil", err)
	}
	d2 := m.Done()
	if d2 == d || isClosed(d2) {
		t.Error("Done() of the new hold: got the old or a closed channel, want a new open one")
	}
	if got := lockKeys(t, other, name); len(got) != 1 || got[0] != m.Key() {
		t.Errorf("keys of the new hold: got %q, want [%s]", got, m.Key())
	}
	if err := m.UnlockContext(ctx); err != nil {
		t.Errorf("UnlockContext of the new hold: got %v, want nil", err)
	}
	if err := sibling.UnlockContext(ctx); err != nil {
		t.Errorf("UnlockContext of the other lock: got %v, want nil", err)
	}
}

func TestDoneLeaseRevoked(t *testing.T) {
	testflags.Parallel(t)
	srv, client := startServer(t)
	other := srv.Client(t)
	ctx := testContext(t)
	s := newSession(t, client, etcdlock.WithTTL(5*time.Second))
	m := etcdlock.NewMutex(s, lockName(t))
	m.Lock()
	d := m.Done()

	if _, err := other.Revoke(ctx, s.Lease()); err != nil {
		t.Fatalf("revoke: got %v, want nil", err)
	}
	took, ok := closedWithin(d, doneBound)
	if !ok {
		t.Fatalf("Done() %v after the lease was revoked: got open, want closed", doneBound)
	}
	t.Logf("Done closed %v after the lease was revoked", took.Round(time.Millisecond))
	if err := m.UnlockContext(ctx); err == nil {
		t.Error("UnlockContext after the revoke: got nil, want ErrLockLost or ErrSessionExpired")
	}
}

// TestDoneStaysOpen holds a lock for 2.5 TTLs with healthy keep-alives:
// Done must not close while every acknowledgement comes within the 2/3 TTL
// of silence that Done allows. clientv3 sends a keep-alive TTL/3 after the
// last acknowledgement, on a 500 ms tick: the gaps measure TTL/3 rounded up
// to the tick (1 s at TTL 2 s, 1.5 s at TTL 3 s), which leaves 333 ms and
// 500 ms for a late reply. A machine too loaded to keep the lease alive on
// time makes a longer gap; Done may then close, and the test says so
// without failing.
func TestDoneStaysOpen(t *testing.T) {
	testflags.Parallel(t)
	for _, ttl := range []time.Duration{2 * time.Second, 3 * time.Second} {
		t.Run(ttl.String(), func(t *testing.T) {
			t.Parallel()
			_, client := startServer(t)
			s := newSession(t, client, etcdlock.WithTTL(ttl))
			m := etcdlock.NewMutex(s, lockName(t))
			m.Lock()
			defer m.Unlock()
			acks, _ := ackWatch(t, client, s.Lease())
			eventually(t, "a keep-alive acknowledgement", func() bool { return !acks.last().IsZero() })
			silence := ttl - ttl/3 // what Done allows
			hold := 2*ttl + ttl/2
			took, closed := closedWithin(m.Done(), hold)
			gap := acks.longestGap(time.Now())
			switch {
			case !closed:
				t.Logf("TTL %v: Done open through %v; longest gap between keep-alive acks %v (Done closes after %v)",
					ttl, hold, gap.Round(time.Millisecond), silence.Round(time.Millisecond))
			case gap < silence:
				t.Errorf("Done() closed after %v with every keep-alive acknowledged within %v (TTL %v), want open until %v without one",
					took.Round(time.Millisecond), gap.Round(time.Millisecond), ttl, silence.Round(time.Millisecond))
			default:
				t.Logf("TTL %v: Done closed after %v, after %v without a keep-alive ack (the machine was too slow to keep the lease alive on time)",
					ttl, took.Round(time.Millisecond), gap.Round(time.Millisecond))
			}
		})
	}
}
