package etcdlock_test

// One test per upstream defect of DESIGN.md §2. Each runs the same scenario
// on etcdlock.Mutex and on concurrency.Mutex (client/v3 v3.7.3), and checks
// both that ours behaves and that upstream shows the defect, so that each
// test is known to fail on the behaviour it guards against.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3lock/v3lockpb"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
)

// locker is what the scenarios below need of a lock, so that each runs
// unchanged on etcdlock.Mutex (ours) and on concurrency.Mutex (upstream).
type locker interface {
	Lock(ctx context.Context) error
	// TryLock reports false, nil when another holder has the lock.
	TryLock(ctx context.Context) (bool, error)
	Unlock(ctx context.Context) error
	// Key is the lock's etcd key, while held.
	Key() string
}

// ours is an etcdlock.Mutex as a locker.
type ours struct{ m *etcdlock.Mutex }

func oursOn(s *etcdlock.Session, name string) ours { return ours{etcdlock.NewMutex(s, name)} }

func (l ours) Lock(ctx context.Context) error            { return l.m.LockContext(ctx) }
func (l ours) TryLock(ctx context.Context) (bool, error) { return l.m.TryLockFor(ctx, 0) }
func (l ours) Unlock(ctx context.Context) error          { return l.m.UnlockContext(ctx) }
func (l ours) Key() string                               { return l.m.Key() }

// oursFor is ours with Lock done by TryLockFor(ctx, wait): a wait that runs
// out is an error.
type oursFor struct {
	ours
	wait time.Duration
}

var errWaitRanOut = errors.New("the wait ran out")

func (l oursFor) Lock(ctx context.Context) error {
	ok, err := l.m.TryLockFor(ctx, l.wait)
	if err == nil && !ok {
		return errWaitRanOut
	}
	return err
}

// upstream is a concurrency.Mutex as a locker.
type upstream struct{ m *concurrency.Mutex }

func upstreamOn(s *concurrency.Session, name string) upstream {
	return upstream{concurrency.NewMutex(s, name)}
}

func (l upstream) Lock(ctx context.Context) error   { return l.m.Lock(ctx) }
func (l upstream) Unlock(ctx context.Context) error { return l.m.Unlock(ctx) }
func (l upstream) Key() string                      { return l.m.Key() }

func (l upstream) TryLock(ctx context.Context) (bool, error) {
	err := l.m.TryLock(ctx)
	if errors.Is(err, concurrency.ErrLocked) {
		return false, nil
	}
	return err == nil, err
}

// worker locks a lock in a goroutine of its own, and unlocks it there once
// released, the way a separate worker would.
type worker struct {
	locked  chan error // Lock's result
	release chan struct{}
	cancel  context.CancelFunc
	done    chan error // Unlock's result, or nil when Lock failed
	once    sync.Once
	err     error
}

func lockInGoroutine(t *testing.T, ctx context.Context, l locker) *worker {
	ctx, cancel := context.WithCancel(ctx)
	w := &worker{
		locked:  make(chan error, 1),
		release: make(chan struct{}),
		cancel:  cancel,
		done:    make(chan error, 1),
	}
	go func() {
		err := l.Lock(ctx)
		w.locked <- err
		if err != nil {
			w.done <- nil
			return
		}
		<-w.release
		uctx, ucancel := context.WithTimeout(context.Background(), testTimeout)
		defer ucancel()
		w.done <- l.Unlock(uctx)
	}()
	t.Cleanup(func() { _ = w.Release() })
	return w
}

// Release makes the worker unlock, or give up a Lock still waiting, and
// returns the Unlock's error.
func (w *worker) Release() error {
	w.once.Do(func() {
		close(w.release)
		w.cancel()
		w.err = <-w.done
	})
	return w.err
}

// interceptedClient returns a client of endpoints whose calls go through the
// given interceptors (nil: none). It is closed by t.Cleanup.
func interceptedClient(t *testing.T, endpoints []string, unary grpc.UnaryClientInterceptor, stream grpc.StreamClientInterceptor) *clientv3.Client {
	t.Helper()
	var opts []grpc.DialOption
	if unary != nil {
		opts = append(opts, grpc.WithChainUnaryInterceptor(unary))
	}
	if stream != nil {
		opts = append(opts, grpc.WithChainStreamInterceptor(stream))
	}
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		DialOptions: opts,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("new client: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

const txnMethod = "/etcdserverpb.KV/Txn"

// txnFault acts on chosen Txn calls of a client: armed, it lets skip Txns
// through, then hands the next n to act, which decides whether and how to
// call etcd. It sits below clientv3's own retry interceptor, so it sees every
// attempt.
type txnFault struct {
	mu    sync.Mutex
	skip  int
	n     int
	act   func(ctx context.Context, invoke func() error) error
	fired int
}

func (f *txnFault) arm(skip, n int, act func(ctx context.Context, invoke func() error) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.skip, f.n, f.act, f.fired = skip, n, act, 0
}

// count returns how many Txns the armed action acted on.
func (f *txnFault) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fired
}

func (f *txnFault) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	invoke := func() error { return invoker(ctx, method, req, reply, cc, opts...) }
	if method != txnMethod {
		return invoke()
	}
	f.mu.Lock()
	var act func(context.Context, func() error) error
	switch {
	case f.n == 0:
	case f.skip > 0:
		f.skip--
	default:
		f.n--
		f.fired++
		act = f.act
	}
	f.mu.Unlock()
	if act == nil {
		return invoke()
	}
	return act(ctx, invoke)
}

// cancelAfterApply makes the Txn reach etcd, then cancels the caller's
// context. With lose, the reply is lost: the call waits until its RPC context
// ends and fails as a cancelled RPC does, so the caller cannot know that etcd
// applied it. Without, the reply comes back after the cancel.
func cancelAfterApply(cancel context.CancelFunc, lose bool) func(context.Context, func() error) error {
	return func(ctx context.Context, invoke func() error) error {
		err := invoke()
		cancel()
		if err != nil || !lose {
			return err
		}
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-time.After(testTimeout):
			return errors.New("test: the RPC context never ended after the caller's was cancelled")
		}
	}
}

// failWith fails the Txn with err without sending it.
func failWith(err error) func(context.Context, func() error) error {
	return func(context.Context, func() error) error { return err }
}

// catchPanic runs f and returns what it panicked with, or nil.
func catchPanic(f func()) (r any) {
	defer func() { r = recover() }()
	f()
	return nil
}

// keysOfLease returns the keys under the lock's prefix attached to lease.
func keysOfLease(t *testing.T, client *clientv3.Client, name string, lease clientv3.LeaseID) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	resp, err := client.Get(ctx, name+"/", clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("get keys of %q: %v", name, err)
	}
	var keys []string
	for _, kv := range resp.Kvs {
		if clientv3.LeaseID(kv.Lease) == lease {
			keys = append(keys, string(kv.Key))
		}
	}
	return keys
}

