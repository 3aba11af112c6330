package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// A Session made WithRenewal outlives its leases: after a loss, the holds on
// the lost lease are reported lost before it can expire, nothing of its keys
// is left, and the Session takes locks again on a new lease.

// renewTTL is the lease TTL of the renewal tests.
const renewTTL = 3 * time.Second

// renewBound is how soon after the network's return (or the loss) a
// renewing Session takes locks again: the promise is 2 TTLs, with 2× slack.
const renewBound = 2 * 2 * renewTTL

// leaseWatch follows a lease from a healthy client, and tells when it was
// first seen gone.
type leaseWatch struct {
	gone atomic.Int64 // Unix ns; 0 while seen alive
	stop func()
}

func watchLease(t *testing.T, client *clientv3.Client, id clientv3.LeaseID) *leaseWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &leaseWatch{}
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			rctx, rcancel := context.WithTimeout(ctx, time.Second)
			resp, err := client.TimeToLive(rctx, id)
			rcancel()
			// TTL is whole seconds left, 0 in the last one: gone is -1.
			if err == nil && resp.TTL < 0 || errors.Is(err, rpctypes.ErrLeaseNotFound) {
				w.gone.Store(time.Now().UnixNano())
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	w.stop = func() { cancel(); wg.Wait() }
	t.Cleanup(w.stop)
	return w
}

