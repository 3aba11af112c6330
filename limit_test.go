package etcdlock_test

// A Semaphore's limit that changes (SetLimit, ReadLimit), judged in etcd:
// the record's key, the keys that hold, who gets in.

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
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/queue"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// limitRecord returns the value of name's limit record in etcd, "" if none.
func limitRecord(t *testing.T, client *clientv3.Client, name string) string {
	t.Helper()
	resp, err := client.Get(testContext(t), queue.LimitKey(name))
	if err != nil {
		t.Fatalf("read the limit record: %v", err)
	}
	if len(resp.Kvs) == 0 {
		return ""
	}
	return string(resp.Kvs[0].Value)
}

// TestSetLimitLower: holders above a lowered limit keep their permits (in
// etcd: they hold, their fences check); a new acquisition waits until the
// permits held fit within the new limit.
func TestSetLimitLower(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	var held []*etcdlock.Permit
	for range 3 {
		p, err := etcdlock.NewSemaphore(newSession(t, client), name, 3).Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, p)
	}
	if n, err := etcdlock.ReadLimit(ctx, client, name); err != nil || n != 3 {
		t.Errorf("ReadLimit before: got %d, %v, want 3 (the holders')", n, err)
	}
	if err := etcdlock.SetLimit(ctx, client, name, 1); err != nil {
		t.Fatalf("SetLimit(1): %v", err)
	}
	if n, err := etcdlock.ReadLimit(ctx, client, name); err != nil || n != 1 {
		t.Errorf("ReadLimit after: got %d, %v, want 1", n, err)
	}
	if rec := limitRecord(t, client, name); rec == "" {
		t.Fatal("no limit record in etcd")
	} else {
		t.Logf("record: %q", rec)
	}
	if got, _ := permitsInEtcd(t, client, name, 3); len(got) != 3 {
		t.Errorf("holders after lowering: got %q, want the 3 kept", got)
	}
	for _, p := range held {
		if err := etcdlock.CheckFence(ctx, client, p.Fence()); err != nil {
			t.Errorf("CheckFence of a kept permit: %v", err)
		}
		if isClosed(p.Done()) {
			t.Error("a kept permit's Done closed")
		}
	}
	newcomer := acquireInGoroutine(ctx, etcdlock.NewSemaphore(newSession(t, client), name, 3))
	for i, p := range held {
		if !waiting(newcomer, 300*time.Millisecond) {
			t.Fatalf("a new acquisition got in with %d kept permits held, limit 1", len(held)-i)
		}
		release(t, p)
	}
	p := admitted(t, newcomer)
	if got, _ := permitsInEtcd(t, client, name, 3); len(got) != 1 || got[0] != p.Key() {
		t.Errorf("holders: got %q, want only %q", got, p.Key())
	}
	release(t, p)
}

// TestSetLimitLowerWhileWaiting: waiters queued before a lowering, near
// the head, count their turn from the queue's events with the limit they
// read when they queued. The lowering touches their keys, so that they read
// it before any release: as 3 holders of limit 4 leave one by one, neither
// waiter gets in until the permits held fit the new limit of 1, and then
// only the first. (Without the touch, the first waiter got in as the first
// holder left, 3 permits held at limit 1.)
func TestSetLimitLowerWhileWaiting(t *testing.T) {
	testflags.Parallel(t)
	srv, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	var held []*etcdlock.Permit
	for range 4 {
		p, err := etcdlock.NewSemaphore(newSession(t, client), name, 4).Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, p)
	}
	watches := &watchRecorder{rev: func() int64 { return 0 }, prefix: serverPrefix(t, srv)}
	wc := serverClient(t, srv, nil, watches.intercept)
	var waiters []<-chan permitResult
	for range 2 {
		waiters = append(waiters, queuedAcquire(t, ctx, client, name, etcdlock.NewSemaphore(newSession(t, wc, etcdlock.WithTTL(time.Minute)), name, 4)))
	}
	eventually(t, "both waiters watch the queue", func() bool {
		n := 0
		for _, c := range watches.list() {
			n += btoi(c.created != 0 && c.key == watches.prefix+name+"/")
		}
		return n == 2
	})
	before, err := queueKeys(ctx, client, name)
	if err != nil {
		t.Fatal(err)
	}
	if err := etcdlock.SetLimit(ctx, client, name, 1); err != nil {
		t.Fatalf("SetLimit(1): %v", err)
	}
	// The touch puts each waiter's key again, its value and lease kept.
	after, err := queueKeys(ctx, client, name)
	if err != nil || len(after) != len(before) {
		t.Fatalf("keys after SetLimit: %v, %v", after, err)
	}
	for i, kv := range after {
		was := before[i]
		touched := i >= len(held)
		if kv.CreateRevision != was.CreateRevision || kv.Lease != was.Lease || string(kv.Value) != string(was.Value) || (kv.Version > was.Version) != touched {
			t.Errorf("key %s after SetLimit: lease %x value %q version %d; was lease %x value %q version %d (touched: %v)",
				kv.Key, kv.Lease, kv.Value, kv.Version, was.Lease, was.Value, was.Version, touched)
		}
	}
	for len(held) > 1 {
		release(t, held[0])
		held = held[1:]
		for i, w := range waiters {
			if !waiting(w, 300*time.Millisecond) {
				t.Fatalf("waiter %d got in with %d kept permits held, limit 1", i, len(held))
			}
		}
	}
	release(t, held[0])
	first := admitted(t, waiters[0])
	if !waiting(waiters[1], 300*time.Millisecond) {
		t.Fatal("the second waiter got in beside the first, limit 1")
	}
	if got, _ := permitsInEtcd(t, client, name, 4); len(got) != 1 || got[0] != first.Key() {
		t.Errorf("holders: got %q, want only %q", got, first.Key())
	}
	release(t, first)
	release(t, admitted(t, waiters[1]))
}

