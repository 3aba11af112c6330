package etcdlock_test

// Session: the lease, its options, Close, and how it ends.

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

func TestSessionTTLRoundsUp(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	s := newSession(t, client, etcdlock.WithTTL(1500*time.Millisecond))
	if got, want := s.TTL(), 2*time.Second; got != want {
		t.Errorf("TTL() = %v, want %v", got, want)
	}
	resp, err := client.TimeToLive(testContext(t), s.Lease())
	if err != nil {
		t.Fatal(err)
	}
	if resp.GrantedTTL != 2 {
		t.Errorf("granted TTL = %d s, want 2 s", resp.GrantedTTL)
	}
	if s.Client() != client {
		t.Error("Client() is not the client the Session was made with")
	}
}

func TestSessionDefaultTTL(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	s := newSession(t, client)
	if got := s.TTL(); got != etcdlock.DefaultTTL {
		t.Errorf("TTL() = %v, want %v", got, etcdlock.DefaultTTL)
	}
}

func TestNewSessionBadInput(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	grants := logLeases(client)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	var nilContext context.Context // a nil context is the bad input under test
	for _, tc := range []struct {
		name string
		opts []etcdlock.SessionOption
		want error
	}{
		{"TTL zero", []etcdlock.SessionOption{etcdlock.WithTTL(0)}, etcdlock.ErrInvalidArgument},
		{"TTL negative", []etcdlock.SessionOption{etcdlock.WithTTL(-time.Second)}, etcdlock.ErrInvalidArgument},
		{"lease zero", []etcdlock.SessionOption{etcdlock.WithLease(0)}, etcdlock.ErrInvalidArgument},
		{"nil context", []etcdlock.SessionOption{etcdlock.WithContext(nilContext)}, etcdlock.ErrInvalidArgument},
		{"nil option", []etcdlock.SessionOption{nil}, etcdlock.ErrInvalidArgument},
		{"hand-off negative", []etcdlock.SessionOption{etcdlock.WithLocalHandoff(-1)}, etcdlock.ErrInvalidArgument},
		{"cancelled context", []etcdlock.SessionOption{etcdlock.WithContext(cancelled)}, context.Canceled},
		{"lease not found", []etcdlock.SessionOption{etcdlock.WithLease(0x7eadbeef)}, etcdlock.ErrSessionExpired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := revision(t, client)
			s, err := etcdlock.NewSession(client, tc.opts...)
			if !errors.Is(err, tc.want) {
				t.Errorf("NewSession error = %v, want %v", err, tc.want)
			}
			if s != nil {
				t.Errorf("NewSession returned a Session with error %v", err)
				_ = s.Close()
			}
			if w := wroteSince(t, client, before); len(w) > 0 {
				t.Errorf("writes: %v, want none", w)
			}
			if left := leasesLeft(t, client, grants.granted()...); len(left) != 0 {
				t.Errorf("leases after a failed NewSession = %v, want none", left)
			}
		})
	}
	if _, err := etcdlock.NewSession(nil); !errors.Is(err, etcdlock.ErrInvalidArgument) {
		t.Errorf("NewSession(nil) error = %v, want ErrInvalidArgument", err)
	}
}

func TestSessionWithLease(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	grant, err := client.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	name := lockName(t)
	// A key left by an earlier process on the lease: the new Session adopts
	// it, as concurrency.Mutex does.
	if _, err := client.Put(ctx, keyOf(name, grant.ID), "", clientv3.WithLease(grant.ID)); err != nil {
		t.Fatal(err)
	}
	s := newSession(t, client, etcdlock.WithLease(grant.ID))
	if s.Lease() != grant.ID {
		t.Fatalf("Lease() = %x, want %x", s.Lease(), grant.ID)
	}
	if s.TTL() != 30*time.Second {
		t.Errorf("TTL() = %v, want 30s", s.TTL())
	}
	m := etcdlock.NewMutex(s, name)
	if err := m.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	if keys := lockKeys(t, client, name); len(keys) != 1 {
		t.Errorf("keys = %q, want the adopted one", keys)
	}
	if err := m.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if ttl, err := client.TimeToLive(ctx, grant.ID); err != nil || ttl.TTL != -1 {
		t.Errorf("lease after Close: TTL %d, err %v, want revoked (-1)", ttl.TTL, err)
	}
}