// goneAt returns when the lease was first seen gone; zero if it was not.
func (w *leaseWatch) goneAt() time.Time {
	if ns := w.gone.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// checkLostBeforeExpiry checks that done closed (at closed) no later than
// the lease was seen gone, if it was. Both times are when a goroutine saw
// it: a process stalled by a loaded machine sees both at once, and the
// order in etcd is then unknown; a Done that closes only after the expiry
// (at the renewal, say) is seen later.
func checkLostBeforeExpiry(t *testing.T, what string, closed func() time.Time, w *leaseWatch) {
	t.Helper()
	at := closed()
	if at.IsZero() {
		t.Errorf("%s: Done still open after the lease was lost", what)
		return
	}
	if gone := w.goneAt(); !gone.IsZero() && at.After(gone) {
		t.Errorf("%s: Done closed at %v, after the lease was seen gone at %v", what, at.Format("15:04:05.000"), gone.Format("15:04:05.000"))
	}
}

// checkNothingLeft checks, in etcd, that no key of lease is under any of
// names, and that the lease is gone.
func checkNothingLeft(t *testing.T, client *clientv3.Client, lease clientv3.LeaseID, names ...string) {
	t.Helper()
	for _, name := range names {
		if keys := keysOfLease(t, client, name, lease); len(keys) > 0 {
			t.Errorf("keys of the lost lease %x left under %q: %v", lease, name, keys)
		}
	}
	if leaseAlive(t, client, lease) {
		t.Errorf("the lost lease %x is still alive", lease)
	}
}

func TestRenewalAfterPartition(t *testing.T) {
	testflags.Parallel(t)
	healthy, pc, proxy := startProxied(t)
	defer proxy.Unblackhole()
	log := &eventLog{}
	s := newSession(t, pc, etcdlock.WithRenewal(), etcdlock.WithTTL(renewTTL), etcdlock.WithObserver(log))
	name := lockName(t)
	mName, rwName, semName, laterName, tryName := name+"-mutex", name+"-rw", name+"-sem", name+"-later", name+"-try"
	ctx := testContext(t)

	m := etcdlock.NewMutex(s, mName)
	rw := etcdlock.NewRWMutex(s, rwName)
	sem := etcdlock.NewSemaphore(s, semName, 2)
	if err := m.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rw.RLockContext(ctx); err != nil {
		t.Fatal(err)
	}
	permit, err := sem.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	old := s.Lease()
	mClosed, rwClosed, pClosed := closeTime(m.Done()), closeTime(rw.Done()), closeTime(permit.Done())
	w := watchLease(t, healthy, old)

	proxy.Blackhole()
	cut := time.Now()
	// Longer than the TTL: the keep-alive gives the lease up; and long
	// enough for the renewal's first revoke of it to fail (2 s).
	const outage = renewTTL + 4*time.Second
	time.Sleep(outage)
	if !isClosed(m.Done()) {
		t.Errorf("Mutex.Done open after %v without etcd", outage)
	}
	if got := s.Lease(); got != old {
		t.Errorf("Session.Lease while no new lease can be had: got %x, want the lost one, %x", got, old)
	}
	if isClosed(s.Done()) {
		t.Error("Session.Done closed after a partition: a renewing Session outlives its lease")
	}
	// (A lock of its own: m's holder would re-enter its lost hold.)
	if try := etcdlock.NewMutex(s, tryName); try.TryLock() {
		t.Error("TryLock while etcd is unreachable and the lease lost: got true")
		try.Unlock()
	}
	// Lock blocks until it can try again, instead of panicking.
	later := etcdlock.NewMutex(s, laterName)
	locked := result(func() error {
		if r := catchPanic(later.Lock); r != nil {
			return fmt.Errorf("Lock panicked: %v", r)
		}
		return later.UnlockContext(context.Background())
	})
	if !blocked(locked, 200*time.Millisecond) {
		t.Errorf("Lock without a lease: returned %v, want it to block until a new lease", waitErr(t, locked))
	}

	proxy.Unblackhole()
	back := time.Now()
	checkLostBeforeExpiry(t, "Mutex", mClosed, w)
	checkLostBeforeExpiry(t, "RWMutex", rwClosed, w)
	checkLostBeforeExpiry(t, "Semaphore permit", pClosed, w)

	// The lost holds end as holds do: an unlock each, which reports the loss.
	if err := m.UnlockContext(ctx); err == nil {
		t.Error("UnlockContext of a hold on the lost lease: got nil, want an error")
	}
	_ = rw.RUnlockContext(ctx)
	_ = permit.Release(ctx)

	eventually(t, "TryLock on the new lease", m.TryLock)
	checkBound(t, "TryLock again after the network's return", time.Since(back), renewBound)
	if err := waitErr(t, locked); err != nil {
		t.Error(err)
	}
	checkBound(t, "Lock again after the network's return", time.Since(back), renewBound)
	p2, err := sem.Acquire(ctx)
	if err != nil {
		t.Fatalf("Semaphore.Acquire on the new lease: %v", err)
	}
	checkBound(t, "Semaphore.Acquire again after the network's return", time.Since(back), renewBound)
	if err := rw.RLockContext(ctx); err != nil {
		t.Fatalf("RLockContext on the new lease: %v", err)
	}

	now := s.Lease()
	if now == old {
		t.Fatalf("Lease after the loss: still %x", old)
	}
	if h, _ := m.Held(); h.Lease != now || h.Key != fmt.Sprintf("%s/%x", mName, now) {
		t.Errorf("Mutex hold after the renewal: lease %x, key %q; want lease %x, key %s/%x", h.Lease, h.Key, now, mName, now)
	}
	if got := lockKeys(t, healthy, mName); len(got) != 1 || got[0] != fmt.Sprintf("%s/%x", mName, now) {
		t.Errorf("keys of %s in etcd: %v, want only the new lease's", mName, got)
	}
	checkNothingLeft(t, healthy, old, mName, rwName, semName, laterName, tryName)
	if isClosed(s.Done()) {
		t.Error("Session.Done closed after the renewal")
	}
	e := log.wait(t, "LeaseRenewed", func(e etcdlock.Event) bool { return e.Kind == etcdlock.LeaseRenewed })
	if e.OldLease != old || e.Lease != now {
		t.Errorf("LeaseRenewed: lease %x, old %x; want %x, %x", e.Lease, e.OldLease, now, old)
	}
	checkBound(t, "LeaseRenewed after the network's return", e.Time.Sub(back), renewBound)
	// The lease is lost a TTL after the last renewal sent (before the cut);
	// the renewal's first revoke of it fails after its 2 s bound.
	if failed := log.find(func(e etcdlock.Event) bool { return e.Kind == etcdlock.SessionFailed }); len(failed) == 0 {
		t.Error("no SessionFailed while etcd was unreachable")
	} else {
		checkBound(t, "the first SessionFailed after the cut", failed[0].Time.Sub(cut), 2*(renewTTL+2*time.Second))
		t.Logf("SessionFailed while etcd was unreachable: %d, the first %v after the cut", len(failed), failed[0].Time.Sub(cut).Round(time.Millisecond))
	}
	for _, lock := range []string{mName, rwName, semName} {
		e := log.wait(t, "HoldLost of "+lock, func(e etcdlock.Event) bool {
			return e.Kind == etcdlock.HoldLost && e.Lock == lock && e.Lease == old
		})
		t.Logf("HoldLost of %s at %s: %s", lock, e.Time.Format("15:04:05.000"), e.Reason)
	}
	for _, e := range log.find(func(e etcdlock.Event) bool { return e.Kind == etcdlock.KeptAlive }) {
		t.Logf("KeptAlive at %s: margin %v, err %v", e.Time.Format("15:04:05.000"), e.Margin.Round(time.Millisecond), e.Err)
	}
	t.Logf("partition from %s; lease seen gone at %s", cut.Format("15:04:05.000"), w.goneAt().Format("15:04:05.000"))

	m.Unlock()
	_ = rw.RUnlockContext(ctx)
	_ = p2.Release(ctx)
}

// A lease revoked by anyone: the holds are lost, the Session goes on with a
// new lease, and a call under way on the lost lease returns
// ErrSessionExpired.
func TestRenewalAfterRevoke(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	s := newSession(t, client, etcdlock.WithRenewal(), etcdlock.WithTTL(renewTTL))
	other := newSession(t, client)
	name := lockName(t)
	ctx := testContext(t)

	m := etcdlock.NewMutex(s, name)
	m.Lock()
	done := m.Done()
	// A call under way: waiting behind another holder.
	blocker := etcdlock.NewMutex(other, name+"-busy")
	blocker.Lock()
	waiting := etcdlock.NewMutex(s, name+"-busy")
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	queued := result(func() error { return waiting.LockContext(wctx) })
	eventually(t, "the waiter's key", func() bool { return len(lockKeys(t, client, name+"-busy")) == 2 })

	old := s.Lease()
	if _, err := client.Revoke(ctx, old); err != nil {
		t.Fatal(err)
	}
	if _, ok := closedWithin(done, 2*2*time.Second); !ok {
		t.Error("Mutex.Done: still open after the lease was revoked")
	}
	if err := waitErr(t, queued); !errors.Is(err, etcdlock.ErrSessionExpired) {
		t.Errorf("LockContext under way on the revoked lease: got %v, want ErrSessionExpired", err)
	}
	if err := m.UnlockContext(ctx); err == nil {
		t.Error("UnlockContext of a hold on the revoked lease: got nil")
	}

	start := time.Now()
	if err := m.LockContext(ctx); err != nil {
		t.Fatalf("LockContext after the revoke: %v", err)
	}
	checkBound(t, "LockContext after the revoke", time.Since(start), renewBound)
	if s.Lease() == old {
		t.Errorf("Lease after the revoke: still %x", old)
	}
	checkNothingLeft(t, client, old, name, name+"-busy")
	// And a new wait on the new lease gets the lock once it is free.
	queued = result(func() error {
		if err := waiting.LockContext(wctx); err != nil {
			return err
		}
		return waiting.UnlockContext(wctx)
	})
	blocker.Unlock()
	if err := waitErr(t, queued); err != nil {
		t.Errorf("LockContext on the new lease: %v", err)
	}
	m.Unlock()
}

// Close while the Session has no lease (etcd unreachable): it returns
// within its bound, the renewal stops, and no lease is left once etcd is
// back and the TTL has run.
func TestRenewalClosedWithoutLease(t *testing.T) {
	testflags.Parallel(t)
	healthy, pc, proxy := startProxied(t)
	defer proxy.Unblackhole()
	grants := logLeases(pc)
	s, err := etcdlock.NewSession(pc, etcdlock.WithRenewal(), etcdlock.WithTTL(renewTTL))
	if err != nil {
		t.Fatal(err)
	}
	old := s.Lease()
	proxy.Blackhole()
	time.Sleep(renewTTL + renewTTL/2)
	start := time.Now()
	err = s.Close()
	checkBound(t, "Close without a lease", time.Since(start), 2*5*time.Second)
	t.Logf("Close: %v", err)
	if !isClosed(s.Done()) {
		t.Error("Session.Done open after Close")
	}
	m := etcdlock.NewMutex(s, lockName(t))
	if m.TryLock() {
		t.Error("TryLock after Close: got true")
	}
	if err := m.LockContext(testContext(t)); !errors.Is(err, etcdlock.ErrSessionExpired) {
		t.Errorf("LockContext after Close: got %v, want ErrSessionExpired", err)
	}
	assertPanics(t, "Lock after Close", "LockContext", m.Lock)
	proxy.Unblackhole()
	eventually(t, "no lease left", func() bool {
		return len(leasesLeft(t, healthy, grants.granted()...)) == 0
	})
	if leaseAlive(t, healthy, old) {
		t.Errorf("lease %x alive after Close", old)
	}
}

// grantFaults is a client interceptor that, once armed, acts on the reply
// of the next LeaseGrant: lost (the lease is granted, the reply is not
// delivered) or revoked (the lease is revoked before the reply is
// delivered).
type grantFaults struct {
	healthy *clientv3.Client
	armed   atomic.Bool
	revoke  bool
	granted chan clientv3.LeaseID // the leases the faults acted on
}

func (g *grantFaults) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	resp, ok := reply.(*pb.LeaseGrantResponse)
	if err != nil || !ok || !g.armed.CompareAndSwap(true, false) {
		return err
	}
	id := clientv3.LeaseID(resp.ID)
	g.granted <- id
	if g.revoke {
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := g.healthy.Revoke(rctx, id)
		return err
	}
	return errors.New("test: the reply of LeaseGrant lost")
}