// D1: two handles for the same name on one Session are one lock.
func TestD1SameNameOneSession(t *testing.T) {
	_, client := startServer(t)

	// scenario locks a in this goroutine, then b in another one with a short
	// deadline, and returns b's result.
	scenario := func(t *testing.T, a, b locker) error {
		ctx := testContext(t)
		if err := a.Lock(ctx); err != nil {
			t.Fatalf("first Lock: %v", err)
		}
		dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		w := lockInGoroutine(t, dctx, b)
		return waitErr(t, w.locked)
	}

	t.Run("ours", func(t *testing.T) {
		s := newSession(t, client)
		name := lockName(t)
		a, b := oursOn(s, name), oursOn(s, name)
		if err := scenario(t, a, b); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("second handle's LockContext while the first holds: got %v, want context.DeadlineExceeded", err)
		}
		// The second handle gets the lock once the first lets go.
		w := lockInGoroutine(t, testContext(t), b)
		if !blocked(w.locked, 100*time.Millisecond) {
			t.Fatal("second handle got the lock while the first holds")
		}
		if err := a.Unlock(testContext(t)); err != nil {
			t.Fatalf("UnlockContext: %v", err)
		}
		if err := waitErr(t, w.locked); err != nil {
			t.Fatalf("second handle's LockContext after the first let go: %v", err)
		}
		if err := w.Release(); err != nil {
			t.Fatalf("second handle's UnlockContext: %v", err)
		}
	})

	t.Run("upstream", func(t *testing.T) {
		s := newUpstreamSession(t, client, 30)
		name := lockName(t)
		a, b := upstreamOn(s, name), upstreamOn(s, name)
		if err := scenario(t, a, b); err != nil {
			t.Fatalf("upstream second Mutex's Lock: got %v, want nil (the defect: both hold)", err)
		}
		if keys := lockKeys(t, client, name); len(keys) != 1 {
			t.Errorf("upstream keys: got %q, want one key for both holders", keys)
		}
	})
}

// D2: reentrancy. The holder locks twice and unlocks once: it still holds.
func TestD2Reentrancy(t *testing.T) {
	_, client := startServer(t)

	// scenario locks holder twice and unlocks it once, then starts other,
	// and returns other's worker.
	scenario := func(t *testing.T, holder, other locker) *worker {
		ctx := testContext(t)
		for i := range 2 {
			lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := holder.Lock(lctx)
			cancel()
			if err != nil {
				t.Fatalf("Lock %d by the holder: %v", i+1, err)
			}
		}
		if err := holder.Unlock(ctx); err != nil {
			t.Fatalf("first Unlock: %v", err)
		}
		return lockInGoroutine(t, ctx, other)
	}

	t.Run("ours", func(t *testing.T) {
		name := lockName(t)
		s := newSession(t, client)
		holder := oursOn(s, name)
		w := scenario(t, holder, oursOn(newSession(t, client), name))
		if !blocked(w.locked, 300*time.Millisecond) {
			t.Fatal("another session got the lock after two locks and one unlock, want it blocked")
		}
		if got := holder.m.HoldCount(); got != 1 {
			t.Errorf("HoldCount: got %d, want 1", got)
		}
		if keys := lockKeys(t, client, name); len(keys) != 2 || keys[0] != keyOf(name, s.Lease()) {
			t.Errorf("keys: got %q, want the holder's first, then the waiter's", keys)
		}
		local := make(chan bool)
		go func() { local <- holder.m.TryLock() }()
		if <-local {
			t.Error("TryLock by another goroutine of the holder's process: got true, want false")
		}
		if err := holder.Unlock(testContext(t)); err != nil {
			t.Fatalf("second Unlock: %v", err)
		}
		if err := waitErr(t, w.locked); err != nil {
			t.Fatalf("the other session's LockContext after the last unlock: %v", err)
		}
	})

	t.Run("upstream", func(t *testing.T) {
		name := lockName(t)
		holder := upstreamOn(newUpstreamSession(t, client, 30), name)
		w := scenario(t, holder, upstreamOn(newUpstreamSession(t, client, 30), name))
		if err := waitErr(t, w.locked); err != nil {
			t.Fatalf("upstream: another session's Lock: got %v, want nil (the defect: one Unlock of two Locks frees the lock)", err)
		}
	})
}

