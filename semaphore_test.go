package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/queue"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// queuedAcquire starts sem.Acquire(ctx), as acquireInGoroutine does, and
// returns once one more key is in name's queue in etcd: its own, queued.
func queuedAcquire(t *testing.T, ctx context.Context, client *clientv3.Client, name string, sem *etcdlock.Semaphore) <-chan permitResult {
	t.Helper()
	before := len(lockKeys(t, client, name))
	ch := acquireInGoroutine(ctx, sem)
	eventually(t, "the acquisition queued", func() bool { return len(lockKeys(t, client, name)) > before })
	return ch
}

// acquireInGoroutine starts sem.Acquire(ctx) and returns a channel with its
// permit (or error).
func acquireInGoroutine(ctx context.Context, sem *etcdlock.Semaphore) <-chan permitResult {
	ch := make(chan permitResult, 1)
	go func() {
		p, err := sem.Acquire(ctx)
		ch <- permitResult{p, err}
	}()
	return ch
}

type permitResult struct {
	p   *etcdlock.Permit
	err error
}

// admitted waits for a permit from ch, failing the test after testTimeout.
func admitted(t *testing.T, ch <-chan permitResult) *etcdlock.Permit {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("Acquire: %v", r.err)
		}
		return r.p
	case <-time.After(testTimeout):
		t.Fatal("timed out waiting for a permit")
		return nil
	}
}

// waiting reports whether nothing comes from ch within d.
func waiting(ch <-chan permitResult, d time.Duration) bool {
	select {
	case <-ch:
		return false
	case <-time.After(d):
		return true
	}
}