// The renewal's seams: the new lease's grant with its reply lost, and the
// new lease revoked as it is granted. Each time the Session renews again,
// takes locks within the bound, and leaves no key or lease behind.
func TestRenewalSeams(t *testing.T) {
	testflags.Parallel(t)
	for _, revoke := range []bool{false, true} {
		what := "grant reply lost"
		if revoke {
			what = "revoked during renewal"
		}
		t.Run(what, func(t *testing.T) {
			srv, healthy := startServer(t)
			g := &grantFaults{healthy: healthy, revoke: revoke, granted: make(chan clientv3.LeaseID, 1)}
			client := serverClient(t, srv, g.unary, nil)
			s := newSession(t, client, etcdlock.WithRenewal(), etcdlock.WithTTL(renewTTL))
			name := lockName(t)
			ctx := testContext(t)
			m := etcdlock.NewMutex(s, name)
			m.Lock()
			old := s.Lease()

			g.armed.Store(true)
			start := time.Now()
			if _, err := healthy.Revoke(ctx, old); err != nil {
				t.Fatal(err)
			}
			var faulted clientv3.LeaseID
			select {
			case faulted = <-g.granted:
			case <-ctx.Done():
				t.Fatal("the renewal's grant never came")
			}
			_ = m.UnlockContext(ctx)
			// A call that starts on the faulted lease fails with
			// ErrSessionExpired, as every call under way on a lost lease
			// does: the Session lives on, call again.
			err := m.LockContext(ctx)
			for errors.Is(err, etcdlock.ErrSessionExpired) && !isClosed(s.Done()) {
				err = m.LockContext(ctx)
			}
			if err != nil {
				t.Fatalf("LockContext after the renewal: %v", err)
			}
			checkBound(t, "LockContext after the "+what, time.Since(start), renewBound)
			now := s.Lease()
			if now == old || now == faulted {
				t.Errorf("lease in use: %x; want a lease other than the lost %x and the faulted %x", now, old, faulted)
			}
			if h, _ := m.Held(); h.Lease != now {
				t.Errorf("hold's lease: %x, want %x", h.Lease, now)
			}
			checkNothingLeft(t, healthy, old, name)
			// The faulted lease, granted but never kept alive (its reply was
			// lost) or revoked, is gone within its TTL.
			eventually(t, "the faulted lease gone", func() bool { return !leaseAlive(t, healthy, faulted) })
			if keys := keysOfLease(t, healthy, name, faulted); len(keys) > 0 {
				t.Errorf("keys of the faulted lease: %v", keys)
			}
			m.Unlock()
		})
	}
}