// D3: a context cancelled after etcd applied the acquire Txn but before
// the reply leaves nothing behind.
func TestD3CancelAfterApply(t *testing.T) {
	srv, client := startServer(t)
	var fault txnFault
	ic := interceptedClient(t, srv.Endpoints(), fault.intercept, nil)

	for _, tc := range []struct {
		name string
		// try: TryLockFor with wait; otherwise LockContext.
		try       bool
		wait      time.Duration
		contended bool // another session holds the lock
		skip      int  // Txns let through before the cancel
		lose      bool // the reply is lost
		release   bool // the holder unlocks once our key is queued
	}{
		{name: "LockContext", lose: true},
		{name: "LockContext reply after cancel"},
		{name: "TryLockFor", try: true, wait: 5 * time.Second, lose: true},
		{name: "TryLockFor reply after cancel", try: true, wait: 5 * time.Second},
		{name: "TryLockFor no wait", try: true, lose: true},
		{name: "LockContext queued", contended: true, lose: true},
		{name: "TryLockFor queued", try: true, wait: 5 * time.Second, contended: true, lose: true},
		// The read after the predecessor's delete is a Txn too.
		{name: "LockContext waiting", contended: true, skip: 1, lose: true, release: true},
		{name: "TryLockFor waiting", try: true, wait: 5 * time.Second, contended: true, skip: 1, lose: true, release: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := lockName(t)
			ctx := testContext(t)
			var holder *etcdlock.Mutex
			released := make(chan error, 1)
			if tc.contended && tc.release {
				holder = etcdlock.NewMutex(newSession(t, client), name)
				locked := make(chan error, 1)
				go func() {
					if err := holder.LockContext(ctx); err != nil {
						locked <- err
						return
					}
					locked <- nil
					released <- unlockWhenQueued(ctx, client, holder, name, 2)
				}()
				if err := <-locked; err != nil {
					t.Fatal(err)
				}
			} else if tc.contended {
				holder = etcdlock.NewMutex(newSession(t, client), name)
				if err := holder.LockContext(ctx); err != nil {
					t.Fatal(err)
				}
			}
			s := newSession(t, ic)
			m := etcdlock.NewMutex(s, name)
			cctx, cancel := context.WithCancel(ctx)
			defer cancel()
			fault.arm(tc.skip, 1, cancelAfterApply(cancel, tc.lose))
			var err error
			if tc.try {
				var ok bool
				ok, err = m.TryLockFor(cctx, tc.wait)
				if ok {
					t.Errorf("TryLockFor: got true, want false")
				}
			} else {
				err = m.LockContext(cctx)
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
			if m.HoldCount() != 0 || m.Token() != 0 {
				t.Errorf("HoldCount %d, Token %d: want 0, 0", m.HoldCount(), m.Token())
			}
			if tc.release {
				if err := <-released; err != nil {
					t.Fatal(err)
				}
			} else if holder != nil {
				if err := holder.UnlockContext(ctx); err != nil {
					t.Fatal(err)
				}
			}
			// Nothing left to wait for: another session takes the lock at once.
			other := etcdlock.NewMutex(newSession(t, client), name)
			if !other.TryLock() {
				t.Fatalf("another session's TryLock after the cancel: got false, want true; keys %q", lockKeys(t, client, name))
			}
			other.Unlock()
			// And the cancelled session can lock again.
			if err := m.LockContext(ctx); err != nil {
				t.Fatalf("LockContext after the cancel: %v", err)
			}
			if err := m.UnlockContext(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}

	for _, tc := range []struct {
		name      string
		try       bool // upstream TryLock; otherwise Lock
		contended bool
	}{
		{name: "upstream Lock"},
		{name: "upstream TryLock", try: true},
		{name: "upstream Lock queued", contended: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := lockName(t)
			ctx := testContext(t)
			var holder *etcdlock.Mutex
			if tc.contended {
				holder = etcdlock.NewMutex(newSession(t, client), name)
				if err := holder.LockContext(ctx); err != nil {
					t.Fatal(err)
				}
			}
			s := newUpstreamSession(t, ic, 30)
			m := concurrency.NewMutex(s, name)
			cctx, cancel := context.WithCancel(ctx)
			defer cancel()
			fault.arm(0, 1, cancelAfterApply(cancel, true))
			var err error
			if tc.try {
				err = m.TryLock(cctx)
			} else {
				err = m.Lock(cctx)
			}
			if n := fault.count(); n != 1 {
				t.Fatalf("cancels after an applied Txn: got %d, want 1", n)
			}
			if !errors.Is(err, context.Canceled) {
				t.Errorf("upstream error: got %v, want context.Canceled", err)
			}
			stale := keyOf(name, s.Lease())
			if keys := keysOfLease(t, client, name, s.Lease()); len(keys) != 1 || keys[0] != stale {
				t.Fatalf("upstream keys of the cancelled session: got %q, want %q left behind (the defect)", keys, stale)
			}
			if err := m.Unlock(ctx); !errors.Is(err, concurrency.ErrLockReleased) {
				t.Errorf("upstream Unlock after the cancel: got %v, want ErrLockReleased", err)
			}
			if keys := keysOfLease(t, client, name, s.Lease()); len(keys) != 1 {
				t.Errorf("upstream keys after its Unlock: got %q, want the stale key still there", keys)
			}
			if holder != nil {
				if err := holder.UnlockContext(ctx); err != nil {
					t.Fatal(err)
				}
			}
			// The stale key now holds the lock for the session's whole life.
			other := etcdlock.NewMutex(newSession(t, client), name)
			if other.TryLock() {
				t.Fatal("another session's TryLock with the stale key in etcd: got true, want false")
			}
			dctx, dcancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer dcancel()
			if err := other.LockContext(dctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("another session's LockContext with the stale key in etcd: got %v, want context.DeadlineExceeded", err)
			}
		})
	}
}

// watchCreate is one watch creation seen on a client's watch stream.
type watchCreate struct {
	key     string
	start   int64 // the requested start revision; 0 is "from now"
	before  int64 // the store's revision, read just before the request was sent
	created int64 // the header revision of etcd's "created" reply; 0 if none came
}

// watchRecorder is a stream interceptor that records every watch created on
// a client, with the store's revision just before, and the leases whose
// keep-alives etcd acknowledged.
type watchRecorder struct {
	rev func() int64

	mu      sync.Mutex
	creates []*watchCreate
	acked   map[clientv3.LeaseID]bool
}

// watching reports whether a watch on key has been created.
func (r *watchRecorder) watching(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.creates {
		if c.key == key && c.created != 0 {
			return true
		}
	}
	return false
}

// keptAlive reports whether etcd has acknowledged a keep-alive of lease.
func (r *watchRecorder) keptAlive(lease clientv3.LeaseID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.acked[lease]
}

func (r *watchRecorder) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || method != "/etcdserverpb.Watch/Watch" && method != "/etcdserverpb.Lease/LeaseKeepAlive" {
		return cs, err
	}
	return &recordingStream{ClientStream: cs, r: r}, nil
}

func (r *watchRecorder) list() []watchCreate {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []watchCreate
	for _, c := range r.creates {
		out = append(out, *c)
	}
	return out
}

// recordingStream matches creations to their "created" replies in order:
// clientv3 sends a stream's next creation only once the last one is created.
type recordingStream struct {
	grpc.ClientStream
	r       *watchRecorder
	pending []*watchCreate
}

func (s *recordingStream) SendMsg(m any) error {
	if req, ok := m.(*pb.WatchRequest); ok {
		if cr := req.GetCreateRequest(); cr != nil {
			c := &watchCreate{key: string(cr.Key), start: cr.StartRevision, before: s.r.rev()}
			s.r.mu.Lock()
			s.r.creates = append(s.r.creates, c)
			s.pending = append(s.pending, c)
			s.r.mu.Unlock()
		}
	}
	return s.ClientStream.SendMsg(m)
}

func (s *recordingStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if resp, ok := m.(*pb.LeaseKeepAliveResponse); ok && err == nil && resp.TTL > 0 {
		s.r.mu.Lock()
		if s.r.acked == nil {
			s.r.acked = make(map[clientv3.LeaseID]bool)
		}
		s.r.acked[clientv3.LeaseID(resp.ID)] = true
		s.r.mu.Unlock()
	}
	if resp, ok := m.(*pb.WatchResponse); ok && err == nil && resp.Created && resp.Header != nil {
		s.r.mu.Lock()
		if len(s.pending) > 0 {
			s.pending[0].created = resp.Header.Revision
			s.pending = s.pending[1:]
		}
		s.r.mu.Unlock()
	}
	return err
}

// D4: a contended waiter's watch starts synced: from now, or ahead of the
// store, never from a revision etcd already has.
func TestD4SyncedWatch(t *testing.T) {
	srv, client := startServer(t)
	rec := &watchRecorder{rev: func() int64 {
		// Called on clientv3's goroutine: no t.Fatal here.
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		resp, err := client.Get(ctx, "\x00")
		if err != nil {
			return -1
		}
		return resp.Header.Revision
	}}
	wc := interceptedClient(t, srv.Endpoints(), nil, rec.intercept)

	// scenario: a holder on a plain client, two waiters on the recorded one,
	// unrelated writes while they wait; each in turn gets the lock. It
	// returns the watches created on the lock's keys.
	scenario := func(t *testing.T, name string, holder, w1, w2 locker) []watchCreate {
		ctx := testContext(t)
		nWatches := func() int {
			n := 0
			for _, c := range rec.list() {
				if strings.HasPrefix(c.key, name+"/") {
					n++
				}
			}
			return n
		}
		writes := func() {
			for i := range 5 {
				if _, err := client.Put(ctx, name+"-unrelated", fmt.Sprint(i)); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := holder.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		first := lockInGoroutine(t, ctx, w1)
		eventually(t, "the first waiter's watch", func() bool { return nWatches() >= 1 })
		second := lockInGoroutine(t, ctx, w2)
		eventually(t, "the second waiter's watch", func() bool { return nWatches() >= 2 })
		writes()
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := waitErr(t, first.locked); err != nil {
			t.Fatalf("first waiter: %v", err)
		}
		writes()
		if err := first.Release(); err != nil {
			t.Fatal(err)
		}
		if err := waitErr(t, second.locked); err != nil {
			t.Fatalf("second waiter: %v", err)
		}
		if err := second.Release(); err != nil {
			t.Fatal(err)
		}
		var out []watchCreate
		for _, c := range rec.list() {
			if strings.HasPrefix(c.key, name+"/") {
				out = append(out, c)
			}
		}
		return out
	}

	t.Run("ours", func(t *testing.T) {
		name := lockName(t)
		creates := scenario(t, name,
			oursOn(newSession(t, client), name),
			oursOn(newSession(t, wc), name),
			oursOn(newSession(t, wc), name))
		for _, c := range creates {
			// etcd files a watch as synced when it starts at 0 or past the
			// store's revision; created is at least that revision.
			if c.start != 0 && (c.created == 0 || c.start <= c.created) {
				t.Errorf("watch on %q: got start revision %d with the store at %d or later, want 0 or ahead (synced)", c.key, c.start, c.created)
			}
		}
		t.Logf("our waiters created %d watches: %+v", len(creates), creates)
	})

	t.Run("upstream", func(t *testing.T) {
		name := lockName(t)
		creates := scenario(t, name,
			upstreamOn(newUpstreamSession(t, client, 30), name),
			upstreamOn(newUpstreamSession(t, wc, 30), name),
			upstreamOn(newUpstreamSession(t, wc, 30), name))
		unsynced := 0
		for _, c := range creates {
			if c.start != 0 && c.before > 0 && c.start <= c.before {
				unsynced++
			}
		}
		if unsynced == 0 {
			t.Errorf("upstream waiters' watches: got none starting at or behind the store's revision, want some (the defect: unsynced watches); %+v", creates)
		}
		t.Logf("upstream waiters created %d watches, %d unsynced: %+v", len(creates), unsynced, creates)
	})
}

// D5: a TryLock that finds another holder writes nothing.
func TestD5TryLockWrites(t *testing.T) {
	_, client := startServer(t)
	ctx := testContext(t)

	// scenario returns the TryLock's result and how far it moved etcd's
	// revision, with another session holding the lock.
	scenario := func(t *testing.T, name string, try locker) (writes int64, ok bool, err error) {
		holder := etcdlock.NewMutex(newSession(t, client), name)
		if err := holder.LockContext(ctx); err != nil {
			t.Fatal(err)
		}
		before := revision(t, client)
		ok, err = try.TryLock(ctx)
		return revision(t, client) - before, ok, err
	}

	t.Run("ours", func(t *testing.T) {
		name := lockName(t)
		m := etcdlock.NewMutex(newSession(t, client), name)
		writes, ok, err := scenario(t, name, ours{m})
		if ok || err != nil {
			t.Errorf("TryLockFor(0): got %v, %v, want false, nil", ok, err)
		}
		if writes != 0 {
			t.Errorf("revisions moved by TryLockFor(0): got %d, want 0", writes)
		}
		before := revision(t, client)
		if m.TryLock() {
			t.Error("TryLock: got true, want false")
		}
		if got := revision(t, client) - before; got != 0 {
			t.Errorf("revisions moved by TryLock: got %d, want 0", got)
		}
	})

	t.Run("upstream", func(t *testing.T) {
		name := lockName(t)
		writes, ok, err := scenario(t, name, upstreamOn(newUpstreamSession(t, client, 30), name))
		if ok || err != nil {
			t.Errorf("upstream TryLock: got %v, %v, want false, nil (ErrLocked)", ok, err)
		}
		if writes != 2 {
			t.Errorf("revisions moved by upstream TryLock: got %d, want 2 (the defect: a put and a delete)", writes)
		}
	})
}

// D6: an unlock is fenced on the create revision of the hold it ends.
func TestD6FencedUnlock(t *testing.T) {
	_, client := startServer(t)

	// scenario: a locks; its key is deleted by someone else; b, another
	// handle on the same session, locks from another goroutine; a unlocks.
	// It returns a's token, b's worker and a's Unlock error.
	scenario := func(t *testing.T, name string, a, b locker) (int64, *worker, error) {
		ctx := testContext(t)
		if err := a.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		resp, err := client.Get(ctx, a.Key())
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("get the holder's key: %v, %v", resp, err)
		}
		token := resp.Kvs[0].CreateRevision
		if _, err := client.Delete(ctx, a.Key()); err != nil {
			t.Fatal(err)
		}
		w := lockInGoroutine(t, ctx, b)
		// Let b take the lock if it can: upstream's b does, ours waits for a.
		select {
		case err := <-w.locked:
			w.locked <- err
		case <-time.After(300 * time.Millisecond):
		}
		return token, w, a.Unlock(ctx)
	}

	t.Run("ours", func(t *testing.T) {
		name := lockName(t)
		s := newSession(t, client)
		a, b := oursOn(s, name), oursOn(s, name)
		token, w, err := scenario(t, name, a, b)
		if !errors.Is(err, etcdlock.ErrLockLost) {
			t.Errorf("UnlockContext after the key was deleted: got %v, want ErrLockLost", err)
		}
		if err := waitErr(t, w.locked); err != nil {
			t.Fatalf("the other handle's LockContext: %v", err)
		}
		newToken := b.m.Token()
		if newToken <= token {
			t.Errorf("token of the new hold: got %d, want > %d", newToken, token)
		}
		ctx := testContext(t)
		resp, err := client.Get(ctx, keyOf(name, s.Lease()))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != newToken {
			t.Fatalf("the new hold's key: got %v, want it intact with create revision %d", resp.Kvs, newToken)
		}
		if err := w.Release(); err != nil {
			t.Errorf("UnlockContext of the new hold: %v", err)
		}
	})

	t.Run("upstream", func(t *testing.T) {
		name := lockName(t)
		s := newUpstreamSession(t, client, 30)
		a, b := upstreamOn(s, name), upstreamOn(s, name)
		_, w, err := scenario(t, name, a, b)
		if err != nil {
			t.Errorf("upstream Unlock of the deleted hold: got %v, want nil", err)
		}
		if err := waitErr(t, w.locked); err != nil {
			t.Fatalf("upstream second Mutex's Lock: %v", err)
		}
		if keys := lockKeys(t, client, name); len(keys) != 0 {
			t.Errorf("upstream keys after the stale Unlock: got %q, want none (the defect: it deleted the newer hold)", keys)
		}
		if b.Key() != keyOf(name, s.Lease()) {
			t.Errorf("upstream second Mutex's Key: got %q, want it still believing it holds %q", b.Key(), keyOf(name, s.Lease()))
		}
	})
}

// D7: cleanup is bounded while etcd is unreachable, and finishes once it is
// back.
func TestD7BoundedCleanup(t *testing.T) {
	// proxied returns a client through a proxy of its own, with a watch
	// recorder, so that a test can see when a waiter is waiting.
	proxied := func(t *testing.T, srv *etcdtest.Server) (*clientv3.Client, *etcdtest.Proxy, *watchRecorder) {
		_, proxy := srv.ProxiedClient(t)
		t.Cleanup(proxy.Unblackhole)
		rec := &watchRecorder{rev: func() int64 { return 0 }}
		return interceptedClient(t, proxy.Endpoints(), nil, rec.intercept), proxy, rec
	}

	t.Run("ours", func(t *testing.T) {
		srv, client := startServer(t)
		pc, proxy, rec := proxied(t, srv)
		// A long TTL: the lease outlives the outage, so keys that go were
		// deleted by the background retry, not by the lease's expiry.
		s := newSession(t, pc, etcdlock.WithTTL(30*time.Second))
		name := lockName(t)
		held := etcdlock.NewMutex(s, name)
		waiting := etcdlock.NewMutex(s, name+"-waiting")
		ctx := testContext(t)
		if err := held.LockContext(ctx); err != nil {
			t.Fatal(err)
		}
		// A holder elsewhere, so that the waiting lock's key goes in etcd's
		// queue before the outage.
		other := etcdlock.NewMutex(newSession(t, client), name+"-waiting")
		if err := other.LockContext(ctx); err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithCancel(ctx)
		defer wcancel()
		queued := result(func() error { return waiting.LockContext(wctx) })
		eventually(t, "the waiter's watch", func() bool { return rec.watching(other.Key()) })

		proxy.Blackhole()
		start := time.Now()
		err := held.UnlockContext(ctx)
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("UnlockContext while etcd is unreachable: returned after %v, want within 5s", d)
		}
		if err == nil {
			t.Error("UnlockContext while etcd is unreachable: got nil, want an error")
		}
		t.Logf("UnlockContext while etcd is unreachable: %v after %v", err, time.Since(start))
		if held.HoldCount() != 0 {
			t.Errorf("HoldCount after UnlockContext: got %d, want 0", held.HoldCount())
		}

		start = time.Now()
		wcancel()
		if err := waitErr(t, queued); !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled wait while etcd is unreachable: got %v, want context.Canceled", err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("cancelled wait while etcd is unreachable: returned after %v, want within 2s", d)
		}

		fresh := etcdlock.NewMutex(s, name+"-fresh")
		dctx, dcancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer dcancel()
		start = time.Now()
		err = fresh.LockContext(dctx)
		if d := time.Since(start); d > 1500*time.Millisecond {
			t.Errorf("LockContext with a 500ms deadline while etcd is unreachable: returned after %v, want within 1.5s", d)
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("LockContext while etcd is unreachable: got %v, want context.DeadlineExceeded", err)
		}
		t.Logf("LockContext with a 500ms deadline while etcd is unreachable: returned after %v", time.Since(start))

		proxy.Unblackhole()
		for _, n := range []string{name, name + "-waiting", name + "-fresh"} {
			eventually(t, "the background retry to delete our key of "+n, func() bool {
				return len(keysOfLease(t, client, n, s.Lease())) == 0
			})
		}
		if ttl, err := client.TimeToLive(ctx, s.Lease()); err != nil || ttl.TTL <= 0 {
			t.Errorf("our lease after the outage: TTL %v, %v, want alive (the keys were deleted by the retry)", ttl, err)
		}

		proxy.Blackhole()
		start = time.Now()
		err = s.Close()
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("Session.Close while etcd is unreachable: returned after %v, want within 5s", d)
		}
		t.Logf("Session.Close while etcd is unreachable: %v after %v", err, time.Since(start))
	})

	t.Run("upstream wait", func(t *testing.T) {
		srv, client := startServer(t)
		pc, proxy, rec := proxied(t, srv)
		name := lockName(t)
		ctx := testContext(t)
		holder := etcdlock.NewMutex(newSession(t, client), name)
		if err := holder.LockContext(ctx); err != nil {
			t.Fatal(err)
		}
		s := newUpstreamSession(t, pc, 5)
		m := concurrency.NewMutex(s, name)
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		ch := result(func() error { return m.Lock(wctx) })
		eventually(t, "the upstream waiter's watch", func() bool { return rec.watching(holder.Key()) })

		proxy.Blackhole()
		cancel()
		if !blocked(ch, 2*time.Second) {
			t.Fatal("upstream Lock returned within 2s of its cancel while etcd is unreachable, want it stuck in its cleanup (the defect: it uses client.Ctx())")
		}
		proxy.Unblackhole()
		select {
		case err := <-ch:
			t.Logf("upstream Lock returned once etcd was back: %v", err)
		case <-time.After(3 * time.Second):
			// Its delete was lost in the outage and has no deadline: only
			// closing the client ends it.
			t.Log("upstream Lock still stuck 3s after etcd came back; closing its client")
			_ = pc.Close()
			t.Logf("upstream Lock returned: %v", waitErr(t, ch))
		}
		if err := holder.UnlockContext(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("upstream close", func(t *testing.T) {
		srv, _ := startServer(t)
		pc, proxy := srv.ProxiedClient(t)
		t.Cleanup(proxy.Unblackhole)
		s, err := concurrency.NewSession(pc, concurrency.WithTTL(3))
		if err != nil {
			t.Fatal(err)
		}
		proxy.Blackhole()
		start := time.Now()
		ch := result(s.Close)
		if !blocked(ch, 2*time.Second) {
			t.Fatal("upstream Session.Close returned within 2s while etcd is unreachable, want it to block for its 3s TTL")
		}
		err = waitErr(t, ch)
		t.Logf("upstream Session.Close while etcd is unreachable: %v after %v", err, time.Since(start))
	})
}

// D8: a waiter whose own session ends returns ErrSessionExpired promptly,
// not when the holder leaves.
func TestD8WaiterSessionRevoked(t *testing.T) {
	srv, client := startServer(t)
	admin := startClient(t, client)
	var fault txnFault
	rec := &watchRecorder{rev: func() int64 { return 0 }}
	wc := interceptedClient(t, srv.Endpoints(), fault.intercept, rec.intercept)

	revoke := func(ctx context.Context, lease clientv3.LeaseID) error {
		_, err := admin.Revoke(ctx, lease)
		return err
	}
	// holder takes the lock with a session of its own.
	holder := func(t *testing.T, name string) *etcdlock.Mutex {
		m := etcdlock.NewMutex(newSession(t, client), name)
		if err := m.LockContext(testContext(t)); err != nil {
			t.Fatal(err)
		}
		return m
	}
	// expectExpired checks that the waiter returns ErrSessionExpired within
	// 2 s (1 s promised, with slack), and that the holder still holds.
	expectExpired := func(t *testing.T, name string, w *worker, h *etcdlock.Mutex) {
		start := time.Now()
		select {
		case err := <-w.locked:
			if !errors.Is(err, etcdlock.ErrSessionExpired) {
				t.Errorf("waiter's lock after its lease was revoked: got %v, want ErrSessionExpired", err)
			}
			t.Logf("waiter returned %v, %v after the revoke", err, time.Since(start))
		case <-time.After(2 * time.Second):
			t.Fatal("waiter's lock still blocked 2s after its lease was revoked, want ErrSessionExpired within 1s")
		}
		if got := h.HoldCount(); got != 1 {
			t.Errorf("holder's HoldCount: got %d, want 1", got)
		}
		if keys := lockKeys(t, client, name); len(keys) != 1 || keys[0] != h.Key() {
			t.Errorf("keys: got %q, want only the holder's %q", keys, h.Key())
		}
		if err := h.UnlockContext(testContext(t)); err != nil {
			t.Fatal(err)
		}
	}

	// With the default TTL (60 s), the keep-alive learns of a revoke only
	// up to 20 s later: the waiter must see its own key go instead.
	for _, how := range []struct {
		name string
		lock func(s *etcdlock.Session, name string) locker
	}{
		{"LockContext", func(s *etcdlock.Session, name string) locker { return oursOn(s, name) }},
		{"TryLockFor", func(s *etcdlock.Session, name string) locker { return oursFor{oursOn(s, name), time.Hour} }},
	} {
		t.Run(how.name+" revoked while waiting", func(t *testing.T) {
			name := lockName(t)
			h := holder(t, name)
			s := newSession(t, wc)
			w := lockInGoroutine(t, testContext(t), how.lock(s, name))
			eventually(t, "the waiter's watch on the holder's key", func() bool { return rec.watching(h.Key()) })
			if err := revoke(testContext(t), s.Lease()); err != nil {
				t.Fatal(err)
			}
			expectExpired(t, name, w, h)
		})

		// The revoke lands between the waiter's put and its first look at
		// its predecessor.
		t.Run(how.name+" revoked as the wait starts", func(t *testing.T) {
			name := lockName(t)
			h := holder(t, name)
			s := newSession(t, wc)
			eventually(t, "a keep-alive of the waiter's lease", func() bool { return rec.keptAlive(s.Lease()) })
			fault.arm(0, 1, func(ctx context.Context, invoke func() error) error {
				if err := invoke(); err != nil {
					return err
				}
				return revoke(ctx, s.Lease())
			})
			w := lockInGoroutine(t, testContext(t), how.lock(s, name))
			expectExpired(t, name, w, h)
			if n := fault.count(); n != 1 {
				t.Errorf("revokes after the put: got %d, want 1", n)
			}
		})
	}

	// Our key deleted by hand while the lease lives: queue again, behind
	// the holder.
	t.Run("ours deleted while waiting", func(t *testing.T) {
		name := lockName(t)
		h := holder(t, name)
		s := newSession(t, wc)
		m := etcdlock.NewMutex(s, name)
		w := lockInGoroutine(t, testContext(t), ours{m})
		eventually(t, "the waiter's watch on the holder's key", func() bool { return rec.watching(h.Key()) })
		key := keyOf(name, s.Lease())
		before := lockKeys(t, client, name)
		if _, err := admin.Delete(testContext(t), key); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the waiter's key back in the queue", func() bool {
			keys := lockKeys(t, client, name)
			return len(keys) == 2 && keys[1] == key
		})
		if !blocked(w.locked, 200*time.Millisecond) {
			t.Fatalf("waiter returned while the holder holds, after its key was deleted (keys before: %q)", before)
		}
		if err := h.UnlockContext(testContext(t)); err != nil {
			t.Fatal(err)
		}
		if err := waitErr(t, w.locked); err != nil {
			t.Fatalf("waiter after the holder left: got %v, want the lock", err)
		}
	})

	t.Run("upstream", func(t *testing.T) {
		name := lockName(t)
		h := holder(t, name)
		s := newUpstreamSession(t, wc, 3)
		w := lockInGoroutine(t, testContext(t), upstreamOn(s, name))
		eventually(t, "the waiter's watch on the holder's key", func() bool { return rec.watching(h.Key()) })
		if err := revoke(testContext(t), s.Lease()); err != nil {
			t.Fatal(err)
		}
		if !blocked(w.locked, 3*time.Second) {
			t.Fatal("upstream waiter returned within 3s of its lease's revoke, want it still waiting for the holder (the defect)")
		}
		if err := h.UnlockContext(testContext(t)); err != nil {
			t.Fatal(err)
		}
		t.Logf("upstream waiter returned after the holder left: %v", waitErr(t, w.locked))
	})
}