// TestSetLimitRaise: a raised limit admits the waiters at once, the head by
// its watch of the record and the next by the head's wake-up (a TTL of a
// minute: no safety re-read comes in time); a Semaphore made with another
// limit is no mismatch once a limit is recorded.
func TestSetLimitRaise(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	sem := func(limit int) *etcdlock.Semaphore {
		return etcdlock.NewSemaphore(newSession(t, client, etcdlock.WithTTL(time.Minute)), name, limit)
	}
	holder, err := sem(1).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a := queuedAcquire(t, ctx, client, name, sem(1))
	b := queuedAcquire(t, ctx, client, name, sem(1))
	if !waiting(a, 200*time.Millisecond) || !waiting(b, 0) {
		t.Fatal("a waiter got in at limit 1")
	}
	start := time.Now()
	if err := etcdlock.SetLimit(ctx, client, name, 3); err != nil {
		t.Fatalf("SetLimit(3): %v", err)
	}
	pa, pb := admitted(t, a), admitted(t, b)
	// Logged, not bounded: with a TTL of a minute, a raise that woke no one
	// would leave them waiting past admitted's wait.
	t.Logf("both waiters admitted %v after the raise", time.Since(start))
	if got, _ := permitsInEtcd(t, client, name, 1); len(got) != 3 {
		t.Errorf("holders: got %q, want 3", got)
	}
	// Another limit is no mismatch under a record.
	p, err := sem(7).TryAcquire(ctx, 0)
	if !errors.Is(err, etcdlock.ErrNoPermit) {
		t.Errorf("a fourth, made with limit 7, at recorded limit 3: got %v, %v, want ErrNoPermit", p, err)
	}
	for _, p := range []*etcdlock.Permit{holder, pa, pb} {
		release(t, p)
	}
}

// TestSetLimitBadInput: bad input is an error that writes nothing; a queue
// that is no Semaphore's, or whose holders disagree on the limit, is
// ErrLimitMismatch.
func TestSetLimitBadInput(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	for _, tc := range []struct {
		what   string
		ctx    context.Context
		client *clientv3.Client
		name   string
		limit  int
		want   error
	}{
		{"nil context", nil, client, name, 2, etcdlock.ErrInvalidArgument},
		{"nil client", ctx, nil, name, 2, etcdlock.ErrInvalidArgument},
		{"empty name", ctx, client, "", 2, etcdlock.ErrInvalidName},
		{"limit 0", ctx, client, name, 0, etcdlock.ErrInvalidArgument},
		{"limit -1", ctx, client, name, -1, etcdlock.ErrInvalidArgument},
	} {
		if err := etcdlock.SetLimit(tc.ctx, tc.client, tc.name, tc.limit); !errors.Is(err, tc.want) {
			t.Errorf("SetLimit, %s: got %v, want %v", tc.what, err, tc.want)
		}
	}
	//lint:ignore SA1012 a nil context is the bad input under test
	if _, err := etcdlock.ReadLimit(nil, client, name); !errors.Is(err, etcdlock.ErrInvalidArgument) {
		t.Errorf("ReadLimit(nil ctx): got %v, want ErrInvalidArgument", err)
	}
	if n, err := etcdlock.ReadLimit(ctx, client, name); err != nil || n != 0 {
		t.Errorf("ReadLimit of nothing: got %d, %v, want 0, nil", n, err)
	}

	m := etcdlock.NewMutex(newSession(t, client), name)
	if err := m.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	if err := etcdlock.SetLimit(ctx, client, name, 2); !errors.Is(err, etcdlock.ErrLimitMismatch) {
		t.Errorf("SetLimit on a Mutex's queue: got %v, want ErrLimitMismatch", err)
	}
	if err := m.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
	if rec := limitRecord(t, client, name); rec != "" {
		t.Errorf("a record after refused calls: %q", rec)
	}
}

