package etcdlock_test

// The loss watch of a lease term (losswatch.go): what watching many holds
// costs, and that a loss among many closes the right Done, and that one only.

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// A heldMany is n Mutexes held by 8 goroutines, each its share: a hold
// belongs to the goroutine that took it, which must unlock it.
type heldMany struct {
	ms      []*etcdlock.Mutex
	release chan map[int]bool
	wg      sync.WaitGroup
	errs    []error
}

// lockMany locks n Mutexes of s named name/0 ... name/n-1, 8 goroutines at
// a time, and returns them held.
func lockMany(t *testing.T, s *etcdlock.Session, name string, n int) *heldMany {
	t.Helper()
	ctx := testContext(t)
	h := &heldMany{ms: make([]*etcdlock.Mutex, n), release: make(chan map[int]bool), errs: make([]error, 8)}
	var taken sync.WaitGroup
	for w := range h.errs {
		taken.Add(1)
		h.wg.Go(func() {
			for i := w; i < n && h.errs[w] == nil; i += len(h.errs) {
				h.ms[i] = etcdlock.NewMutex(s, fmt.Sprintf("%s/%d", name, i))
				h.errs[w] = h.ms[i].LockContext(ctx)
			}
			taken.Done()
			lost, ok := <-h.release
			if !ok || h.errs[w] != nil {
				return
			}
			for i := w; i < n; i += len(h.errs) {
				err := h.ms[i].UnlockContext(ctx)
				switch {
				case lost[i] && err == nil:
					h.errs[w] = fmt.Errorf("UnlockContext of the lost hold %d: got nil, want an error", i)
				case !lost[i] && err != nil:
					h.errs[w] = fmt.Errorf("UnlockContext of hold %d: %w", i, err)
				}
			}
		})
	}
	taken.Wait()
	for _, err := range h.errs {
		if err != nil {
			close(h.release)
			h.wg.Wait()
			t.Fatalf("LockContext: %v", err)
		}
	}
	return h
}

// unlock unlocks every hold, and fails the test unless the unlock of each
// hold in lost fails and every other succeeds.
func (h *heldMany) unlock(t *testing.T, lost ...int) {
	t.Helper()
	set := make(map[int]bool)
	for _, i := range lost {
		set[i] = true
	}
	for range h.errs {
		h.release <- set
	}
	h.wg.Wait()
	for _, err := range h.errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// liveMemory returns the live heap and goroutine stacks after a GC, and the
// goroutines.
func liveMemory() (bytes uint64, goroutines int) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc + ms.StackInuse, runtime.NumGoroutine()
}

