package etcdlock_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/queue"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// The guarantees every member of the family keeps, tested once for all of
// them through one interface: nothing left behind on cancel at any point, a
// waiter whose own lease goes returns promptly, a try that fails writes
// nothing, a fenced release, bad input gets an error.

// A member makes locks of one kind, and holders that block them.
type member struct {
	name string
	open func(s *etcdlock.Session, name string) famLock
	// blocker returns a lock that, held, makes open's lock wait.
	blocker func(s *etcdlock.Session, name string) famLock
	// ahead is how many waiters between the holder and a waiter make it
	// read its place when they go: one for a lock (a Mutex's only waiter
	// takes the holder's delete with no read); for a semaphore, as many as
	// wait near the head, where a waiter counts its turn from the queue's
	// events.
	ahead int
}

var family = []member{
	{"Mutex", openMutex, openMutex, 1},
	{"RWMutex write", openWriter, openReader, 1},
	{"RWMutex read", openReader, openWriter, 1},
	{"Semaphore 1", openSemaphore(1), openSemaphore(1), queue.NearHead},
	{"Semaphore 2", openSemaphore(2), blockSemaphore(2), queue.NearHead},
}

func openMutex(s *etcdlock.Session, name string) famLock {
	return mutexLock{etcdlock.NewMutex(s, name)}
}
func openWriter(s *etcdlock.Session, name string) famLock {
	return writeLock{etcdlock.NewRWMutex(s, name)}
}
func openReader(s *etcdlock.Session, name string) famLock {
	return readLock{etcdlock.NewRWMutex(s, name)}
}
func openSemaphore(limit int) func(s *etcdlock.Session, name string) famLock {
	return func(s *etcdlock.Session, name string) famLock {
		return &semLock{sem: etcdlock.NewSemaphore(s, name, limit), n: 1}
	}
}

// blockSemaphore returns a holder of every permit of a semaphore.
func blockSemaphore(limit int) func(s *etcdlock.Session, name string) famLock {
	return func(s *etcdlock.Session, name string) famLock {
		return &semLock{sem: etcdlock.NewSemaphore(s, name, limit), n: limit}
	}
}

// forFamily runs f for each member, as a subtest.
func forFamily(t *testing.T, f func(t *testing.T, p member)) {
	for _, p := range family {
		t.Run(p.name, func(t *testing.T) { f(t, p) })
	}
}

// mustLock takes l, failing the test if it cannot.
func mustLock(t *testing.T, l famLock) {
	t.Helper()
	if err := l.Lock(testContext(t)); err != nil {
		t.Fatalf("lock: %v", err)
	}
}