// TestSetLimitChurn: the limit changes while Sessions take and give back
// permits: every permit given holds in etcd at that moment (by the rule,
// read from the keys and the record: permitsInEtcd), the permits
// held never exceed the highest limit set, and at the end, at the last
// limit, the queue drains and a whole limit is given.
func TestSetLimitChurn(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	const workers, most = 6, 3
	var inUse, peak, given atomic.Int64
	running := atomic.Bool{}
	running.Store(true)
	var wg sync.WaitGroup
	for range workers {
		sem := etcdlock.NewSemaphore(newSession(t, client), name, 2)
		wg.Go(func() {
			for running.Load() {
				p, err := sem.Acquire(ctx)
				if err != nil {
					t.Errorf("Acquire: %v", err)
					return
				}
				given.Add(1)
				if ok, _ := holdsInEtcd(t, client, name, 2, p.Key()); !ok {
					t.Errorf("a permit given does not hold in etcd: %s", p.Key())
				}
				raise(&peak, inUse.Add(1))
				time.Sleep(2 * time.Millisecond)
				inUse.Add(-1)
				if err := p.Release(ctx); err != nil {
					t.Errorf("Release: %v", err)
					return
				}
			}
		})
	}
	for _, limit := range []int{1, most, 2, 1, most, 1, 2} {
		if err := etcdlock.SetLimit(ctx, client, name, limit); err != nil {
			t.Fatalf("SetLimit(%d): %v", limit, err)
		}
		time.Sleep(60 * time.Millisecond)
	}
	running.Store(false)
	wg.Wait()
	t.Logf("%d permits given; at most %d held at once (highest limit %d)", given.Load(), peak.Load(), most)
	if peak.Load() > most {
		t.Errorf("%d permits held at once, above every limit set", peak.Load())
	}
	if keys := lockKeys(t, client, name); len(keys) != 0 {
		t.Errorf("keys left: %q", keys)
	}
	p, err := etcdlock.NewSemaphore(newSession(t, client), name, 9).AcquireN(ctx, 2)
	if err != nil {
		t.Fatalf("AcquireN(2) at the last limit: %v", err)
	}
	if got, _ := permitsInEtcd(t, client, name, 2); len(got) != 1 {
		t.Errorf("holders: got %q", got)
	}
	release(t, p)
}

// TestSetLimitRaiseRaces: a raise is guarded by the record alone, and
// touches the first waiters of its read; a waiter that queued between its
// read and its write, or moved near the head then behind a touched waiter
// admitted meanwhile, is not touched, and learns of the raise through its
// watch of the record (after 100 ms of waiting). Without that watch, each
// stayed waiting under a raised limit until its read per TTL (a minute).
func TestSetLimitRaiseRaces(t *testing.T) {
	testflags.Parallel(t)
	srv, client := startServer(t)
	sem := func(name string, limit int) *etcdlock.Semaphore {
		return etcdlock.NewSemaphore(newSession(t, client, etcdlock.WithTTL(time.Minute)), name, limit)
	}
	t.Run("a waiter queued between the read and the write", func(t *testing.T) {
		ctx, name := testContext(t), lockName(t)
		holder, err := sem(name, 1).Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var w <-chan permitResult
		hc := aroundWrite(t, srv, name, func() {
			w = queuedAcquire(t, ctx, client, name, sem(name, 1))
		}, nil)
		if err := etcdlock.SetLimit(ctx, hc, name, 2); err != nil {
			t.Fatalf("SetLimit(2): %v", err)
		}
		release(t, admitted(t, w))
		release(t, holder)
	})
	t.Run("the touched waiter admitted before the write", func(t *testing.T) {
		ctx, name := testContext(t), lockName(t)
		holder, err := sem(name, 1).Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		w1 := queuedAcquire(t, ctx, client, name, sem(name, 1))
		var p1 *etcdlock.Permit
		var w2 <-chan permitResult
		hc := aroundWrite(t, srv, name, func() {
			release(t, holder)
			p1 = admitted(t, w1)
			w2 = queuedAcquire(t, ctx, client, name, sem(name, 1))
		}, nil)
		if err := etcdlock.SetLimit(ctx, hc, name, 3); err != nil {
			t.Fatalf("SetLimit(3): %v", err)
		}
		release(t, admitted(t, w2))
		release(t, p1)
	})
}

