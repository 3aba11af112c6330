package etcdlock_test

// State that outlives the truth: a lock must not answer "held" for a hold it
// already knows lost, must not take a refusal from etcd for a request that
// may have been applied, must keep no more than a constant of bookkeeping on
// a lease whatever the failures, must keep nothing where another lock counts
// it, must end a renewing Session whose client was closed, and must warn of
// a loss before the next holder can acquire. Each test judges the outcome in
// etcd, not from the library's own report.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// deleteKey deletes key by hand, as an operator would.
func deleteKey(t *testing.T, client *clientv3.Client, key string) {
	t.Helper()
	resp, err := client.Delete(testContext(t), key)
	if err != nil || resp.Deleted != 1 {
		t.Fatalf("delete %q by hand: got %v (%d deleted), want 1 deleted", key, err, resp.Deleted)
	}
}

// revokeAndRenew revokes the lease in use of s, made WithRenewal, and waits
// until s has a new one.
func revokeAndRenew(t *testing.T, client *clientv3.Client, s *etcdlock.Session) {
	t.Helper()
	old := s.Lease()
	if _, err := client.Revoke(testContext(t), old); err != nil {
		t.Fatalf("revoke: got %v, want nil", err)
	}
	eventually(t, "a new lease", func() bool { return s.Lease() != old })
}

// wantClosed fails the test unless ch closes within doneBound.
func wantClosed(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	if _, ok := closedWithin(ch, doneBound); !ok {
		t.Fatalf("%s: Done still open %v after the loss", what, doneBound)
	}
}

// TestRelockOfLostHold: a goroutine whose hold is known lost (its Done
// closed, or its lease term ended) and that locks again gets ErrLockLost,
// not a second hold of a key that is gone; its count does not change; its
// unlock ends the dead hold; and its next lock takes the lock for real, its
// key the oldest of the queue in etcd.
func TestRelockOfLostHold(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)

	for _, tc := range []struct {
		name  string
		renew bool
	}{{"key deleted", false}, {"lease renewed", true}} {
		t.Run(tc.name, func(t *testing.T) {
			testflags.Parallel(t)
			var opts []etcdlock.SessionOption
			if tc.renew {
				opts = append(opts, etcdlock.WithRenewal(), etcdlock.WithTTL(2*time.Second))
			}
			s := newSession(t, client, opts...)
			name := lockName(t)
			m := etcdlock.NewMutex(s, name)
			ctx := testContext(t)
			if err := m.LockContext(ctx); err != nil {
				t.Fatalf("LockContext: got %v, want nil", err)
			}
			done := m.Done()
			if tc.renew {
				revokeAndRenew(t, client, s)
			} else {
				deleteKey(t, client, m.Key())
			}
			wantClosed(t, "Mutex", done)

			if err := m.LockContext(ctx); !errors.Is(err, etcdlock.ErrLockLost) {
				t.Errorf("LockContext on a lost hold: got %v, want ErrLockLost (keys in etcd: %v)", err, lockKeys(t, client, name))
			}
			if ok, err := m.TryLockFor(ctx, 0); ok || !errors.Is(err, etcdlock.ErrLockLost) {
				t.Errorf("TryLockFor on a lost hold: got (%v, %v), want (false, ErrLockLost)", ok, err)
			}
			if m.TryLock() {
				t.Error("TryLock on a lost hold: got true, want false")
			}
			assertPanics(t, "Lock on a lost hold", "lock lost", m.Lock)
			if n := m.HoldCount(); n != 1 {
				t.Errorf("HoldCount after the re-locks: got %d, want 1", n)
			}

			// The lock is free in etcd: another Session takes it, which is
			// what a re-lock answering nil would have hidden.
			other := etcdlock.NewMutex(newSession(t, client), name)
			if ok, err := other.TryLockFor(ctx, 0); !ok || err != nil {
				t.Fatalf("other Session's TryLockFor: got (%v, %v), want (true, nil)", ok, err)
			}
			if err := m.UnlockContext(ctx); !errors.Is(err, etcdlock.ErrLockLost) && !errors.Is(err, etcdlock.ErrSessionExpired) {
				t.Errorf("UnlockContext of the lost hold: got %v, want ErrLockLost or ErrSessionExpired", err)
			}
			if n := m.HoldCount(); n != 0 {
				t.Errorf("HoldCount after the unlock: got %d, want 0", n)
			}
			w := lockInGoroutine(t, ctx, ours{m})
			if !blocked(w.locked, 200*time.Millisecond) {
				t.Fatal("LockContext after the unlock: returned while the other Session holds")
			}
			if err := other.UnlockContext(ctx); err != nil {
				t.Fatalf("other's UnlockContext: %v", err)
			}
			if err := waitErr(t, w.locked); err != nil {
				t.Fatalf("LockContext after the unlock: got %v, want nil", err)
			}
			if keys := lockKeys(t, client, name); len(keys) != 1 || keys[0] != keyOf(name, s.Lease()) {
				t.Errorf("keys after the new lock: got %v, want [%s]", keys, keyOf(name, s.Lease()))
			}
			if err := w.Release(); err != nil {
				t.Errorf("unlock of the new hold: %v", err)
			}
		})
	}
}