// TestFamilyCancelAfterApply (D3): a call cancelled after etcd applied its
// Txn, at every point of the acquisition (the enqueue, the read after a
// wait), returns the context's error and leaves no key behind.
func TestFamilyCancelAfterApply(t *testing.T) {
	testflags.Parallel(t)
	srv, client := startServer(t)
	var fault txnFault
	ic := serverClient(t, srv, fault.intercept, nil)

	forFamily(t, func(t *testing.T, p member) {
		for _, tc := range []struct {
			name      string
			try       bool
			wait      time.Duration
			contended bool // a holder blocks us
			skip      int  // Txns let through before the cancel
			lose      bool // the reply is lost
			release   bool // the holder unlocks once our key is queued behind another waiter
		}{
			{name: "Lock", lose: true},
			{name: "Lock reply after cancel"},
			{name: "TryLock wait", try: true, wait: 5 * time.Second, lose: true},
			{name: "TryLock wait reply after cancel", try: true, wait: 5 * time.Second},
			{name: "TryLock no wait", try: true, lose: true},
			{name: "Lock queued", contended: true, lose: true},
			{name: "TryLock queued", try: true, wait: 5 * time.Second, contended: true, lose: true},
			// The read after a wake-up is a Txn too. A waiter between the
			// holder and us makes every member read when the holder goes
			// (a Mutex's only waiter takes the holder's delete with no read).
			{name: "Lock waiting", contended: true, skip: 1, lose: true, release: true},
			{name: "TryLock waiting", try: true, wait: 5 * time.Second, contended: true, skip: 1, lose: true, release: true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				name := lockName(t)
				ctx := testContext(t)
				// The holder is held by a goroutine of its own, which the
				// release may come from.
				var holder *worker
				if tc.contended {
					holder = lockInGoroutine(t, ctx, famLocker{p.blocker(newSession(t, client), name)})
					if err := waitErr(t, holder.locked); err != nil {
						t.Fatal(err)
					}
				}
				released := make(chan error, 1)
				// holderGoes is set as the holder releases; gate keeps it
				// from being set while a Txn let through before it is in
				// flight, which would see the holder gone and hold.
				var holderGoes atomic.Bool
				var gate sync.Mutex
				var middles []*worker
				if tc.release {
					for range p.ahead {
						keys := len(lockKeys(t, client, name))
						middles = append(middles, lockInGoroutine(t, ctx, famLocker{p.open(newSession(t, client), name)}))
						eventually(t, "the middle waiter queued", func() bool { return len(lockKeys(t, client, name)) > keys })
					}
					before := len(lockKeys(t, client, name))
					go func() {
						if err := waitUntil(ctx, func() bool { return len(lockKeys(t, client, name)) > before }); err != nil {
							released <- err
							return
						}
						// The holder, then the middle waiters, leave: we are
						// woken by a release and read our place.
						gate.Lock()
						holderGoes.Store(true)
						gate.Unlock()
						err := holder.Release()
						for _, m := range middles {
							if err == nil {
								err = <-m.locked
							}
							if err == nil {
								err = m.Release()
							}
						}
						released <- err
					}()
				}
				s := newSession(t, ic)
				l := p.open(s, name)
				cctx, cancel := context.WithCancel(ctx)
				defer cancel()
				act := cancelAfterApply(cancel, tc.lose)
				if tc.release {
					// The cancel is for the read after the wake-up. A read
					// before the holder goes, as when etcd's revision moved
					// between the read that queued us and the creation of
					// our watch (other tests write to a shared etcd), goes
					// through, and the next Txn is the one.
					cancelOnWake := act
					act = func(ctx context.Context, invoke func() error) error {
						gate.Lock()
						if !holderGoes.Load() {
							defer gate.Unlock()
							fault.arm(0, 1, act)
							return invoke()
						}
						gate.Unlock()
						return cancelOnWake(ctx, invoke)
					}
				}
				fault.arm(tc.skip, 1, act)
				var err error
				if tc.try {
					var ok bool
					ok, err = l.TryLock(cctx, tc.wait)
					if ok {
						t.Errorf("TryLock: got true, want false")
					}
				} else {
					err = l.Lock(cctx)
				}
				if n := fault.count(); n != 1 {
					t.Fatalf("cancels after an applied Txn: got %d, want 1", n)
				}
				if !errors.Is(err, context.Canceled) {
					t.Errorf("error: got %v, want context.Canceled", err)
				}
				if keys := keysOfLease(t, client, name, s.Lease()); len(keys) != 0 {
					t.Errorf("keys of the cancelled session: got %q, want none", keys)
				}
				if l.Token() != 0 {
					t.Errorf("Token after the cancel: got %d, want 0", l.Token())
				}
				if tc.release {
					if err := <-released; err != nil {
						t.Fatal(err)
					}
				} else if holder != nil {
					if err := holder.Release(); err != nil {
						t.Fatal(err)
					}
				}
				// Nothing left to wait for: the cancelled session locks at once.
				if ok, err := l.TryLock(ctx, 0); !ok || err != nil {
					t.Fatalf("TryLock after the cancel: got %v, %v, want true; keys %q", ok, err, lockKeys(t, client, name))
				}
				if err := l.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
			})
		}
	})
}

// famLocker is a famLock as a locker, for lockInGoroutine.
type famLocker struct{ famLock }

func (l famLocker) TryLock(ctx context.Context) (bool, error) { return l.famLock.TryLock(ctx, 0) }
func (l famLocker) Key() string                               { return "" }

// tokenLocker is a famLocker that keeps the token of its hold, read on the
// goroutine that took it: an RWMutex tells a goroutine only of its own hold.
type tokenLocker struct {
	famLocker
	token atomic.Int64
}