// A Session without WithRenewal ends with its lease, as before: Done
// closes, and the context methods return ErrSessionExpired.
func TestNoRenewalEndsWithLease(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	s := newSession(t, client, etcdlock.WithTTL(renewTTL))
	old := s.Lease()
	if _, err := client.Revoke(testContext(t), old); err != nil {
		t.Fatal(err)
	}
	if _, ok := closedWithin(s.Done(), 2*(renewTTL/3+time.Second)); !ok {
		t.Fatal("Session.Done open after its lease was revoked")
	}
	time.Sleep(2 * renewTTL / 3)
	if s.Lease() != old {
		t.Errorf("Lease: %x, want still %x: a Session without WithRenewal does not renew", s.Lease(), old)
	}
	m := etcdlock.NewMutex(s, lockName(t))
	if err := m.LockContext(testContext(t)); !errors.Is(err, etcdlock.ErrSessionExpired) {
		t.Errorf("LockContext: got %v, want ErrSessionExpired", err)
	}
}

// deafStream drops the replies of a lease keep-alive stream while deaf is
// set: the requests reach etcd, which keeps renewing the lease, while the
// client hears nothing and gives the lease up after a TTL.
type deafStream struct {
	grpc.ClientStream
	deaf *atomic.Bool
}

func (d *deafStream) RecvMsg(m any) error {
	for {
		if err := d.ClientStream.RecvMsg(m); err != nil || !d.deaf.Load() {
			return err
		}
	}
}