// startClient returns a second client of the server client is connected to.
func startClient(t *testing.T, client *clientv3.Client) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: client.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// D9: Lock (sync.Locker) retries a transient failure instead of panicking.
func TestD9LockerTransientFailure(t *testing.T) {
	srv, client := startServer(t)
	var fault txnFault
	ic := interceptedClient(t, srv.Endpoints(), fault.intercept, nil)
	transient := rpctypes.ErrGRPCTimeout // codes.Unavailable

	t.Run("ours", func(t *testing.T) {
		name := lockName(t)
		m := etcdlock.NewMutex(newSession(t, ic), name)
		fault.arm(0, 2, failWith(transient))
		type outcome struct {
			panicked any
			holds    int
		}
		done := make(chan outcome, 1)
		go func() {
			var o outcome
			o.panicked = catchPanic(m.Lock)
			if o.panicked == nil {
				o.holds = m.HoldCount()
				m.Unlock()
			}
			done <- o
		}()
		var o outcome
		select {
		case o = <-done:
		case <-time.After(testTimeout):
			t.Fatal("Lock still blocked after two transient failures")
		}
		if o.panicked != nil {
			t.Fatalf("Lock after two transient failures: panicked with %v, want it to retry and hold", o.panicked)
		}
		if o.holds != 1 {
			t.Errorf("HoldCount after Lock: got %d, want 1", o.holds)
		}
		if n := fault.count(); n != 2 {
			t.Errorf("failed Txns: got %d, want 2", n)
		}
		if keys := lockKeys(t, client, name); len(keys) != 0 {
			t.Errorf("keys after Unlock: got %q, want none", keys)
		}
	})

	t.Run("upstream", func(t *testing.T) {
		name := lockName(t)
		l := concurrency.NewLocker(newUpstreamSession(t, ic, 30), name)
		fault.arm(0, 2, failWith(transient))
		r := catchPanic(l.Lock)
		if r == nil {
			t.Fatal("upstream NewLocker's Lock after a transient failure: did not panic, want a panic (the defect)")
		}
		if err, ok := r.(error); !ok || !errors.Is(err, rpctypes.ErrTimeout) {
			t.Errorf("upstream panic: got %v, want the transient error %v", r, rpctypes.ErrTimeout)
		}
	})
}