// TestSetLimitFirstWrite: with no limit record, SetLimit takes the limit in
// force from the keys' values, and a first record must keep every key that
// holds by the rule when it lands, whatever limit its Semaphore was made
// with. Between SetLimit's read and its write the queue empties and
// Semaphores made with another limit take it (allowed while no record
// says the limit): the first write must not land on the keys it read.
// Judged in etcd: every permit that Acquire returned holds by the rule read
// from etcd (keys and record in one Txn), and its fence checks.
func TestSetLimitFirstWrite(t *testing.T) {
	testflags.Parallel(t)
	srv, client := startServer(t)
	sem := func(name string, limit int) *etcdlock.Semaphore {
		return etcdlock.NewSemaphore(newSession(t, client, etcdlock.WithTTL(time.Minute)), name, limit)
	}
	holdsByRule := func(t *testing.T, ctx context.Context, name string, ps ...*etcdlock.Permit) {
		t.Helper()
		holders, sum := permitsInEtcd(t, client, name, 1)
		for _, p := range ps {
			if !slices.Contains(holders, p.Key()) {
				t.Errorf("%s: Acquire returned it and it was never released, but etcd's rule says it waits (holders %q, %d permits)", p.Key(), holders, sum)
			}
			if err := etcdlock.CheckFence(ctx, client, p.Fence()); err != nil {
				t.Errorf("CheckFence(%s): %v", p.Key(), err)
			}
		}
	}
	// A (limit 1) holds alone; SetLimit(1) reads [A]. Before its write,
	// A leaves, X1 and X2 (limit 2) hold and X3 (limit 2) waits near the
	// head, counting with its own limit; X1 leaves as the write's reply
	// comes. On the defect the record "limit=1 keep=A" landed, and X3,
	// never touched, held beside X2 under a limit of 1.
	t.Run("a waiter of another limit", func(t *testing.T) {
		ctx, name := testContext(t), lockName(t)
		a, err := sem(name, 1).Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var x1, x2 *etcdlock.Permit
		var w <-chan permitResult
		hc := aroundWrite(t, srv, name, func() {
			release(t, a)
			var err error
			if x1, err = sem(name, 2).Acquire(ctx); err != nil {
				t.Error(err)
			}
			if x2, err = sem(name, 2).Acquire(ctx); err != nil {
				t.Error(err)
			}
			w = queuedAcquire(t, ctx, client, name, sem(name, 2))
		}, func() {
			if x1 != nil {
				release(t, x1)
			}
		})
		if err := etcdlock.SetLimit(ctx, hc, name, 1); err != nil {
			t.Fatalf("SetLimit(1): %v", err)
		}
		if x2 == nil {
			t.FailNow()
		}
		x3 := admitted(t, w)
		holdsByRule(t, ctx, name, x2, x3)
		if n, err := etcdlock.ReadLimit(ctx, client, name); err != nil || n != 1 {
			t.Errorf("ReadLimit: got %d, %v, want 1", n, err)
		}
		release(t, x3)
		release(t, x2)
	})
	// A (limit 2) holds alone; SetLimit(3) reads [A] and takes 3 for a
	// raise. Before its write, A leaves and five Semaphores made with
	// limit 5 hold. On the defect the record "limit=3 keep=A" kept none of
	// them, and two of five holders were waiters by the rule.
	t.Run("holders of another limit", func(t *testing.T) {
		ctx, name := testContext(t), lockName(t)
		a, err := sem(name, 2).Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var xs []*etcdlock.Permit
		hc := aroundWrite(t, srv, name, func() {
			release(t, a)
			for range 5 {
				p, err := sem(name, 5).Acquire(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				xs = append(xs, p)
			}
		}, nil)
		if err := etcdlock.SetLimit(ctx, hc, name, 3); err != nil {
			t.Fatalf("SetLimit(3): %v", err)
		}
		if len(xs) != 5 {
			t.FailNow()
		}
		holdsByRule(t, ctx, name, xs...)
		for _, p := range xs {
			release(t, p)
		}
	})
}

// aroundWrite returns a client of srv that runs before once, as it is about
// to send the first Txn that writes the limit record of name (SetLimit's),
// and after (if not nil) once, as soon as that Txn's reply comes.
func aroundWrite(t *testing.T, srv *etcdtest.Server, name string, before, after func()) *clientv3.Client {
	var b, a sync.Once
	intercept := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		writes := false
		if txn, ok := req.(*pb.TxnRequest); ok {
			for _, op := range txn.Success {
				if put := op.GetRequestPut(); put != nil && strings.HasSuffix(string(put.Key), queue.LimitKey(name)) {
					writes = true
				}
			}
		}
		if writes {
			b.Do(before)
		}
		err := invoker(ctx, method, req, reply, cc, opts...)
		if writes && after != nil {
			a.Do(after)
		}
		return err
	}
	return serverClient(t, srv, intercept, nil)
}