func TestSessionClose(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	s := newSession(t, client)
	name := lockName(t)
	m := etcdlock.NewMutex(s, name)
	m.Lock()
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	select {
	case <-s.Done():
	default:
		t.Fatal("Done() not closed after Close")
	}
	if keys := lockKeys(t, client, name); len(keys) != 0 {
		t.Errorf("keys after Close = %q, want none (lease revoked)", keys)
	}
	// The hold ends; its loss is reported.
	if err := m.UnlockContext(ctx); !errors.Is(err, etcdlock.ErrSessionExpired) {
		t.Errorf("UnlockContext after Close = %v, want ErrSessionExpired", err)
	}
	if err := m.UnlockContext(ctx); !errors.Is(err, etcdlock.ErrNotHeld) {
		t.Errorf("second UnlockContext = %v, want ErrNotHeld", err)
	}
	if err := m.LockContext(ctx); !errors.Is(err, etcdlock.ErrSessionExpired) {
		t.Errorf("LockContext after Close = %v, want ErrSessionExpired", err)
	}
	if m.TryLock() {
		t.Error("TryLock after Close = true, want false")
	}
	if ok, err := m.TryLockFor(ctx, time.Second); ok || !errors.Is(err, etcdlock.ErrSessionExpired) {
		t.Errorf("TryLockFor after Close = %v, %v, want false, ErrSessionExpired", ok, err)
	}
	assertPanics(t, "Lock after Close", "LockContext", m.Lock)
}

func TestSessionWithContextCancel(t *testing.T) {
	_, client := startServer(t)
	ctx := testContext(t)
	sctx, cancel := context.WithCancel(ctx)
	s := newSession(t, client, etcdlock.WithContext(sctx))
	name := lockName(t)
	m := etcdlock.NewMutex(s, name)
	m.Lock()
	cancel()
	if _, ok := closedWithin(s.Done(), testTimeout); !ok {
		t.Fatal("Done() not closed after the session context was cancelled")
	}
	eventually(t, "the lease revoked", func() bool { return len(lockKeys(t, client, name)) == 0 })
	if err := m.LockContext(ctx); !errors.Is(err, etcdlock.ErrSessionExpired) {
		t.Errorf("LockContext after cancel = %v, want ErrSessionExpired", err)
	}
	if err := m.UnlockContext(ctx); !errors.Is(err, etcdlock.ErrSessionExpired) {
		t.Errorf("UnlockContext after cancel = %v, want ErrSessionExpired", err)
	}
}

// TestSessionRevokedElsewhere: the lease revoked by another client ends the
// Session at its next keep-alive, within TTL/4 + a round trip (asserted:
// twice TTL/3 + 1 s).
func TestSessionRevokedElsewhere(t *testing.T) {
	testflags.Parallel(t)
	const ttl = 3 * time.Second
	_, client := startServer(t)
	ctx := testContext(t)
	s := newSession(t, client, etcdlock.WithTTL(ttl))
	m := etcdlock.NewMutex(s, lockName(t))
	m.Lock()
	if _, err := client.Revoke(ctx, s.Lease()); err != nil {
		t.Fatal(err)
	}
	took, ok := closedWithin(s.Done(), testTimeout)
	if !ok {
		t.Fatal("Done() not closed after the lease was revoked")
	}
	checkBound(t, "Session.Done after the revoke", took, 2*(ttl/3+time.Second))
	if err := m.UnlockContext(ctx); !errors.Is(err, etcdlock.ErrSessionExpired) {
		t.Errorf("UnlockContext = %v, want ErrSessionExpired", err)
	}
	if err := m.LockContext(ctx); !errors.Is(err, etcdlock.ErrSessionExpired) {
		t.Errorf("LockContext = %v, want ErrSessionExpired", err)
	}
}

// TestSessionWithContextEndsDuringNewSession: a WithContext context that
// ends while NewSession runs, or just after, on a goroutine that nothing
// orders with NewSession's (a timer's), ends the Session as Close does,
// without a data race (run with -race): the Session that NewSession
// returned delivers SessionClosed, and Close returns the revoke's result.
func TestSessionWithContextEndsDuringNewSession(t *testing.T) {
	_, client := startServer(t)
	start := time.Now()
	_ = newSession(t, client)
	setup := time.Since(start)
	made := 0
	for i := range 50 {
		// From at once to twice a NewSession's time.
		sctx, cancel := context.WithTimeout(testContext(t), setup*time.Duration(i)/25)
		log := &eventLog{}
		s, err := etcdlock.NewSession(client, etcdlock.WithContext(sctx), etcdlock.WithObserver(log))
		if err != nil {
			cancel()
			continue
		}
		made++
		log.wait(t, "SessionClosed", func(e etcdlock.Event) bool { return e.Kind == etcdlock.SessionClosed })
		if err := s.Close(); err != nil {
			t.Errorf("Close after the context ended: got %v, want nil", err)
		}
		cancel()
	}
	t.Logf("%d of 50 Sessions made before their context ended (NewSession took %v)", made, setup)
	if made == 0 {
		t.Fatal("no NewSession returned a Session before its context ended: nothing tested")
	}
}