func (l *tokenLocker) Lock(ctx context.Context) error {
	err := l.famLocker.Lock(ctx)
	if err == nil {
		l.token.Store(l.Token())
	}
	return err
}

// TestFamilyCancelRandom (D3): calls with deadlines of 0-3 ms, alone and
// against a holder that comes and goes, never leave a key of theirs behind.
func TestFamilyCancelRandom(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	forFamily(t, func(t *testing.T, p member) {
		const iterations = 120 // the second half against a contender
		ctx := testContext(t)
		name := lockName(t)
		s := newSession(t, client)
		l := p.open(s, name)
		stop := func() {}
		defer func() { stop() }()
		var held, failed int
		for i := range iterations {
			if i == iterations/2 {
				stopContender := startContender(t, ctx, p.blocker(newSession(t, client), name), uint64(i))
				stop = func() { stopContender() }
			}
			cctx, cancel := context.WithTimeout(ctx, randomDeadline())
			var ok bool
			var err error
			if i%2 == 0 {
				err = l.Lock(cctx)
				ok = err == nil
			} else {
				ok, err = l.TryLock(cctx, time.Millisecond)
			}
			cancel()
			if ok {
				held++
				if err := l.Unlock(ctx); err != nil {
					t.Fatalf("unlock: %v", err)
				}
				continue
			}
			failed++
			if keys := keysOfLease(t, client, name, s.Lease()); len(keys) != 0 {
				t.Fatalf("call %d failed with %v and left %q", i, err, keys)
			}
		}
		t.Logf("%d calls: %d held, %d failed, none left a key", iterations, held, failed)
	})
}