// TestRelockOfLostHoldFamily: the same rule for an RWMutex's readers and
// writers (and a writer's nested read), a MultiMutex, and a goroutine that
// holds through a Do scope.
func TestRelockOfLostHoldFamily(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)

	relock := func(t *testing.T, lock, unlock func(context.Context) error, key func() string, done func() <-chan struct{}) {
		t.Helper()
		ctx := testContext(t)
		if err := lock(ctx); err != nil {
			t.Fatalf("lock: got %v, want nil", err)
		}
		ch := done()
		deleteKey(t, client, key())
		wantClosed(t, "hold", ch)
		if err := lock(ctx); !errors.Is(err, etcdlock.ErrLockLost) {
			t.Errorf("re-lock of a lost hold: got %v, want ErrLockLost", err)
		}
		if err := unlock(ctx); !errors.Is(err, etcdlock.ErrLockLost) {
			t.Errorf("unlock of the lost hold: got %v, want ErrLockLost", err)
		}
		if err := unlock(ctx); !errors.Is(err, etcdlock.ErrNotHeld) {
			t.Errorf("second unlock: got %v, want ErrNotHeld (the re-lock must not have counted)", err)
		}
		if err := lock(ctx); err != nil {
			t.Fatalf("lock after the unlock: got %v, want nil", err)
		}
		if k := key(); k == "" {
			t.Error("lock after the unlock: no key")
		} else if resp, err := client.Get(ctx, k); err != nil || len(resp.Kvs) != 1 {
			t.Errorf("lock after the unlock: key %q not in etcd (%v)", k, err)
		}
		if err := unlock(ctx); err != nil {
			t.Errorf("unlock: %v", err)
		}
	}

	t.Run("reader", func(t *testing.T) {
		testflags.Parallel(t)
		rw := etcdlock.NewRWMutex(newSession(t, client), lockName(t))
		relock(t, rw.RLockContext, rw.RUnlockContext, rw.Key, rw.Done)
	})
	t.Run("writer", func(t *testing.T) {
		testflags.Parallel(t)
		rw := etcdlock.NewRWMutex(newSession(t, client), lockName(t))
		relock(t, rw.LockContext, rw.UnlockContext, rw.Key, rw.Done)
	})
	t.Run("writer's read", func(t *testing.T) {
		testflags.Parallel(t)
		rw := etcdlock.NewRWMutex(newSession(t, client), lockName(t))
		ctx := testContext(t)
		if err := rw.LockContext(ctx); err != nil {
			t.Fatalf("LockContext: %v", err)
		}
		done := rw.Done()
		deleteKey(t, client, rw.Key())
		wantClosed(t, "writer", done)
		if err := rw.RLockContext(ctx); !errors.Is(err, etcdlock.ErrLockLost) {
			t.Errorf("writer's RLockContext on a lost hold: got %v, want ErrLockLost", err)
		}
		if err := rw.UnlockContext(ctx); !errors.Is(err, etcdlock.ErrLockLost) {
			t.Errorf("UnlockContext of the lost hold: got %v, want ErrLockLost", err)
		}
		if err := rw.RUnlockContext(ctx); !errors.Is(err, etcdlock.ErrNotHeld) {
			t.Errorf("RUnlockContext after: got %v, want ErrNotHeld", err)
		}
	})
	t.Run("multi", func(t *testing.T) {
		testflags.Parallel(t)
		name := lockName(t)
		s := newSession(t, client)
		mm := etcdlock.NewMultiMutex(s, name+"-a", name+"-b")
		key := func() string {
			if mm.Token() == 0 {
				return ""
			}
			return keyOf(name+"-b", s.Lease())
		}
		relock(t, mm.LockContext, mm.UnlockContext, key, mm.Done)
	})
	t.Run("do scope", func(t *testing.T) {
		testflags.Parallel(t)
		m := etcdlock.NewMutex(newSession(t, client), lockName(t))
		ctx := testContext(t)
		err := m.Do(ctx, func(fctx context.Context) error {
			deleteKey(t, client, m.Key())
			wantClosed(t, "Do", fctx.Done())
			// A goroutine of the scope, on a context that carries the scope
			// but not its cancel.
			got := make(chan error, 1)
			go func() { got <- m.LockContext(context.WithoutCancel(fctx)) }()
			if err := <-got; !errors.Is(err, etcdlock.ErrLockLost) {
				t.Errorf("re-lock through the Do scope of a lost hold: got %v, want ErrLockLost", err)
			}
			return nil
		})
		if !errors.Is(err, etcdlock.ErrLockLost) {
			t.Errorf("Do: got %v, want ErrLockLost", err)
		}
	})
}