// D11: a lock's name is not a plain prefix: holding "a/b" does not block "a".
// TestD11SameTxnNestedKey: one Txn creates a key of the lock and a key of a
// lock nested under it, both at one revision. Skipping the nested key must
// not skip the lock's key: TryLock, TryLockFor and a waiter all see the
// holder, and the waiter gets the lock once the holder's key goes.
func TestD11SameTxnNestedKey(t *testing.T) {
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	lease, err := client.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	holder := fmt.Sprintf("%s/%x", name, int64(lease.ID))
	// "-" sorts before every hex digit: in a tie on create revision, etcd
	// lists the nested key first.
	nested := fmt.Sprintf("%s/-/%x", name, int64(lease.ID))
	if _, err := client.Txn(ctx).Then(
		clientv3.OpPut(nested, "", clientv3.WithLease(lease.ID)),
		clientv3.OpPut(holder, "", clientv3.WithLease(lease.ID)),
	).Commit(); err != nil {
		t.Fatal(err)
	}

	s := newSession(t, client)
	m := etcdlock.NewMutex(s, name)
	if m.TryLock() {
		m.Unlock()
		t.Fatalf("TryLock while %q holds the lock: got true, want false", holder)
	}
	if ok, err := m.TryLockFor(ctx, 300*time.Millisecond); ok || err != nil {
		if ok {
			m.Unlock()
		}
		t.Fatalf("TryLockFor while %q holds the lock: got %v, %v, want false, nil", holder, ok, err)
	}
	w := lockInGoroutine(t, ctx, oursOn(s, name))
	select {
	case err := <-w.locked:
		t.Fatalf("LockContext returned %v while %q holds the lock, want it to wait", err, holder)
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := client.Delete(ctx, holder); err != nil {
		t.Fatal(err)
	}
	if err := waitErr(t, w.locked); err != nil {
		t.Fatalf("LockContext after the holder's key was deleted: %v", err)
	}
	if err := w.Release(); err != nil {
		t.Errorf("UnlockContext: %v", err)
	}
}

func TestD11NestedNames(t *testing.T) {
	_, client := startServer(t)
	for _, tc := range []struct {
		name string
		hold func(t *testing.T, name string) locker
	}{
		{"ours holds nested", func(t *testing.T, name string) locker { return oursOn(newSession(t, client), name) }},
		{"upstream holds nested", func(t *testing.T, name string) locker {
			return upstreamOn(newUpstreamSession(t, client, 30), name)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testContext(t)
			name := lockName(t)
			nested := tc.hold(t, name+"/b")
			if err := nested.Lock(ctx); err != nil {
				t.Fatal(err)
			}

			m := etcdlock.NewMutex(newSession(t, client), name)
			if !m.TryLock() {
				t.Fatalf("our TryLock of %q while %q is held: got false, want true", name, name+"/b")
			}
			m.Unlock()
			dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if err := m.LockContext(dctx); err != nil {
				t.Fatalf("our LockContext of %q while %q is held: %v", name, name+"/b", err)
			}
			m.Unlock()

			up := upstreamOn(newUpstreamSession(t, client, 30), name)
			ok, err := up.TryLock(ctx)
			if ok || err != nil {
				t.Errorf("upstream TryLock of %q while %q is held: got %v, %v, want false, nil (the defect)", name, name+"/b", ok, err)
			}
			if ok {
				_ = up.Unlock(ctx)
			}
			if err := nested.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// D11, the other side: what fixes nesting must not break exclusion between
// ours, upstream's (which is what `etcdctl lock` runs) and etcd's v3lock
// gRPC service on the same name.
func TestD11SameNameExcludes(t *testing.T) {
	_, local := startServer(t)
	child := v3lockServer(t)

	// excludes checks that b cannot take the lock while a holds it, and
	// that a waiting b gets it once a lets go.
	excludes := func(t *testing.T, a, b locker) {
		ctx := testContext(t)
		if err := a.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		if ok, err := b.TryLock(ctx); ok || err != nil {
			t.Errorf("TryLock while the other holds: got %v, %v, want false, nil", ok, err)
		}
		dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		if err := b.Lock(dctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Lock while the other holds: got %v, want context.DeadlineExceeded", err)
		}
		w := lockInGoroutine(t, ctx, b)
		if !blocked(w.locked, 100*time.Millisecond) {
			t.Fatal("Lock while the other holds: got the lock, want it waiting")
		}
		if err := a.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := waitErr(t, w.locked); err != nil {
			t.Fatalf("Lock after the other let go: %v", err)
		}
		if err := w.Release(); err != nil {
			t.Fatal(err)
		}
	}
	type factory func(t *testing.T, client *clientv3.Client) locker
	var (
		oursNamed factory = func(t *testing.T, client *clientv3.Client) locker {
			return oursOn(newSession(t, client), lockName(t))
		}
		upstreamNamed factory = func(t *testing.T, client *clientv3.Client) locker {
			return upstreamOn(newUpstreamSession(t, client, 30), lockName(t))
		}
		v3lockNamed factory = func(t *testing.T, client *clientv3.Client) locker {
			return newV3Lock(t, client, lockName(t))
		}
	)

	for _, tc := range []struct {
		name   string
		client *clientv3.Client
		a, b   factory
	}{
		{"ours then upstream", local, oursNamed, upstreamNamed},
		{"upstream then ours", local, upstreamNamed, oursNamed},
		{"ours then v3lock", child, oursNamed, v3lockNamed},
		{"v3lock then ours", child, v3lockNamed, oursNamed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			excludes(t, tc.a(t, tc.client), tc.b(t, tc.client))
			if keys := lockKeys(t, tc.client, lockName(t)); len(keys) != 0 {
				t.Errorf("keys at the end: got %q, want none", keys)
			}
		})
	}
}

const v3lockServerEnv = "ETCDLOCK_TEST_V3LOCK_SERVER"

// v3lockServer starts an embedded etcd in a child process and returns a
// client of it, closed by t.Cleanup. The v3lock service runs on an
// in-process client that etcd never closes: its lease keep-alive goroutines
// outlive the server, which goleak would report in this process.
func v3lockServer(t *testing.T) *clientv3.Client {
	t.Helper()
	ep := childServer(t)
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// childServer starts an embedded etcd in a child process (runV3lockServer)
// and returns its client URL. The child stops etcd and exits at tb.Cleanup.
func childServer(tb testing.TB) string {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), v3lockServerEnv+"=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	endpoint := make(chan string, 1)
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if ep, ok := strings.CutPrefix(sc.Text(), "endpoint "); ok {
				endpoint <- ep
			}
		}
	}()
	tb.Cleanup(func() {
		_ = stdin.Close() // the child stops etcd and exits
		select {
		case <-drained:
		case <-time.After(testTimeout):
			_ = cmd.Process.Kill()
			<-drained
		}
		_ = cmd.Wait()
	})
	select {
	case ep := <-endpoint:
		return ep
	case <-drained:
		tb.Fatalf("etcd child process exited without an endpoint: %s", stderr.String())
	case <-time.After(testTimeout):
		tb.Fatal("etcd child process gave no endpoint in time")
	}
	return ""
}

// runV3lockServer is the child process of v3lockServer, run from TestMain:
// it serves etcd until its stdin closes, then exits before goleak looks at
// the v3lock service's leftover goroutines.
func runV3lockServer() {
	srv, err := etcdtest.New()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("endpoint", srv.Endpoints()[0])
	_, _ = io.Copy(io.Discard, os.Stdin)
	srv.Close()
	os.Exit(0)
}

// v3Lock is a lock through etcd's v3lock gRPC service, which runs the same
// algorithm inside the server (`etcdctl lock` runs concurrency.Mutex in the
// client). Each Lock call gets a lease of its own, revoked when
// the call fails or the lock is released, so that the server's cleanup of a
// timed-out call can never remove the key of a later one.
type v3Lock struct {
	client *clientv3.Client
	lc     v3lockpb.LockClient
	name   string
	lease  clientv3.LeaseID // of the current hold
	key    []byte
}

func newV3Lock(t *testing.T, client *clientv3.Client, name string) *v3Lock {
	l := &v3Lock{client: client, lc: v3lockpb.NewLockClient(client.ActiveConnection()), name: name}
	t.Cleanup(func() { l.revoke(l.lease) })
	return l
}

func (l *v3Lock) revoke(id clientv3.LeaseID) {
	if id == clientv3.NoLease {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = l.client.Revoke(ctx, id)
}

func (l *v3Lock) Lock(ctx context.Context) error {
	grant, err := l.client.Grant(ctx, 30)
	if err != nil {
		return err
	}
	resp, err := l.lc.Lock(ctx, &v3lockpb.LockRequest{Name: []byte(l.name), Lease: int64(grant.ID)})
	if err != nil {
		l.revoke(grant.ID)
		if code := status.Code(err); (code == codes.DeadlineExceeded || code == codes.Canceled) && ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
	l.lease, l.key = grant.ID, resp.Key
	return nil
}

// TryLock is a Lock with a short deadline: the service has no try.
func (l *v3Lock) TryLock(ctx context.Context) (bool, error) {
	tctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	err := l.Lock(tctx)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return false, nil
	}
	return err == nil, err
}

func (l *v3Lock) Unlock(ctx context.Context) error {
	_, err := l.lc.Unlock(ctx, &v3lockpb.UnlockRequest{Key: l.key})
	l.revoke(l.lease)
	l.lease, l.key = clientv3.NoLease, nil
	return err
}

func (l *v3Lock) Key() string { return string(l.key) }

// unlockWhenQueued unlocks holder, held by the calling goroutine, once the
// lock called name has n keys in etcd.
func unlockWhenQueued(ctx context.Context, client *clientv3.Client, holder *etcdlock.Mutex, name string, n int64) error {
	for {
		resp, err := client.Get(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return err
		}
		if resp.Count >= n {
			return holder.UnlockContext(ctx)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// eventDropper swallows, once armed, the first watch response that reports
// the delete of one key, as etcd's watch bugs have (#17529, #18089, #19179,
// #20221).
type eventDropper struct {
	mu      sync.Mutex
	key     string
	dropped int
}

func (d *eventDropper) arm(key string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.key = key
}

func (d *eventDropper) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dropped
}

func (d *eventDropper) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || method != "/etcdserverpb.Watch/Watch" {
		return cs, err
	}
	return &droppingStream{ClientStream: cs, d: d}, nil
}

type droppingStream struct {
	grpc.ClientStream
	d *eventDropper
}

func (s *droppingStream) RecvMsg(m any) error {
	for {
		err := s.ClientStream.RecvMsg(m)
		resp, ok := m.(*pb.WatchResponse)
		if err != nil || !ok || !s.d.drop(resp) {
			return err
		}
	}
}

// drop reports whether resp is the armed delete, and disarms.
func (d *eventDropper) drop(resp *pb.WatchResponse) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, ev := range resp.Events {
		if d.key != "" && ev.Type == mvccpb.DELETE && string(ev.Kv.Key) == d.key {
			d.key = ""
			d.dropped++
			return true
		}
	}
	return false
}

// A waiter whose predecessor's delete never arrives (a watch event lost by
// etcd) still gets the lock, within a TTL of the delete: it reads its place
// again at least once per TTL.
func TestLostWatchEvent(t *testing.T) {
	srv, client := startServer(t)
	var d eventDropper
	wc := interceptedClient(t, srv.Endpoints(), nil, d.intercept)
	const ttl = 2 * time.Second
	name := lockName(t)

	h := etcdlock.NewMutex(newSession(t, client), name)
	if err := h.LockContext(testContext(t)); err != nil {
		t.Fatal(err)
	}
	s := newSession(t, wc, etcdlock.WithTTL(ttl))
	m := etcdlock.NewMutex(s, name)
	w := lockInGoroutine(t, testContext(t), ours{m})
	eventually(t, "the waiter's key", func() bool { return len(lockKeys(t, client, name)) == 2 })
	d.arm(h.Key())
	time.Sleep(100 * time.Millisecond) // let the waiter's watch be created
	released := time.Now()
	if err := h.UnlockContext(testContext(t)); err != nil {
		t.Fatal(err)
	}
	// The promise is one TTL; allow twice TTL + 1 s on a loaded machine.
	select {
	case err := <-w.locked:
		if err != nil {
			t.Fatalf("waiter: got %v, want the lock", err)
		}
		t.Logf("waiter got the lock %v after the lost delete (TTL %v)", time.Since(released), ttl)
	case <-time.After(2 * (ttl + time.Second)):
		t.Fatalf("waiter still waiting %v after its predecessor's delete was lost, want the lock within TTL (%v)", 2*(ttl+time.Second), ttl)
	}
	if n := d.count(); n != 1 {
		t.Errorf("delete events swallowed: got %d, want 1 (the test did not lose the event)", n)
	}
}