func release(t *testing.T, p *etcdlock.Permit) {
	t.Helper()
	if err := p.Release(testContext(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// TestSemaphoreLimit: holders of many sessions never exceed the limit, and
// do reach it; each holder's key is, in etcd, among the limit oldest.
func TestSemaphoreLimit(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	const limit, workers, rounds = 3, 8, 6
	var inside, most atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		sem := etcdlock.NewSemaphore(newSession(t, client), name, limit)
		wg.Go(func() {
			for range rounds {
				p, err := sem.Acquire(ctx)
				if err != nil {
					t.Errorf("Acquire: %v", err)
					return
				}
				raise(&most, inside.Add(1))
				resp, err := client.Get(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly(),
					clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(limit))
				if err != nil {
					t.Errorf("get: %v", err)
				} else if !hasKey(resp.Kvs, p.Key()) {
					t.Errorf("holder's key %q is not among the %d oldest", p.Key(), limit)
				}
				time.Sleep(20 * time.Millisecond)
				inside.Add(-1)
				if err := p.Release(ctx); err != nil {
					t.Errorf("Release: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	if got := most.Load(); got > limit || got < 2 {
		t.Errorf("most holders at once: got %d, want 2..%d", got, limit)
	}
	t.Logf("most holders at once: %d of %d", most.Load(), limit)
	if keys := lockKeys(t, client, name); len(keys) != 0 {
		t.Errorf("keys left: %q", keys)
	}
}

func hasKey(kvs []*mvccpb.KeyValue, key string) bool {
	for _, kv := range kvs {
		if string(kv.Key) == key {
			return true
		}
	}
	return false
}

// TestSemaphoreNoStrandedPermit: with limit 2 and keys a b c d queued in
// that order, b leaving first admits c at once (Curator's deprecated
// InterProcessSemaphore leaves that permit idle until a leaves, since c
// watches a), and a leaving then admits d.
func TestSemaphoreNoStrandedPermit(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	sems := make([]*etcdlock.Semaphore, 4)
	for i := range sems {
		sems[i] = etcdlock.NewSemaphore(newSession(t, client), name, 2)
	}
	a := admitted(t, acquireInGoroutine(ctx, sems[0]))
	b := admitted(t, acquireInGoroutine(ctx, sems[1]))
	c := queuedAcquire(t, ctx, client, name, sems[2])
	d := queuedAcquire(t, ctx, client, name, sems[3])
	time.Sleep(ownWait)
	if !waiting(c, 100*time.Millisecond) || !waiting(d, 0) {
		t.Fatal("c or d admitted while a and b hold both permits")
	}
	release(t, b)
	pc := admitted(t, c)
	if !waiting(d, 200*time.Millisecond) {
		t.Fatal("d admitted while a and c hold both permits")
	}
	release(t, a)
	pd := admitted(t, d)
	release(t, pc)
	release(t, pd)
}

// TestSemaphoreFIFO: waiters are admitted in the order they queued.
func TestSemaphoreFIFO(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	holder := etcdlock.NewSemaphore(newSession(t, client), name, 1)
	p := admitted(t, acquireInGoroutine(ctx, holder))
	var order []int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range 4 {
		sem := etcdlock.NewSemaphore(newSession(t, client), name, 1)
		queued := len(lockKeys(t, client, name))
		wg.Go(func() {
			q, err := sem.Acquire(ctx)
			if err != nil {
				t.Errorf("Acquire: %v", err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			if err := q.Release(ctx); err != nil {
				t.Errorf("Release: %v", err)
			}
		})
		eventually(t, "the waiter queued", func() bool { return len(lockKeys(t, client, name)) > queued })
	}
	release(t, p)
	wg.Wait()
	if fmt.Sprint(order) != "[0 1 2 3]" {
		t.Errorf("order of admission: got %v, want [0 1 2 3]", order)
	}
}

// TestSemaphoreNoHerd: with 20 waiters, a release wakes the head waiter and
// at most one more (the next in line, told by the admitted one), not all 20.
func TestSemaphoreNoHerd(t *testing.T) {
	testflags.Parallel(t)
	srv, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	const limit, waiters = 2, 20
	var events watchEvents
	wc := serverClient(t, srv, nil, events.intercept)

	var held []*etcdlock.Permit
	for range limit {
		held = append(held, admitted(t, acquireInGoroutine(ctx, etcdlock.NewSemaphore(newSession(t, client), name, limit))))
	}
	var queue []<-chan permitResult
	for range waiters {
		queue = append(queue, queuedAcquire(t, ctx, client, name, etcdlock.NewSemaphore(newSession(t, wc), name, limit)))
	}
	time.Sleep(ownWait)
	before := events.n.Load()
	// Release one permit at a time; each admits the next waiter, which
	// releases in turn.
	releases := 0
	for _, ch := range queue {
		release(t, held[0])
		releases++
		held = append(held[1:], admitted(t, ch))
	}
	for _, p := range held {
		release(t, p)
	}
	wakes := events.n.Load() - before
	t.Logf("%d releases woke waiters %d times", releases, wakes)
	if wakes > 3*int64(releases) {
		t.Errorf("watch events per release: got %d for %d releases, want at most 3 each (a herd gives ~%d)", wakes, releases, waiters)
	}
}

// TestSemaphoreNearHeadNoTxn: waiters near the head count their turn from
// the queue's events: as the holders leave one at a time and each waiter is
// admitted in turn, the waiters send no Txn but their releases' deletes (no
// read of their place, no wake-up write).
func TestSemaphoreNearHeadNoTxn(t *testing.T) {
	testflags.Parallel(t)
	srv, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	const limit, waiters = 2, queue.NearHead - 2
	var txns txnKinds
	watches := &watchRecorder{rev: func() int64 { return 0 }}
	wc := serverClient(t, srv, txns.intercept, watches.intercept)
	var held []*etcdlock.Permit
	for range limit {
		held = append(held, admitted(t, acquireInGoroutine(ctx, etcdlock.NewSemaphore(newSession(t, client), name, limit))))
	}
	var queued []<-chan permitResult
	for range waiters {
		// A TTL of a minute: no safety re-read in the test's time.
		queued = append(queued, queuedAcquire(t, ctx, client, name, etcdlock.NewSemaphore(newSession(t, wc, etcdlock.WithTTL(time.Minute)), name, limit)))
	}
	// Every waiter's watch of the queue is open, and of the limit record
	// (after 100 ms), and a read that a watch created after its waiter's
	// enqueue calls for is done.
	eventually(t, "the waiters' watches", func() bool {
		created := 0
		for _, c := range watches.list() {
			if c.created != 0 {
				created++
			}
		}
		return created >= 2*waiters
	})
	time.Sleep(ownWait)
	reads, puts := txns.reads.Load(), txns.puts.Load()
	for _, ch := range queued {
		release(t, held[0])
		held = append(held[1:], admitted(t, ch))
	}
	if r, p := txns.reads.Load()-reads, txns.puts.Load()-puts; r != 0 || p != 0 {
		t.Errorf("%d admissions near the head: the waiters sent %d reads and %d puts, want none", waiters, r, p)
	}
	for _, p := range held {
		release(t, p)
	}
}

// txnKinds counts the Txns a client sends: those that may put, those that
// may delete, and the others, reads.
type txnKinds struct {
	reads, puts, deletes atomic.Int64
}

func (c *txnKinds) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if txn, ok := req.(*pb.TxnRequest); ok {
		kind := &c.reads
		for _, op := range append(slices.Clone(txn.Success), txn.Failure...) {
			switch {
			case op.GetRequestPut() != nil:
				kind = &c.puts
			case op.GetRequestDeleteRange() != nil && kind != &c.puts:
				kind = &c.deletes
			}
		}
		kind.Add(1)
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// TestSemaphoreLimitMismatch: a holder with another limit, or a Mutex's key
// on the name, gives ErrLimitMismatch, and no key is left.
func TestSemaphoreLimitMismatch(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	p := admitted(t, acquireInGoroutine(ctx, etcdlock.NewSemaphore(newSession(t, client), name, 2)))
	s := newSession(t, client)
	other := etcdlock.NewSemaphore(s, name, 3)
	if _, err := other.Acquire(ctx); !errors.Is(err, etcdlock.ErrLimitMismatch) {
		t.Errorf("Acquire with limit 3 beside a holder of limit 2: got %v, want ErrLimitMismatch", err)
	}
	if _, err := other.TryAcquire(ctx, 0); !errors.Is(err, etcdlock.ErrLimitMismatch) {
		t.Errorf("TryAcquire with limit 3 beside a holder of limit 2: got %v, want ErrLimitMismatch", err)
	}
	if keys := keysOfLease(t, client, name, s.Lease()); len(keys) != 0 {
		t.Errorf("keys of the mismatched session: got %q, want none", keys)
	}
	release(t, p)

	m := etcdlock.NewMutex(newSession(t, client), name)
	if err := m.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := etcdlock.NewSemaphore(s, name, 2).TryAcquire(ctx, time.Second); !errors.Is(err, etcdlock.ErrLimitMismatch) {
		t.Errorf("TryAcquire beside a Mutex's key: got %v, want ErrLimitMismatch", err)
	}
	if keys := keysOfLease(t, client, name, s.Lease()); len(keys) != 0 {
		t.Errorf("keys of the mismatched session: got %q, want none", keys)
	}
	if err := m.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestSemaphoreCrashedHolder: a holder that dies without releasing (its
// keep-alives stop) gives its permit back when its lease expires, within
// the TTL.
func TestSemaphoreCrashedHolder(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	const ttl = 2 * time.Second
	dying := startClient(t, client)
	s, err := etcdlock.NewSession(dying, etcdlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := etcdlock.NewSemaphore(s, name, 1).Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	waiter := acquireInGoroutine(ctx, etcdlock.NewSemaphore(newSession(t, client), name, 1))
	if !waiting(waiter, 100*time.Millisecond) {
		t.Fatal("admitted while the holder holds the only permit")
	}
	crashed := time.Now()
	if err := dying.Close(); err != nil { // no revoke: the lease must expire
		t.Fatal(err)
	}
	p := admitted(t, waiter)
	t.Logf("permit back %v after the holder's client died (TTL %v)", time.Since(crashed), ttl)
	if took := time.Since(crashed); took > 2*ttl+2*time.Second {
		t.Errorf("permit back after %v, want within the TTL (%v), with slack", took, ttl)
	}
	release(t, p)
	_ = s.Close()
}

// TestPermit: a permit's key, token and guard while held; released once.
func TestPermit(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	sem := etcdlock.NewSemaphore(newSession(t, client), name, 2)
	if sem.Limit() != 2 || sem.Name() != name {
		t.Errorf("Limit, Name: got %d, %q", sem.Limit(), sem.Name())
	}
	p1, err := sem.TryAcquire(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := sem.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sem.TryAcquire(ctx, 50*time.Millisecond); !errors.Is(err, etcdlock.ErrNoPermit) {
		t.Errorf("TryAcquire with both permits held: got %v, want ErrNoPermit", err)
	}
	if p1.Key() == p2.Key() || p2.Token() <= p1.Token() {
		t.Errorf("two permits: keys %q, %q, tokens %d, %d: want distinct keys, increasing tokens", p1.Key(), p2.Key(), p1.Token(), p2.Token())
	}
	if keys := lockKeys(t, client, name); len(keys) != 2 || keys[0] != p1.Key() || keys[1] != p2.Key() {
		t.Errorf("keys: got %q, want [%q %q]", keys, p1.Key(), p2.Key())
	}
	done := p1.Done()
	release(t, p1)
	if !isClosed(done) {
		t.Error("Done open after Release")
	}
	if err := p1.Release(ctx); !errors.Is(err, etcdlock.ErrNotHeld) {
		t.Errorf("second Release: got %v, want ErrNotHeld", err)
	}
	if p1.Key() != "" || p1.Token() != 0 {
		t.Errorf("after Release: Key %q, Token %d, want \"\", 0", p1.Key(), p1.Token())
	}
	if resp, err := client.Txn(ctx).If(p1.IsOwner()).Commit(); err != nil || resp.Succeeded {
		t.Errorf("IsOwner Txn of a released permit: got %v, %v, want failure", resp, err)
	}
	if resp, err := client.Txn(ctx).If(p2.IsOwner()).Commit(); err != nil || !resp.Succeeded {
		t.Errorf("IsOwner Txn of a held permit: got %v, %v, want success", resp, err)
	}
	release(t, p2)
}