// The renewal's revoke of a lease that etcd still has (the client gave it
// up while etcd kept it alive), with the revoke's reply lost after etcd
// applied it: the revoke deletes the old lease's keys, the retry finds the
// lease gone, and the Session goes on with a new lease; nothing of the old
// one is left.
func TestRenewalRevokesLiveLease(t *testing.T) {
	testflags.Parallel(t)
	srv, healthy := startServer(t)
	var deaf atomic.Bool
	var aliveAtRevoke, revoking atomic.Bool
	unary := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method != "/etcdserverpb.Lease/LeaseRevoke" || !deaf.CompareAndSwap(true, false) {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		// The renewal's revoke: the old lease is still in etcd, with our
		// key; the new lease's keep-alive will be heard.
		id := clientv3.LeaseID(req.(*pb.LeaseRevokeRequest).ID)
		ttl, alive := leaseTTL(t, healthy, id)
		t.Logf("the renewal revokes lease %x: alive %v, %d s left", id, alive, ttl)
		aliveAtRevoke.Store(alive)
		revoking.Store(true)
		if err := invoker(ctx, method, req, reply, cc, opts...); err != nil {
			return err
		}
		return errors.New("test: the reply of LeaseRevoke lost")
	}
	stream := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil || method != "/etcdserverpb.Lease/LeaseKeepAlive" {
			return cs, err
		}
		return &deafStream{ClientStream: cs, deaf: &deaf}, nil
	}
	client := serverClient(t, srv, unary, stream)
	s := newSession(t, client, etcdlock.WithRenewal(), etcdlock.WithTTL(renewTTL))
	name := lockName(t)
	ctx := testContext(t)
	m := etcdlock.NewMutex(s, name)
	m.Lock()
	old, oldKey := s.Lease(), m.Key()

	deaf.Store(true)
	if _, ok := closedWithin(m.Done(), 2*renewTTL); !ok {
		t.Fatal("Mutex.Done open while no keep-alive reply came")
	}
	eventually(t, "the renewal's revoke", revoking.Load)
	if !aliveAtRevoke.Load() {
		t.Error("the old lease was gone before the renewal revoked it: the case did not test a live lease")
	}
	// At once, not after the old lease's own expiry (2 s on): the revoke
	// took it, and its key.
	eventually(t, "the new lease", func() bool { return s.Lease() != old })
	if leaseAlive(t, healthy, old) {
		t.Errorf("the old lease %x is alive after the renewal: its keys wait for its expiry", old)
	}
	_ = m.UnlockContext(ctx)
	err := m.LockContext(ctx)
	for errors.Is(err, etcdlock.ErrSessionExpired) && !isClosed(s.Done()) {
		err = m.LockContext(ctx)
	}
	if err != nil {
		t.Fatalf("LockContext after the renewal: %v", err)
	}
	if s.Lease() == old {
		t.Errorf("Lease after the renewal: still %x", old)
	}
	if got := lockKeys(t, healthy, name); len(got) != 1 || got[0] == oldKey {
		t.Errorf("keys of %s: %v, want only the new lease's (not %s)", name, got, oldKey)
	}
	checkNothingLeft(t, healthy, old, name)
	m.Unlock()
}