// TestHandOffOfLostHold: a hold known lost is not handed to the next local
// goroutine (WithLocalHandoff): that goroutine takes the lock in etcd, with a
// key of its own.
func TestHandOffOfLostHold(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	s := newSession(t, client, etcdlock.WithLocalHandoff(5))
	name := lockName(t)
	m := etcdlock.NewMutex(s, name)
	ctx := testContext(t)
	if err := m.LockContext(ctx); err != nil {
		t.Fatalf("LockContext: %v", err)
	}
	lost := m.Token()
	done := m.Done()
	next := lockInGoroutine(t, ctx, ours{m})
	eventually(t, "the second goroutine queued", func() bool { return etcdlock.Queued(s, name) == 1 })
	deleteKey(t, client, m.Key())
	wantClosed(t, "Mutex", done)
	if err := m.UnlockContext(ctx); !errors.Is(err, etcdlock.ErrLockLost) {
		t.Errorf("UnlockContext of the lost hold: got %v, want ErrLockLost", err)
	}
	if err := waitErr(t, next.locked); err != nil {
		t.Fatalf("next goroutine's LockContext: got %v, want nil", err)
	}
	tok := m.Token()
	kvs, err := queueKeys(ctx, client, name)
	if err != nil {
		t.Fatal(err)
	}
	if tok == lost || len(kvs) != 1 || kvs[0].CreateRevision != tok {
		t.Errorf("next goroutine's hold: token %d (lost one %d), keys in etcd %v; want a new key whose create revision is the token", tok, lost, kvs)
	}
	if err := next.Release(); err != nil {
		t.Errorf("unlock: %v", err)
	}
}

