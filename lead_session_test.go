package etcdlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// Session.Lead: the leader duty on a Session of the caller's, which it
// shares with the process's other locks.

// terms records the holds of Lead's terms, one per run of f.
type terms struct {
	mu    sync.Mutex
	held  []etcdlock.Hold
	start chan struct{}
}

func newTerms() *terms { return &terms{start: make(chan struct{}, 16)} }

func (tr *terms) f(ctx context.Context) error {
	h, _ := etcdlock.HoldFrom(ctx)
	tr.mu.Lock()
	tr.held = append(tr.held, h)
	tr.mu.Unlock()
	tr.start <- struct{}{}
	<-ctx.Done()
	return nil
}

func (tr *terms) last() etcdlock.Hold {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.held[len(tr.held)-1]
}

func (tr *terms) wait(t *testing.T, ctx context.Context, what string) etcdlock.Hold {
	t.Helper()
	select {
	case <-tr.start:
	case <-ctx.Done():
		t.Fatalf("%s: f never ran", what)
	}
	return tr.last()
}

func TestSessionLeadRenews(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	s := newSession(t, client, etcdlock.WithRenewal(), etcdlock.WithTTL(renewTTL))
	name := lockName(t)
	ctx := testContext(t)
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tr := newTerms()
	ended := result(func() error { return s.Lead(lctx, name, tr.f) })

	first := tr.wait(t, ctx, "the first term")
	if first.Lease != s.Lease() {
		t.Errorf("first term's lease: %x, want the Session's %x", first.Lease, s.Lease())
	}
	if _, err := client.Revoke(ctx, first.Lease); err != nil {
		t.Fatal(err)
	}
	second := tr.wait(t, ctx, "the term after the revoke")
	if second.Lease == first.Lease || second.Lease != s.Lease() {
		t.Errorf("second term's lease: %x; want the Session's new lease %x, not %x", second.Lease, s.Lease(), first.Lease)
	}
	if got := lockKeys(t, client, name); len(got) != 1 || got[0] != second.Key {
		t.Errorf("keys in etcd during the second term: %v, want only %s", got, second.Key)
	}
	cancel()
	if err := waitErr(t, ended); !errors.Is(err, context.Canceled) {
		t.Errorf("Lead after its ctx ended: got %v, want context.Canceled", err)
	}
	if isClosed(s.Done()) {
		t.Error("Session.Done closed after Lead returned: Lead does not close the caller's Session")
	}
	if got := lockKeys(t, client, name); len(got) != 0 {
		t.Errorf("keys left after Lead returned: %v", got)
	}
	// The Session takes other locks on as before.
	if m := etcdlock.NewMutex(s, name); !m.TryLock() {
		t.Error("TryLock after Lead returned: got false")
	} else {
		m.Unlock()
	}
}

func TestSessionLeadWithoutRenewal(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	s := newSession(t, client, etcdlock.WithTTL(renewTTL))
	ctx := testContext(t)
	tr := newTerms()
	ended := result(func() error { return s.Lead(ctx, lockName(t), tr.f) })
	h := tr.wait(t, ctx, "the first term")
	if _, err := client.Revoke(ctx, h.Lease); err != nil {
		t.Fatal(err)
	}
	if err := waitErr(t, ended); !errors.Is(err, etcdlock.ErrSessionExpired) {
		t.Errorf("Lead after the lease of a Session without WithRenewal was revoked: got %v, want ErrSessionExpired", err)
	}
}

func TestSessionLeadPanic(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	s := newSession(t, client)
	name := lockName(t)
	r := catchPanic(func() {
		_ = s.Lead(testContext(t), name, func(context.Context) error { panic("duty failed") })
	})
	if r != "duty failed" {
		t.Errorf("Lead's panic: got %v, want f's", r)
	}
	if got := lockKeys(t, client, name); len(got) != 0 {
		t.Errorf("keys left after f panicked: %v", got)
	}
	if isClosed(s.Done()) {
		t.Error("Session.Done closed after f panicked: the Session is the caller's")
	}
}

func TestSessionLeadBadInput(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	s := newSession(t, client)
	f := func(context.Context) error { return nil }
	ctx := testContext(t)
	var none *etcdlock.Session
	var noCtx context.Context
	for _, c := range []struct {
		what string
		err  error
		want error
	}{
		{"nil Session", none.Lead(ctx, "x", f), etcdlock.ErrInvalidArgument},
		{"nil context", s.Lead(noCtx, "x", f), etcdlock.ErrInvalidArgument},
		{"nil function", s.Lead(ctx, "x", nil), etcdlock.ErrInvalidArgument},
		{"empty name", s.Lead(ctx, "", f), etcdlock.ErrInvalidName},
	} {
		if !errors.Is(c.err, c.want) {
			t.Errorf("Lead with %s: got %v, want %v", c.what, c.err, c.want)
		}
	}
	if got := keysUnder(t, client, ""); len(got) != 0 {
		t.Errorf("keys after bad input: %v", got)
	}
}

// keysUnder returns every key under pfx.
func keysUnder(t *testing.T, client *clientv3.Client, pfx string) []string {
	t.Helper()
	resp, err := client.Get(testContext(t), pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, kv := range resp.Kvs {
		keys = append(keys, string(kv.Key))
	}
	return keys
}