// TestFamilyWaiterLeaseRevoked (D8, etcd #16221, #19597): a waiter whose own
// lease is revoked returns ErrSessionExpired within 1 s (2 s allowed here),
// at the default TTL, whose keep-alive would learn of it up to 20 s later;
// it never reports a hold it does not have.
func TestFamilyWaiterLeaseRevoked(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	admin := startClient(t, client)
	forFamily(t, func(t *testing.T, p member) {
		ctx := testContext(t)
		name := lockName(t)
		holder := p.blocker(newSession(t, client), name)
		mustLock(t, holder)
		held := len(lockKeys(t, client, name))
		s := newSession(t, client)
		l := p.open(s, name)
		locked := result(func() error { return l.Lock(ctx) })
		eventually(t, "the waiter's key", func() bool { return len(keysOfLease(t, client, name, s.Lease())) == 1 })
		time.Sleep(200 * time.Millisecond) // well into the wait
		if _, err := admin.Revoke(ctx, s.Lease()); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		select {
		case err := <-locked:
			if !errors.Is(err, etcdlock.ErrSessionExpired) {
				t.Errorf("waiter after its lease's revoke: got %v, want ErrSessionExpired", err)
			}
			t.Logf("waiter returned %v after %v", err, time.Since(start))
		case <-time.After(2 * time.Second):
			t.Fatal("waiter still waiting 2s after its lease was revoked")
		}
		if got := len(lockKeys(t, client, name)); got != held {
			t.Errorf("keys: got %d, want the holder's %d", got, held)
		}
		if ok, err := l.TryLock(ctx, 0); ok || !errors.Is(err, etcdlock.ErrSessionExpired) {
			t.Errorf("TryLock on the expired session: got %v, %v, want false, ErrSessionExpired", ok, err)
		}
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// TestFamilyTryWritesNothing (D5): a try that fails because of a holder
// writes nothing to etcd; one that succeeds puts one key.
func TestFamilyTryWritesNothing(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	forFamily(t, func(t *testing.T, p member) {
		ctx := testContext(t)
		name := lockName(t)
		l := p.open(newSession(t, client), name)
		if ok, err := l.TryLock(ctx, 0); !ok || err != nil {
			t.Fatalf("TryLock on a free lock: got %v, %v, want true", ok, err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		holder := p.blocker(newSession(t, client), name)
		mustLock(t, holder)
		before := revision(t, client)
		for range 3 {
			if ok, err := l.TryLock(ctx, 0); ok || err != nil {
				t.Fatalf("TryLock on a held lock: got %v, %v, want false, nil", ok, err)
			}
		}
		if w := wroteSince(t, client, before); len(w) > 0 {
			t.Errorf("writes after 3 failed tries: %v, want none", w)
		}
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// TestFamilyFencedRelease (D6): a hold whose key was deleted by someone
// else learns it (Done, IsOwner), and its release returns ErrLockLost
// without deleting anything of a later holder's.
func TestFamilyFencedRelease(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	forFamily(t, func(t *testing.T, p member) {
		ctx := testContext(t)
		name := lockName(t)
		s := newSession(t, client)
		l := p.open(s, name)
		mustLock(t, l)
		token := l.Token()
		if token <= 0 {
			t.Fatalf("Token while held: got %d, want > 0", token)
		}
		if resp, err := client.Txn(ctx).If(l.IsOwner()).Commit(); err != nil || !resp.Succeeded {
			t.Fatalf("Txn guarded by IsOwner while held: got %v, %v, want success", resp, err)
		}
		done := l.Done()
		keys := keysOfLease(t, client, name, s.Lease())
		if len(keys) != 1 {
			t.Fatalf("keys of the holder: got %q, want 1", keys)
		}
		if _, err := client.Delete(ctx, keys[0]); err != nil {
			t.Fatal(err)
		}
		if _, ok := closedWithin(done, 2*time.Second); !ok {
			t.Error("Done still open 2s after the key was deleted")
		}
		if resp, err := client.Txn(ctx).If(l.IsOwner()).Commit(); err != nil || resp.Succeeded {
			t.Errorf("Txn guarded by IsOwner after the loss: got %v, %v, want failure", resp, err)
		}
		later := p.open(newSession(t, client), name)
		mustLock(t, later)
		if later.Token() <= token {
			t.Errorf("later holder's token: got %d, want > %d", later.Token(), token)
		}
		if err := l.Unlock(ctx); !errors.Is(err, etcdlock.ErrLockLost) {
			t.Errorf("unlock of the lost hold: got %v, want ErrLockLost", err)
		}
		if resp, err := client.Txn(ctx).If(later.IsOwner()).Commit(); err != nil || !resp.Succeeded {
			t.Errorf("later holder after the stale unlock: IsOwner Txn got %v, %v, want success", resp, err)
		}
		if err := later.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// TestFamilyBadInput: bad input gets a clear error, writes nothing, and
// never panics; an unlock without a hold is ErrNotHeld.
func TestFamilyBadInput(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	s := newSession(t, client)
	forFamily(t, func(t *testing.T, p member) {
		ctx := testContext(t)
		before := revision(t, client)
		var nilCtx context.Context
		for _, tc := range []struct {
			what string
			l    famLock
			ctx  context.Context
			want error
		}{
			{"empty name", p.open(s, ""), ctx, etcdlock.ErrInvalidName},
			{"nil Session", p.open(nil, "x"), ctx, etcdlock.ErrInvalidArgument},
			{"nil context", p.open(s, "x"), nilCtx, etcdlock.ErrInvalidArgument},
		} {
			if err := tc.l.Lock(tc.ctx); !errors.Is(err, tc.want) {
				t.Errorf("Lock, %s: got %v, want %v", tc.what, err, tc.want)
			}
			if ok, err := tc.l.TryLock(tc.ctx, time.Second); ok || !errors.Is(err, tc.want) {
				t.Errorf("TryLock, %s: got %v, %v, want false, %v", tc.what, ok, err, tc.want)
			}
		}
		if err := p.open(s, lockName(t)).Unlock(ctx); !errors.Is(err, etcdlock.ErrNotHeld) {
			t.Errorf("Unlock without a hold: got %v, want ErrNotHeld", err)
		}
		if w := wroteSince(t, client, before); len(w) > 0 {
			t.Errorf("writes after bad calls: %v, want none", w)
		}
	})
	if err := (*etcdlock.Permit)(nil).Release(context.Background()); !errors.Is(err, etcdlock.ErrNotHeld) {
		t.Errorf("nil Permit's Release: got %v, want ErrNotHeld", err)
	}
	for _, limit := range []int{0, -1} {
		sem := etcdlock.NewSemaphore(s, "x", limit)
		if _, err := sem.Acquire(context.Background()); !errors.Is(err, etcdlock.ErrInvalidArgument) {
			t.Errorf("Acquire with limit %d: got %v, want ErrInvalidArgument", limit, err)
		}
		if _, err := sem.TryAcquire(context.Background(), 0); !errors.Is(err, etcdlock.ErrInvalidArgument) {
			t.Errorf("TryAcquire with limit %d: got %v, want ErrInvalidArgument", limit, err)
		}
	}
}

// TestFamilyExclusion: while a blocker holds, the lock waits; it gets the
// lock once the blocker leaves, with a higher token.
func TestFamilyExclusion(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	forFamily(t, func(t *testing.T, p member) {
		ctx := testContext(t)
		name := lockName(t)
		holder := p.blocker(newSession(t, client), name)
		mustLock(t, holder)
		token := holder.Token()
		l := &tokenLocker{famLocker: famLocker{p.open(newSession(t, client), name)}}
		w := lockInGoroutine(t, ctx, l)
		if !blocked(w.locked, 300*time.Millisecond) {
			t.Fatal("lock taken while the blocker holds")
		}
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := waitErr(t, w.locked); err != nil {
			t.Fatalf("lock after the blocker left: %v", err)
		}
		if got := l.token.Load(); got <= token {
			t.Errorf("token: got %d, want > the blocker's %d", got, token)
		}
		if err := w.Release(); err != nil {
			t.Fatal(err)
		}
		if keys := lockKeys(t, client, name); len(keys) != 0 {
			t.Errorf("keys after both left: got %q, want none", keys)
		}
	})
}

// TestFamilyDoneWhenCutOff (D10): a hold cut off from etcd the moment it is
// taken, before its loss watch could open, still sees Done close before
// etcd can expire its lease: within the TTL of the last keep-alive
// acknowledgement (at 2/3 of it).
func TestFamilyDoneWhenCutOff(t *testing.T) {
	srv, client := startServer(t)
	forFamily(t, func(t *testing.T, p member) {
		t.Parallel()
		pc, proxy := srv.ProxiedClient(t)
		defer proxy.Unblackhole() // before the cleanups close the Session
		const ttl = 3 * time.Second
		s := aliveSession(t, pc, ttl)
		acks, _ := ackWatch(t, pc, s.Lease())
		l := p.open(s, lockName(t))
		mustLock(t, l)
		before := acks.last()
		eventually(t, "a keep-alive acknowledgement", func() bool { return acks.last().After(before) })
		proxy.Blackhole()
		deadline := acks.last().Add(ttl)
		took, ok := closedWithin(l.Done(), 2*ttl)
		closedAt := time.Now()
		if !ok {
			t.Fatalf("Done still open %v after the cut", 2*ttl)
		}
		t.Logf("Done closed %v after the cut, %v before the lease could expire (TTL %v)",
			took.Round(time.Millisecond), deadline.Sub(closedAt).Round(time.Millisecond), ttl)
		if !closedAt.Before(deadline) {
			t.Errorf("Done closed %v after the lease could expire, want before", closedAt.Sub(deadline))
		}
		if !leaseAlive(t, client, s.Lease()) {
			t.Error("lease gone when Done closed")
		}
		proxy.Unblackhole()
		_ = l.Unlock(testContext(t))
	})
}

// TestFamilyWatchCompacted: a waiter whose wait's watch fails at once (served
// from a compacted revision) reads its place and watches again: it takes
// the lock once the holder goes, and the error never reaches the caller.
func TestFamilyWatchCompacted(t *testing.T) {
	testflags.Parallel(t)
	srv, client := startServer(t)
	forFamily(t, func(t *testing.T, p member) {
		ctx, name := testContext(t), lockName(t)
		holder := p.blocker(newSession(t, client), name)
		mustLock(t, holder)
		compactFirstRevision(t, ctx, client, name) // the watch from revision 1 fails
		sm := newSeam(callWatch, faultLagging, 1)
		sm.lagFrom = map[call]int64{callWatch: 1}
		sm.enter(phaseAcquire, nil)
		waiter := lockInGoroutine(t, ctx, famLocker{p.open(newSession(t, serverClient(t, srv, sm.unary, sm.stream), etcdlock.WithTTL(time.Minute)), name)})
		eventually(t, "the failed watch", func() bool { return sm.fires() == 1 })
		time.Sleep(300 * time.Millisecond)
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := waitErr(t, waiter.locked); err != nil {
			t.Fatalf("the waiter whose watch failed: %v", err)
		}
		if err := waiter.Release(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestWaitWatchKeepsFailing: a waiter whose watches keep failing (each
// served from a compacted revision) reads its place after each failure and
// waits longer before each new watch: 100 ms, doubled with each failure in
// a row, up to its TTL. Judged by when etcd was asked for each watch (a
// loaded machine only stretches the gaps), for a Mutex's wait, whose every
// watch fails, and for a Semaphore's waiter near the head, whose watch of
// the limit record fails. The waiter still takes the lock once the holder
// goes.
func TestWaitWatchKeepsFailing(t *testing.T) {
	testflags.Parallel(t)
	srv, client := startServer(t)
	const ttl = 2 * time.Second
	for _, tc := range []struct {
		name   string
		holder func(s *etcdlock.Session, name string) famLock
		fails  func(key, name string, from int64) bool // the watches that fail
	}{
		// The wait's watch, from now (not the own key's, from its creation).
		{"Mutex", openMutex, func(key, name string, from int64) bool { return strings.HasPrefix(key, name+"/") && from == 0 }},
		{"Semaphore's record", openSemaphore(1), func(key, name string, _ int64) bool { return key == queue.LimitKey(name) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, name := testContext(t), lockName(t)
			holder := tc.holder(newSession(t, client), name)
			mustLock(t, holder)
			compactFirstRevision(t, ctx, client, name)
			prefix := serverPrefix(t, srv)
			w := &failingWatches{fails: func(key string, from int64) bool { return tc.fails(strings.TrimPrefix(key, prefix), name, from) }}
			wc := serverClient(t, srv, nil, w.intercept)
			waiter := lockInGoroutine(t, ctx, famLocker{tc.holder(newSession(t, wc, etcdlock.WithTTL(ttl)), name)})
			// Four watches take 100 + 200 + 400 ms of pauses at the
			// least; on a loaded machine, each read and watch longer.
			eventually(t, "four failing watches", func() bool { return len(w.times()) >= 4 })
			if err := holder.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := waitErr(t, waiter.locked); err != nil {
				t.Fatalf("the waiter whose watches fail: %v", err)
			}
			if err := waiter.Release(); err != nil {
				t.Fatal(err)
			}
			at := w.times()
			t.Logf("failing watches asked for at %v", at)
			for i := 1; i < 4; i++ {
				// The pause before the i-th watch, less the slack of a timer.
				want := min(100*time.Millisecond<<(i-1), ttl) * 9 / 10
				if gap := at[i].Sub(at[i-1]); gap < want {
					t.Errorf("watch %d asked for %v after the one before, want at least %v (pauses that grow)", i, gap, want)
				}
			}
		})
	}
}

// failingWatches serves the watches fails picks (by key and start
// revision) from revision 1, which a compaction has removed, so that each
// fails at once, and records when each was asked for.
type failingWatches struct {
	fails func(key string, from int64) bool
	mu    sync.Mutex
	at    []time.Time
}

func (w *failingWatches) times() []time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.at)
}

func (w *failingWatches) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || method != "/etcdserverpb.Watch/Watch" {
		return cs, err
	}
	return &failingStream{ClientStream: cs, w: w}, nil
}

type failingStream struct {
	grpc.ClientStream
	w *failingWatches
}

func (s *failingStream) SendMsg(m any) error {
	if req, ok := m.(*pb.WatchRequest); ok {
		if cr := req.GetCreateRequest(); cr != nil && s.w.fails(string(cr.Key), cr.StartRevision) {
			s.w.mu.Lock()
			s.w.at = append(s.w.at, time.Now())
			s.w.mu.Unlock()
			cr = proto.Clone(cr).(*pb.WatchCreateRequest)
			cr.StartRevision = 1
			m = &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: cr}}
		}
	}
	return s.ClientStream.SendMsg(m)
}