// TestRenewalClientClosed: a Session made WithRenewal whose client is closed
// can never lease again: it ends (Done closes), its calls return at once
// with ErrSessionExpired, and it reports nothing after that.
func TestRenewalClientClosed(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	c := startClient(t, client)
	var failed atomic.Int64
	s := newSession(t, c, etcdlock.WithRenewal(), etcdlock.WithTTL(2*time.Second),
		etcdlock.WithObserver(etcdlock.ObserverFunc(func(e etcdlock.Event) {
			if e.Kind == etcdlock.SessionFailed {
				failed.Add(1)
			}
		})))
	if err := c.Close(); err != nil {
		t.Fatalf("close the client: %v", err)
	}
	if _, ok := closedWithin(s.Done(), expiredBound); !ok {
		t.Fatalf("Session.Done still open %v after its client was closed", expiredBound)
	}
	before := failed.Load()
	start := time.Now()
	ctx, cancel := context.WithTimeout(testContext(t), 3*time.Second)
	defer cancel()
	err := etcdlock.NewMutex(s, lockName(t)).LockContext(ctx)
	if !errors.Is(err, etcdlock.ErrSessionExpired) {
		t.Errorf("LockContext on the ended Session: got %v, want ErrSessionExpired", err)
	}
	checkBound(t, "LockContext on the ended Session", time.Since(start), expiredBound)
	time.Sleep(1500 * time.Millisecond) // the renewal's backoff is at most 1 s
	if n := failed.Load() - before; n != 0 {
		t.Errorf("SessionFailed events after the Session ended: got %d, want 0", n)
	}
}

// leaseKeys returns the keys attached to the lease.
func leaseKeys(t *testing.T, client *clientv3.Client, lease clientv3.LeaseID) []string {
	t.Helper()
	resp, err := client.TimeToLive(testContext(t), lease, clientv3.WithAttachedKeys())
	if err != nil {
		t.Fatalf("TimeToLive(%x): %v", lease, err)
	}
	keys := make([]string, len(resp.Keys))
	for i, k := range resp.Keys {
		keys[i] = string(k)
	}
	return keys
}

// backgroundDeletes returns how many goroutines of the library retry
// deletes in the background.
func backgroundDeletes() int {
	n := 0
	for _, g := range libraryGoroutines() {
		if strings.Contains(g, "etcdlock.(*retryQueue)") || strings.Contains(g, "releaseLater") {
			n++
		}
	}
	return n
}

// maxBookkeeping is how many keys a Session may keep on a lease besides the
// lock keys it holds or waits with, whatever the number of failures.
const maxBookkeeping = 1

// loseReply applies the Txn in etcd and then fails the call as a lost
// reply does.
func loseReply(_ context.Context, invoke func() error) error {
	if err := invoke(); err != nil {
		return err
	}
	return status.Error(codes.Unavailable, "test: reply lost")
}