// TestLossWatchCosts: 2,000 holds of one Session, each with Done watched,
// cost a few goroutines in all (at most 30: the loss watch's are a constant
// of the term, about 10) and at most 8 KiB of heap and stacks a hold beyond
// the holds themselves (the goal is 4 KiB: the bound is generous, as the
// heap moves between two GCs), and their safety re-read is batched:
// about one Txn a TTL per 128 holds, not one per hold.
func TestLossWatchCosts(t *testing.T) {
	// Alone, not in parallel: it measures the process's memory. -short
	// measures fewer holds over one TTL.
	n, ttls := 2000, 3
	if testing.Short() {
		n, ttls = 500, 1
	}
	srv, _ := startServer(t)
	var reads atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if c, ok := classify(method, req); ok && c == callLossRead {
			reads.Add(1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	client := serverClient(t, srv, count, nil)
	const ttl = 3 * time.Second
	s := newSession(t, client, etcdlock.WithTTL(ttl))
	held := lockMany(t, s, lockName(t), n)
	defer held.unlock(t)

	heldBytes, heldGoroutines := liveMemory()
	dones := watchAll(held.ms)
	// The watch is opened, and widened, as the holds come: let it settle.
	time.Sleep(500 * time.Millisecond)
	bytes, goroutines := liveMemory()
	perHold := float64(int64(bytes)-int64(heldBytes)) / float64(n)
	goroutinesPerHold := float64(goroutines-heldGoroutines) / float64(n)
	t.Logf("Done on %d holds: %d goroutines (%.3f a hold), %.0f bytes of heap and stacks a hold", n, goroutines-heldGoroutines, goroutinesPerHold, perHold)
	if extra := goroutines - heldGoroutines; goroutinesPerHold > 2 || extra > 30 {
		t.Errorf("goroutines for %d holds with Done watched: got %d (%.3f a hold), want a few for them all (at most 30; the loss watch runs about 10)", n, extra, goroutinesPerHold)
	}
	if perHold > 8<<10 {
		t.Errorf("heap and stacks a hold with Done watched: got %.0f bytes, want at most 8 KiB", perHold)
	}

	before := reads.Load()
	time.Sleep(time.Duration(ttls) * ttl)
	got := reads.Load() - before
	batches := int64((n + 127) / 128)
	t.Logf("safety re-read: %d Txns in %d TTLs for %d holds (%d Txns a read of them all)", got, ttls, n, batches)
	if want := 2 * int64(ttls+1) * batches; got > want { // 2× slack: a watch restart on a loaded machine adds a full read
		t.Errorf("safety re-read Txns in %d TTLs: got %d, want at most %d", ttls, got, want)
	}
	for i, d := range dones {
		if isClosed(d) {
			t.Fatalf("Done of hold %d closed with nothing lost", i)
		}
	}
}

// closedDones returns the indexes of the channels in dones that are closed.
func closedDones(dones []<-chan struct{}) []int {
	var closed []int
	for i, d := range dones {
		if isClosed(d) {
			closed = append(closed, i)
		}
	}
	return closed
}

// watchAll calls Done on each of ms.
func watchAll(ms []*etcdlock.Mutex) []<-chan struct{} {
	dones := make([]<-chan struct{}, len(ms))
	for i, m := range ms {
		dones[i] = m.Done()
	}
	return dones
}

// onlyClosed fails the test unless, within doneBound, the Done of hold i
// of dones closes, and, 300 ms later, no other.
func onlyClosed(t *testing.T, what string, dones []<-chan struct{}, i int) {
	t.Helper()
	took, ok := closedWithin(dones[i], doneBound)
	if !ok {
		t.Fatalf("Done %v after %s: got open, want closed", doneBound, what)
	}
	t.Logf("Done closed %v after %s", took.Round(time.Millisecond), what)
	time.Sleep(300 * time.Millisecond)
	if got := closedDones(dones); len(got) != 1 || got[0] != i {
		t.Errorf("Done channels closed after %s: got holds %v, want [%d]", what, got, i)
	}
}

// TestLossWatchDeleteOne: the delete of one key among 50 watched closes
// that hold's Done only.
func TestLossWatchDeleteOne(t *testing.T) {
	testflags.Parallel(t)
	srv, client := startServer(t)
	other := srv.Client(t)
	s := newSession(t, client, etcdlock.WithTTL(5*time.Second))
	held := lockMany(t, s, lockName(t), 50)
	dones := watchAll(held.ms)
	if _, err := other.Delete(testContext(t), held.ms[17].Key()); err != nil {
		t.Fatal(err)
	}
	onlyClosed(t, "one key of 50 was deleted", dones, 17)
	held.unlock(t, 17)
}

// TestLossWatchKeepsFailing: a loss watch whose watches fail as soon as they
// are opened (each served from a compacted revision) reads the held key and
// opens its watch again, waiting longer each time: judged by when etcd was
// asked for each watch. Done stays open while the key is there, and closes
// once it is deleted, within a TTL and Done's bound (the safety re-read).
func TestLossWatchKeepsFailing(t *testing.T) {
	testflags.Parallel(t)
	srv, client := startServer(t)
	ctx, name := testContext(t), lockName(t)
	compactFirstRevision(t, ctx, client, name)
	prefix := serverPrefix(t, srv)
	w := &failingWatches{fails: func(key string, _ int64) bool { return strings.HasPrefix(strings.TrimPrefix(key, prefix), name) }}
	const ttl = 2 * time.Second
	m := etcdlock.NewMutex(newSession(t, serverClient(t, srv, nil, w.intercept), etcdlock.WithTTL(ttl)), name)
	if err := m.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	done := m.Done()
	// Four watches take 100 + 200 + 400 ms of pauses at the least; on a
	// loaded machine, each read and watch takes longer.
	eventually(t, "four failing watches", func() bool { return len(w.times()) >= 4 })
	if isClosed(done) {
		t.Fatal("Done closed while the key is there")
	}
	at := w.times()
	t.Logf("failing watches asked for at %v", at)
	for i := 2; i < 4; i++ {
		// The pause before the i-th watch, less the slack of a timer.
		want := 100 * time.Millisecond << (i - 2) * 9 / 10
		if gap := at[i].Sub(at[i-1]); gap < want {
			t.Errorf("watch %d asked for %v after the one before, want at least %v (pauses that grow)", i, gap, want)
		}
	}
	if _, err := client.Delete(ctx, m.Key()); err != nil {
		t.Fatal(err)
	}
	if _, ok := closedWithin(done, ttl+doneBound); !ok {
		t.Fatalf("Done %v after the key's delete: got open, want closed", ttl+doneBound)
	}
	if err := m.UnlockContext(ctx); !errors.Is(err, etcdlock.ErrLockLost) {
		t.Errorf("unlock after the delete: got %v, want ErrLockLost", err)
	}
}

// TestLossWatchOutsidePrefix: a hold whose key lies outside the prefix the
// watch covers (another lock's name, with nothing in common) widens the
// watch, and its delete closes its Done only; the first holds' deletes are
// still seen.
func TestLossWatchOutsidePrefix(t *testing.T) {
	testflags.Parallel(t)
	srv, client := startServer(t)
	other := srv.Client(t)
	ctx := testContext(t)
	s := newSession(t, client, etcdlock.WithTTL(5*time.Second))
	held := lockMany(t, s, lockName(t), 4)
	ms := held.ms
	dones := watchAll(ms)
	time.Sleep(200 * time.Millisecond) // the watch of their prefix opens
	out := etcdlock.NewMutex(s, "elsewhere/"+t.Name())
	if err := out.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	dones = append(dones, out.Done())
	if _, err := other.Delete(ctx, out.Key()); err != nil {
		t.Fatal(err)
	}
	onlyClosed(t, "the key outside the prefix was deleted", dones, 4)
	if err := out.UnlockContext(ctx); err == nil {
		t.Error("UnlockContext of the lost hold: got nil, want ErrLockLost")
	}
	if _, err := other.Delete(ctx, ms[2].Key()); err != nil {
		t.Fatal(err)
	}
	if took, ok := closedWithin(dones[2], doneBound); !ok {
		t.Errorf("Done %v after a key inside the first prefix was deleted: got open, want closed", doneBound)
	} else {
		t.Logf("Done closed %v after a key inside the first prefix was deleted", took.Round(time.Millisecond))
	}
	if got := closedDones(dones); !slices.Equal(got, []int{2, 4}) {
		t.Errorf("Done channels closed: got holds %v, want [2 4]", got)
	}
	held.unlock(t, 2)
}

// TestLossWatchDeletedBeforeDone: a key deleted between its acquisition
// and the first call of its Done closes that Done: where no watch runs yet,
// and where the running watch has passed the delete before the hold was
// watched.
func TestLossWatchDeletedBeforeDone(t *testing.T) {
	testflags.Parallel(t)
	srv, client := startServer(t)
	other := srv.Client(t)
	ctx := testContext(t)
	s := newSession(t, client, etcdlock.WithTTL(5*time.Second))
	name := lockName(t)

	first := etcdlock.NewMutex(s, name+"/first")
	if err := first.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Delete(ctx, first.Key()); err != nil {
		t.Fatal(err)
	}
	if took, ok := closedWithin(first.Done(), doneBound); !ok {
		t.Fatalf("Done %v after its key was deleted, no watch running: got open, want closed", doneBound)
	} else {
		t.Logf("no watch running: Done closed %v after it was asked for", took.Round(time.Millisecond))
	}
	_ = first.UnlockContext(ctx)

	held := lockMany(t, s, name+"/held", 3)
	ms := held.ms
	dones := watchAll(ms)
	late := etcdlock.NewMutex(s, name+"/held/late")
	if err := late.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Delete(ctx, late.Key()); err != nil {
		t.Fatal(err)
	}
	// A delete after it, seen by the watch: the watch has passed the
	// late key's delete.
	if _, err := other.Delete(ctx, ms[0].Key()); err != nil {
		t.Fatal(err)
	}
	if _, ok := closedWithin(dones[0], doneBound); !ok {
		t.Fatalf("Done %v after a watched key was deleted: got open, want closed", doneBound)
	}
	if took, ok := closedWithin(late.Done(), doneBound); !ok {
		t.Fatalf("Done %v after it was asked for, its key deleted before: got open, want closed", doneBound)
	} else {
		t.Logf("the watch past its delete: Done closed %v after it was asked for", took.Round(time.Millisecond))
	}
	time.Sleep(300 * time.Millisecond)
	if got := closedDones(dones); len(got) != 1 || got[0] != 0 {
		t.Errorf("Done channels closed: got holds %v, want [0]", got)
	}
	_ = late.UnlockContext(ctx)
	held.unlock(t, 0)
}

// TestLossWatchRevoke: a revoke of a Session's lease closes the Done of
// each of its holds, and of no hold of another Session on the same client.
func TestLossWatchRevoke(t *testing.T) {
	testflags.Parallel(t)
	srv, client := startServer(t)
	other := srv.Client(t)
	ctx := testContext(t)
	name := lockName(t)
	s := newSession(t, client, etcdlock.WithTTL(5*time.Second))
	kept := newSession(t, client, etcdlock.WithTTL(5*time.Second))
	revoked := lockMany(t, s, name+"/revoked", 20)
	lost := watchAll(revoked.ms)
	keptHolds := lockMany(t, kept, name+"/kept", 20)
	keptDones := watchAll(keptHolds.ms)
	if _, err := other.Revoke(ctx, s.Lease()); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for i, d := range lost {
		if _, ok := closedWithin(d, doneBound-time.Since(start)); !ok {
			t.Fatalf("Done of hold %d %v after the revoke: got open, want closed", i, doneBound)
		}
	}
	t.Logf("20 Done channels closed %v after the revoke", time.Since(start).Round(time.Millisecond))
	time.Sleep(300 * time.Millisecond)
	if got := closedDones(keptDones); len(got) != 0 {
		t.Errorf("Done channels of the other Session closed: got holds %v, want none", got)
	}
	keptHolds.unlock(t)
	revoked.unlock(t, seq(20)...)
}

// seq returns 0, 1, ... n-1.
func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// TestLossWatchPermissions: where etcd's authentication grants the lock
// queues alone (README, Permissions), holds of two locks whose shared
// prefix is not granted are still watched: the watch of that prefix, which
// etcd refuses, gives way to one per lock queue, with no read meanwhile,
// and a delete closes the right Done.
func TestLossWatchPermissions(t *testing.T) {
	testflags.Parallel(t)
	base := "perm/" + t.Name()
	a, b := base+"/a", base+"/b"
	env := authServer(t,
		prefixPermission(a+"/", clientv3.PermissionType(clientv3.PermReadWrite)),
		prefixPermission(b+"/", clientv3.PermissionType(clientv3.PermReadWrite)),
		prefixPermission("etcdlock.fence.", clientv3.PermissionType(clientv3.PermReadWrite)))
	var reads atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if c, ok := classify(method, req); ok && c == callLossRead {
			reads.Add(1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	c, err := clientv3.New(clientv3.Config{
		Endpoints: env.user.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		Username: "locker", Password: "lockerpw",
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(count)},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := newSession(t, c, etcdlock.WithTTL(5*time.Second))
	ctx := testContext(t)
	ma, mb := etcdlock.NewMutex(s, a), etcdlock.NewMutex(s, b)
	for _, m := range []*etcdlock.Mutex{ma, mb} {
		if err := m.LockContext(ctx); err != nil {
			t.Fatalf("LockContext: %v", err)
		}
	}
	dones := []<-chan struct{}{ma.Done(), mb.Done()}
	time.Sleep(500 * time.Millisecond) // the shared prefix's watch is refused
	if _, err := env.root.Delete(ctx, mb.Key()); err != nil {
		t.Fatal(err)
	}
	onlyClosed(t, "one of two keys was deleted", dones, 1)
	if _, err := env.root.Delete(ctx, ma.Key()); err != nil {
		t.Fatal(err)
	}
	if _, ok := closedWithin(dones[0], doneBound); !ok {
		t.Errorf("Done %v after the other key was deleted: got open, want closed", doneBound)
	}
	// One read at most: where the loss watch took a's Done before b's, it
	// watched a's key alone, and b's widened the watch, from a full read.
	if n := reads.Load(); n > 1 {
		t.Errorf("the loss watch's reads within a TTL: got %d, want at most one (its watches alone)", n)
	}
	for _, m := range []*etcdlock.Mutex{ma, mb} {
		if err := m.UnlockContext(ctx); !errors.Is(err, etcdlock.ErrLockLost) {
			t.Errorf("UnlockContext of a lost hold: got %v, want ErrLockLost", err)
		}
	}
}

// TestLossWatchMultiOnce: a MultiMutex's hold, whose keys go together with
// its revoked lease (in one watch response), is lost once: one HoldLost.
func TestLossWatchMultiOnce(t *testing.T) {
	testflags.Parallel(t)
	srv, client := startServer(t)
	other := srv.Client(t)
	ctx := testContext(t)
	log := &eventLog{}
	s := newSession(t, client, etcdlock.WithTTL(5*time.Second), etcdlock.WithObserver(log))
	name := lockName(t)
	m := etcdlock.NewMultiMutex(s, name+"/a", name+"/b")
	if err := m.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	h, _ := m.Held()
	done := h.Done()
	time.Sleep(300 * time.Millisecond) // the watch is open
	if _, err := other.Revoke(ctx, s.Lease()); err != nil {
		t.Fatal(err)
	}
	if _, ok := closedWithin(done, doneBound); !ok {
		t.Fatalf("Done still open %v after the revoke", doneBound)
	}
	time.Sleep(time.Second) // any second report would come by now
	if lost := log.find(func(e etcdlock.Event) bool { return e.Kind == etcdlock.HoldLost }); len(lost) != 1 {
		t.Errorf("HoldLost events: got %d, want 1: %+v", len(lost), lost)
	}
}

// TestLossWatchWidenNoReplay: a hold whose key lies outside the watched
// prefix restarts the watch from a read, not from where the old watch was:
// the deletes under the new prefix since then (1,000 of another lock's)
// are not sent to the client again.
func TestLossWatchWidenNoReplay(t *testing.T) {
	testflags.Parallel(t)
	srv, _ := startServer(t)
	var events atomic.Int64
	stream := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		return countedStream{cs, &events}, nil
	}
	client := serverClient(t, srv, nil, stream)
	other := srv.Client(t)
	ctx := testContext(t)
	s := newSession(t, client, etcdlock.WithTTL(10*time.Second))
	name := lockName(t)
	a := etcdlock.NewMutex(s, name+"/a")
	if err := a.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	_ = a.Done()
	time.Sleep(300 * time.Millisecond) // the watch is open, on a's key
	const churn = 1000
	for i := range churn {
		k := fmt.Sprintf("%s/zzz/%d", name, i)
		if _, err := other.Put(ctx, k, "v"); err != nil {
			t.Fatal(err)
		}
		if _, err := other.Delete(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	before := events.Load()
	b := etcdlock.NewMutex(s, name+"/b")
	if err := b.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	bDone := b.Done()
	time.Sleep(time.Second)
	got := events.Load() - before
	t.Logf("watch events received after the prefix widened: %d", got)
	if got >= churn/2 {
		t.Errorf("the widened watch replayed %d deletes from before it", got)
	}
	if isClosed(a.Done()) || isClosed(bDone) {
		t.Fatal("a Done closed with both keys there")
	}
	if _, err := other.Delete(ctx, b.Key()); err != nil {
		t.Fatal(err)
	}
	if _, ok := closedWithin(bDone, doneBound); !ok {
		t.Errorf("b's Done still open %v after its key's delete, on the widened watch", doneBound)
	}
	_ = a.UnlockContext(ctx)
	_ = b.UnlockContext(ctx)
}

// TestLossWatchUnrelatedNames: a Session whose holds are in unrelated
// lock queues (alpha/, beta/, gamma/: the prefix their keys share is "")
// watches each queue, not every key in etcd: 200 deletes elsewhere bring
// its client no event, and each new queue costs no read of every key
// held. Before, the one watch of the shared prefix received every delete
// in etcd (200 events), and each widening read every key again (a read of
// the loss watch per queue added).
func TestLossWatchUnrelatedNames(t *testing.T) {
	testflags.Parallel(t)
	srv, _ := startServer(t)
	var events, reads atomic.Int64
	stream := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		return countedStream{cs, &events}, nil
	}
	unary := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if c, ok := classify(method, req); ok && c == callLossRead {
			reads.Add(1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	client := serverClient(t, srv, unary, stream)
	other := srv.Client(t)
	ctx := testContext(t)
	s := newSession(t, client, etcdlock.WithTTL(10*time.Second))
	var ms []*etcdlock.Mutex
	var dones []<-chan struct{}
	for _, name := range []string{"alpha/job", "beta/job", "gamma/job"} {
		m := etcdlock.NewMutex(s, name)
		if err := m.LockContext(ctx); err != nil {
			t.Fatal(err)
		}
		ms, dones = append(ms, m), append(dones, m.Done())
		time.Sleep(100 * time.Millisecond) // the watches open, queue by queue
	}
	gotReads := reads.Load()
	before := events.Load()
	const churn = 200
	for i := range churn {
		k := fmt.Sprintf("noise/%d", i)
		if _, err := other.Put(ctx, k, "v"); err != nil {
			t.Fatal(err)
		}
		if _, err := other.Delete(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	// A delete the watches do see, after the noise: once it closed Done,
	// every event before it has come.
	if _, err := other.Delete(ctx, ms[1].Key()); err != nil {
		t.Fatal(err)
	}
	if _, ok := closedWithin(dones[1], doneBound); !ok {
		t.Fatalf("beta's Done still open %v after its key's delete", doneBound)
	}
	got := events.Load() - before
	t.Logf("holds in 3 queues: %d watch events received for %d deletes elsewhere and 1 of a held key; %d reads of the loss watch while the holds came", got, churn, gotReads)
	if got >= churn/2 {
		t.Errorf("watch events received: got %d, want fewer than %d: the watches cover the keys held, not every key in etcd", got, churn/2)
	}
	if gotReads > 0 {
		t.Errorf("reads of every key held while 3 queues' holds came: got %d, want none", gotReads)
	}
	if got := closedDones(dones); !slices.Equal(got, []int{1}) {
		t.Errorf("Done channels closed: got holds %v, want [1]", got)
	}
	for i, m := range ms {
		err := m.UnlockContext(ctx)
		if lost := i == 1; lost != (err != nil) {
			t.Errorf("unlock of hold %d: got %v", i, err)
		}
	}
}

// countedStream counts the events of the watch responses it receives.
type countedStream struct {
	grpc.ClientStream
	n *atomic.Int64
}

func (c countedStream) RecvMsg(m any) error {
	err := c.ClientStream.RecvMsg(m)
	if wr, ok := m.(*pb.WatchResponse); ok && err == nil {
		c.n.Add(int64(len(wr.Events)))
	}
	return err
}

// TestLossWatchQueuesStop: under authentication that grants each lock's
// queue alone (one watch per queue), a queue's watch stops when its last
// watched hold ends, though another hold keeps the loss watch running.
// Alone, not in parallel: it counts the process's goroutines.
func TestLossWatchQueuesStop(t *testing.T) {
	base := "perm/" + t.Name()
	a, b := base+"/a", base+"/b"
	rw := clientv3.PermissionType(clientv3.PermReadWrite)
	env := authServer(t, prefixPermission(a, rw), prefixPermission(b+"/", rw), prefixPermission("etcdlock.fence.", rw))
	c, err := clientv3.New(clientv3.Config{Endpoints: env.user.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(), Username: "locker", Password: "lockerpw"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := newSession(t, c, etcdlock.WithTTL(5*time.Second))
	ctx := testContext(t)
	long := etcdlock.NewMutex(s, b)
	if err := long.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	_ = long.Done()
	first := etcdlock.NewMutex(s, a+"x")
	if err := first.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	_ = first.Done()
	time.Sleep(500 * time.Millisecond) // the shared prefix refused: one watch a queue
	if err := first.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	g0 := runtime.NumGoroutine()
	const n = 40
	for i := range n {
		m := etcdlock.NewMutex(s, fmt.Sprintf("%s%d", a, i))
		if err := m.LockContext(ctx); err != nil {
			t.Fatal(err)
		}
		_ = m.Done()
		time.Sleep(20 * time.Millisecond)
		if err := m.UnlockContext(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var g1 int
	if err := waitUntil(ctx, func() bool { g1 = runtime.NumGoroutine(); return g1 <= g0+n/4 }); err != nil {
		t.Errorf("goroutines: %d before %d short holds with Done, %d after all were released: their queues' watches stay", g0, n, g1)
	}
	t.Logf("goroutines: %d before %d short holds with Done, %d after", g0, n, g1)
	if err := long.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
}