// TestBookkeepingBounded: acquisitions whose replies are lost, and
// acquisitions during an outage whose requests may never reach etcd, leave no
// more than maxBookkeeping keys on the Session's lease besides lock keys,
// however many they are, and no goroutine once etcd is back.
func TestBookkeepingBounded(t *testing.T) {
	testflags.Parallel(t)

	t.Run("lost replies", func(t *testing.T) {
		testflags.Parallel(t)
		srv, healthy := startServer(t)
		fault := &txnFault{}
		c := serverClient(t, srv, fault.intercept, nil)
		s := newSession(t, c)
		name := lockName(t)
		sem := etcdlock.NewSemaphore(s, name+"/sem", 2)
		m := etcdlock.NewMutex(s, name+"/mutex")
		ctx := testContext(t)
		for i := range 200 {
			fault.arm(0, 1, loseReply)
			var err error
			switch i % 3 {
			case 0:
				_, err = sem.TryAcquire(ctx, 0)
			case 1:
				_, err = m.TryLockFor(ctx, 0)
			default:
				err = m.LockContext(ctx)
			}
			if err == nil {
				t.Fatalf("acquisition %d with its reply lost: got nil, want an error", i)
			}
		}
		eventually(t, "no lock key left", func() bool {
			return len(lockKeys(t, healthy, name+"/sem")) == 0 && len(lockKeys(t, healthy, name+"/mutex")) == 0
		})
		if keys := leaseKeys(t, healthy, s.Lease()); len(keys) > maxBookkeeping {
			t.Errorf("keys on the lease after 200 acquisitions with lost replies: got %d (%q...), want ≤ %d", len(keys), keys[:min(3, len(keys))], maxBookkeeping)
		}
		fault.arm(0, 0, nil)
		if err := m.LockContext(ctx); err != nil {
			t.Fatalf("LockContext after: %v", err)
		}
		if err := m.UnlockContext(ctx); err != nil {
			t.Fatalf("UnlockContext after: %v", err)
		}
	})

	t.Run("outage", func(t *testing.T) {
		testflags.Parallel(t)
		healthy, proxied, proxy := startProxied(t)
		defer proxy.Unblackhole()
		s := newSession(t, proxied, etcdlock.WithTTL(60*time.Second))
		name := lockName(t)
		sem := etcdlock.NewSemaphore(s, name, 2)
		ctx := testContext(t)
		p, err := sem.Acquire(ctx) // the client is connected, and etcd knows the lease
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
		proxy.Blackhole()
		const attempts = 12
		for range attempts {
			actx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			if _, err := sem.TryAcquire(actx, 0); err == nil {
				t.Fatal("TryAcquire during the outage: got nil, want an error")
			}
			cancel()
		}
		during := backgroundDeletes()
		proxy.Unblackhole()
		// The attempts' puts are unsure: their retried deletes write the
		// fence first. Every retry lands within its backoff (≤ 1 s) and its
		// attempt once etcd answers.
		eventually(t, "the fence written by the retried deletes", func() bool { return len(leaseKeys(t, healthy, s.Lease())) > 0 })
		time.Sleep(2 * time.Second)
		if keys := lockKeys(t, healthy, name); len(keys) != 0 {
			t.Errorf("lock keys after the outage: got %q, want none", keys)
		}
		keys := leaseKeys(t, healthy, s.Lease())
		if len(keys) > maxBookkeeping {
			t.Errorf("keys on the lease after %d attempts during an outage: got %d (%q...), want ≤ %d", attempts, len(keys), keys[:min(3, len(keys))], maxBookkeeping)
		}
		t.Logf("goroutines retrying deletes after %d failed attempts during the outage: %d; keys on the lease once etcd was back: %q", attempts, during, keys)
		if during > 2 {
			t.Errorf("goroutines retrying deletes after %d failed attempts during the outage: got %d, want 1 (one per Session)", attempts, during)
		}
	})
}

// TestParentLockFree: what a lock keeps in etcd besides its keys lies
// where no other lock counts it: after failures of jobs/nightly with nothing
// held or waited for, concurrency.Mutex (so etcdctl lock) and our Mutex take
// "jobs" at once.
func TestParentLockFree(t *testing.T) {
	testflags.Parallel(t)
	srv, healthy := startServer(t)
	fault := &txnFault{}
	c := serverClient(t, srv, fault.intercept, nil)
	s := newSession(t, c)
	parent := lockName(t)
	m := etcdlock.NewMutex(s, parent+"/nightly")
	ctx := testContext(t)
	for range 5 {
		fault.arm(0, 1, loseReply)
		if err := m.LockContext(ctx); err == nil {
			t.Fatal("LockContext with its reply lost: got nil, want an error")
		}
	}
	fault.arm(0, 0, nil)
	if err := m.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
	up := concurrency.NewMutex(newUpstreamSession(t, healthy, 10), parent)
	if err := up.TryLock(ctx); err != nil {
		t.Errorf("concurrency.Mutex(%q).TryLock with nothing held or waited for: got %v, want nil (keys under it: %v)", parent, err, lockKeys(t, healthy, parent))
	} else if err := up.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := etcdlock.NewMutex(newSession(t, healthy), parent).TryLockFor(ctx, 0); !ok || err != nil {
		t.Errorf("Mutex(%q).TryLockFor: got (%v, %v), want (true, nil)", parent, ok, err)
	}
}

// keepAliveMethod is the gRPC method of etcd's lease keep-alives.
const keepAliveMethod = "/etcdserverpb.Lease/LeaseKeepAlive"

// replyDelay records when each keep-alive request is sent, and once armed
// holds the next keep-alive reply for a while, as a slow network does:
// etcd renewed the lease when the request reached it, well before its reply
// arrives.
type replyDelay struct {
	lastSend atomic.Int64  // when the last keep-alive request was sent (Unix ns)
	next     atomic.Int64  // ns to hold the next reply; 0: none
	held     chan struct{} // a reply arrived and is held (buffered: 1)
}

func (d *replyDelay) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || method != keepAliveMethod {
		return cs, err
	}
	return &delayedStream{ClientStream: cs, d: d}, nil
}

// delayedStream passes each keep-alive reply on when it is due: at once,
// or late for the one reply that arrives once armed. The replies of
// requests sent one after the other still come one after the other.
type delayedStream struct {
	grpc.ClientStream
	d       *replyDelay
	once    sync.Once
	replies chan heldReply // from read, until the stream's error
	err     error          // the stream's error, once read
}

type heldReply struct {
	resp *pb.LeaseKeepAliveResponse
	due  time.Time
	err  error
}

func (s *delayedStream) SendMsg(m any) error {
	s.d.lastSend.Store(time.Now().UnixNano())
	return s.ClientStream.SendMsg(m)
}

// read receives the replies as they arrive, and stamps when each is due.
func (s *delayedStream) read() {
	for {
		resp := new(pb.LeaseKeepAliveResponse)
		err := s.ClientStream.RecvMsg(resp)
		r := heldReply{resp: resp, due: time.Now(), err: err}
		if d := time.Duration(s.d.next.Swap(0)); err == nil && d > 0 {
			r.due = r.due.Add(d)
			s.d.held <- struct{}{}
		}
		select {
		case s.replies <- r:
		case <-s.Context().Done():
			return
		}
		if err != nil {
			return
		}
	}
}

func (s *delayedStream) RecvMsg(m any) error {
	s.once.Do(func() {
		s.replies = make(chan heldReply, 64)
		go s.read()
	})
	if s.err != nil {
		return s.err
	}
	var r heldReply
	select {
	case r = <-s.replies:
	case <-s.Context().Done():
		return s.Context().Err()
	}
	if r.err != nil {
		s.err = r.err
		return r.err
	}
	select {
	case <-time.After(time.Until(r.due)):
	case <-s.Context().Done():
		return s.Context().Err()
	}
	out := m.(*pb.LeaseKeepAliveResponse)
	proto.Reset(out)
	proto.Merge(out, r.resp)
	return nil
}

// TestWarningCountsFromSend: one keep-alive reply comes back 1.4 s late
// (TTL 6 s), and the holder is cut off the moment it arrives, so that etcd's
// last renewal of the lease is the one that reply answers. The lease lives
// until a TTL after that renewal, at the least, and no longer than the next
// check of etcd after that: Done must close two thirds of the TTL after the
// renewal was sent (with some slack for timers), not two thirds of the TTL
// after its reply came back, which believes in more lease than there is;
// and before the next holder acquires.
func TestWarningCountsFromSend(t *testing.T) {
	testflags.Parallel(t)
	srv := etcdtest.Start(t)
	healthy := srv.Client(t)
	d := &replyDelay{held: make(chan struct{}, 1)}
	c, proxy := proxiedServerClient(t, srv, nil, d.intercept)
	defer proxy.Unblackhole()
	const (
		ttl   = 6 * time.Second
		late  = 1400 * time.Millisecond
		slack = ttl / 12
	)
	s := aliveSession(t, c, ttl)
	name := lockName(t)
	m := etcdlock.NewMutex(s, name)
	ctx := testContext(t)
	if err := m.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	doneAt := closeTime(m.Done())
	next := etcdlock.NewMutex(newSession(t, healthy), name)
	acquired := make(chan time.Time, 1)
	release := make(chan struct{})
	released := result(func() error {
		defer close(acquired)
		if err := next.LockContext(ctx); err != nil {
			return err
		}
		acquired <- time.Now()
		<-release
		return next.UnlockContext(ctx)
	})
	time.Sleep(ttl / 2) // keep-alives as usual
	d.next.Store(int64(late))
	select {
	case <-d.held:
	case <-time.After(testTimeout):
		t.Fatal("no keep-alive reply came")
	}
	proxy.Blackhole()
	cut := time.Now()
	renewed := time.Unix(0, d.lastSend.Load())
	at, ok := <-acquired
	if !ok {
		t.Fatal("the next holder did not acquire")
	}
	done := doneAt()
	t.Logf("last renewal sent at 0, cut %v; Done closed %v; next holder acquired %v", cut.Sub(renewed).Round(time.Millisecond),
		done.Sub(renewed).Round(time.Millisecond), at.Sub(renewed).Round(time.Millisecond))
	if bound := renewed.Add(2*ttl/3 + slack); done.IsZero() || done.After(bound) {
		t.Errorf("Done closed %v after the last renewal was sent, want ≤ %v", done.Sub(renewed).Round(time.Millisecond), 2*ttl/3+slack)
	}
	if !done.Before(at) {
		t.Errorf("the cut-off holder's Done closed %v after the next holder acquired, want before", done.Sub(at).Round(time.Millisecond))
	}
	close(release)
	if err := waitErr(t, released); err != nil {
		t.Errorf("the next holder's unlock: %v", err)
	}
}

// TestLostWriteHoldKept: a goroutine whose write hold of an RWMutex was lost
// keeps that hold until it unlocks, even once another goroutine of the same
// Session has taken the write lock anew: its unlock answers ErrLockLost,
// not ErrNotHeld, and the other goroutine's hold is untouched.
func TestLostWriteHoldKept(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	rw := etcdlock.NewRWMutex(newSession(t, client), lockName(t))
	ctx := testContext(t)
	if err := rw.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	done := rw.Done()
	deleteKey(t, client, rw.Key())
	wantClosed(t, "writer", done)
	other := lockInGoroutine(t, ctx, funcLocker{rw.LockContext, rw.UnlockContext})
	if err := waitErr(t, other.locked); err != nil {
		t.Fatalf("another goroutine's LockContext once the lock is free: %v", err)
	}
	if err := rw.UnlockContext(ctx); !errors.Is(err, etcdlock.ErrLockLost) {
		t.Errorf("UnlockContext of the lost write hold: got %v, want ErrLockLost", err)
	}
	if keys := lockKeys(t, client, rw.Name()); len(keys) != 1 {
		t.Errorf("keys after the lost hold's unlock: got %v, want the other goroutine's", keys)
	}
	if err := other.Release(); err != nil {
		t.Errorf("the other goroutine's unlock: got %v, want nil", err)
	}
}

// TestTryWhileCleaning: an acquisition whose reply is lost as etcd becomes
// unreachable leaves its key unsure, and its delete goes on in the
// background, keeping the lock's turn in this process. Meanwhile another
// goroutine's try cannot tell whether the key is there: it answers an error
// that says so, not "busy" (nobody else holds or waits); once etcd is back
// the delete lands and the try takes the lock.
func TestTryWhileCleaning(t *testing.T) {
	testflags.Parallel(t)
	srv, healthy := startServer(t)
	var down atomic.Bool // every Txn fails unsent, as with etcd unreachable
	lost := make(chan struct{}, 1)
	c := serverClient(t, srv, func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		switch {
		case method != txnMethod:
		case down.Load():
			return status.Error(codes.Unavailable, "test: etcd unreachable")
		case len(lost) > 0:
			<-lost
			if err := invoker(ctx, method, req, reply, cc, opts...); err != nil {
				return err
			}
			down.Store(true)
			return status.Error(codes.Unavailable, "test: reply lost")
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}, nil)
	s := newSession(t, c)
	name := lockName(t)
	m := etcdlock.NewMutex(s, name)
	ctx := testContext(t)
	lost <- struct{}{}
	if err := m.LockContext(ctx); err == nil {
		t.Fatal("LockContext with its reply lost: got nil, want an error")
	}
	try := func(wait time.Duration) error {
		res := make(chan error, 1)
		go func() {
			ok, err := m.TryLockFor(ctx, wait)
			switch {
			case ok || err == nil:
				err = fmt.Errorf("got (%v, %v)", ok, err)
			case !strings.Contains(err.Error(), "delete is being retried"):
				err = fmt.Errorf("got (false, %v), want the error of a delete being retried", err)
			default:
				err = nil
			}
			res <- err
		}()
		return <-res
	}
	if err := try(0); err != nil {
		t.Errorf("another goroutine's TryLockFor(ctx, 0) while the delete is retried: %v (keys: %v)", err, lockKeys(t, healthy, name))
	}
	if err := try(200 * time.Millisecond); err != nil {
		t.Errorf("another goroutine's TryLockFor(ctx, 200ms) while the delete is retried: %v", err)
	}
	if keys := lockKeys(t, healthy, name); len(keys) != 1 {
		t.Errorf("keys while etcd is unreachable: got %v, want the acquisition's (applied, its reply lost)", keys)
	}
	down.Store(false)
	got := make(chan error, 1)
	go func() {
		var err error
		for deadline := time.Now().Add(testTimeout); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			var ok bool
			if ok, err = m.TryLockFor(ctx, 0); ok {
				got <- m.UnlockContext(ctx)
				return
			}
		}
		got <- fmt.Errorf("never held: the last try: %v", err)
	}()
	if err := <-got; err != nil {
		t.Errorf("TryLockFor once etcd is back: %v (keys: %v)", err, lockKeys(t, healthy, name))
	}
}

// TestWaitCountsOnlyHolders: TryLockFor's wait bounds the time spent
// waiting for others, not for etcd's answers: with etcd silent and nobody
// holding, a TryLockFor(ctx, 200ms) must not answer "busy" after 200 ms (the
// lock may well be free); it waits for etcd until ctx ends, as a try does,
// and returns ctx's error. The same for a Semaphore's TryAcquire, which must
// not answer ErrNoPermit.
func TestWaitCountsOnlyHolders(t *testing.T) {
	testflags.Parallel(t)
	srv, healthy := startServer(t)
	var silent atomic.Bool // every Txn waits for its context, unanswered
	c := serverClient(t, srv, func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == txnMethod && silent.Load() {
			<-ctx.Done()
			return status.FromContextError(ctx.Err()).Err()
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}, nil)
	s := newSession(t, c)
	name := lockName(t)
	m := etcdlock.NewMutex(s, name+"-mutex")
	sem := etcdlock.NewSemaphore(s, name+"-sem", 1)
	silent.Store(true)
	ctx, cancel := context.WithTimeout(testContext(t), time.Second)
	defer cancel()
	if ok, err := m.TryLockFor(ctx, 200*time.Millisecond); ok || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Mutex.TryLockFor(ctx, 200ms) with etcd silent and nobody holding: got (%v, %v), want (false, ctx's deadline)", ok, err)
	}
	ctx, cancel = context.WithTimeout(testContext(t), time.Second)
	defer cancel()
	if p, err := sem.TryAcquire(ctx, 200*time.Millisecond); p != nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Semaphore.TryAcquire(ctx, 200ms) with etcd silent and nobody holding: got (%v, %v), want (nil, ctx's deadline)", p, err)
	}
	silent.Store(false)
	if keys := append(lockKeys(t, healthy, name+"-mutex"), lockKeys(t, healthy, name+"-sem")...); len(keys) != 0 {
		t.Errorf("keys left: %v", keys)
	}
}
