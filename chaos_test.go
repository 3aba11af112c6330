package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
)

// The chaos test is shaped like Jepsen's lock tests: workers on separate
// clients lock, read a counter, wait a little, write the counter plus one,
// and unlock, while faults are injected. Two counters are guarded: one in
// etcd, written with Txn(If(m.IsOwner())), and one in memory that rejects
// any token lower than the highest it has seen, reads included. With
// fencing off, both take every read and write, which shows that the test
// detects what fencing prevents.
//
// A warm-up without faults first measures the acquisition rate: the run
// counts only if it is at least 20/s.
//
// Faults: the leader is stopped (or killed) and restarted every few
// seconds; a holder is cut off from etcd for longer than the TTL while it
// sleeps inside its critical section, after checking Done, and then writes
// (a process paused at the worst moment); and lock calls are cancelled at
// random.
//
// ETCDLOCK_CHAOS_LONG=1 runs the faults for 10 minutes instead of 20 s.

// chaosConfig sizes one run.
type chaosConfig struct {
	workers        int
	ttl            time.Duration
	warmup         time.Duration // no faults; sets the acquisition rate that makes the run count
	faults         time.Duration
	leaderEvery    time.Duration // 0: no leader faults
	leaderDown     time.Duration
	partitionEvery time.Duration
	fencing        bool
}

func TestChaos(t *testing.T) {
	cfg := chaosConfig{
		workers:        4,
		ttl:            2 * time.Second,
		warmup:         3 * time.Second,
		faults:         20 * time.Second,
		leaderEvery:    3 * time.Second,
		leaderDown:     time.Second,
		partitionEvery: 6 * time.Second,
		fencing:        true,
	}
	if os.Getenv("ETCDLOCK_CHAOS_LONG") == "1" {
		cfg.faults = 10 * time.Minute
	}
	r := runChaos(t, cfg)
	r.log(t)
	r.checkCounts(t, cfg)
	if r.notOldest != 0 {
		t.Errorf("holds whose key was not the oldest of the lock in etcd: got %d, want 0", r.notOldest)
	}
	if r.overlapsClean != 0 {
		t.Errorf("overlapping holds that both ended with a clean unlock: got %d, want 0", r.overlapsClean)
	}
	if r.lostEtcd != 0 || r.lostStore != 0 {
		t.Errorf("acknowledged updates lost with fencing: got %d in etcd, %d in the store, want 0", r.lostEtcd, r.lostStore)
	}
	if r.partitionsFenced == 0 {
		t.Errorf("partitions whose cut-off holder was fenced off in etcd and in the store: got 0 of %d, want ≥ 1", r.partitions)
	}
}

// TestChaosUnfenced runs the partition fault with fencing off: the stale
// holder's write must show up as lost updates and an overlap.
func TestChaosUnfenced(t *testing.T) {
	cfg := chaosConfig{
		workers:        4,
		ttl:            2 * time.Second,
		warmup:         time.Second,
		faults:         5 * time.Second,
		partitionEvery: 5 * time.Second,
		fencing:        false,
	}
	r := runChaos(t, cfg)
	r.log(t)
	r.checkCounts(t, cfg)
	if r.lostEtcd == 0 || r.lostStore == 0 || r.overlaps == 0 {
		t.Errorf("with fencing off: got %d lost updates in etcd, %d in the store, %d overlaps; want each > 0",
			r.lostEtcd, r.lostStore, r.overlaps)
	}
}

// chaosResult holds the figures of a run.
type chaosResult struct {
	fencing        bool
	warmupRate     float64 // acquisitions per second before the faults
	duration       time.Duration
	acquisitions   int64
	cancels        int64 // lock calls that returned the context's error
	tryFalse       int64 // TryLockFor whose wait ran out
	lockErrors     int64 // other lock errors (etcd unavailable, session expired)
	sessions       int64 // Sessions made, the first ones included
	ackedEtcd      int64
	ackedStore     int64
	unknownEtcd    int64 // attempts whose outcome etcd did not confirm (retried)
	unlockUnknown  int64 // unlocks that failed without saying whether the hold was lost
	lostEtcd       int
	lostStore      int
	fencedEtcd     int64 // reads and writes refused by IsOwner
	fencedStore    int64 // reads and writes refused by the store
	doneSkips      int64 // writes skipped because Mutex.Done had closed
	doneSpurious   int64 // of those, where IsOwner still held
	frozenDone     int64 // frozen holders whose Done had closed by the time they woke
	overlaps       int64 // pairs of holds inside the critical section at once
	overlapsFrozen int64 // of those, with a cut-off holder in the pair
	overlapsLost   int64 // of those, where a hold of the pair was lost (its unlock said so)
	overlapsClean  int64 // of those, where both holds ended with a clean unlock: a real violation
	overlapsUnsure int64 // of those, with no lost hold and an unlock of unknown outcome
	notOldest      int64 // holds whose key, read in etcd inside the hold, was not the oldest of the lock
	// Partitions: what the cut-off holder's writes met when it woke.
	partitionsFenced   int // refused in etcd and in the store
	partitionsSurvived int // accepted by etcd: the lease outlived the cut (an election renews leases)
	leaderFaults       int
	partitions         int
	recovery           map[string][]time.Duration // fault kind → time to the next acquisition
	keysLeft           int
	leasesLeft         int
}

// chaosStore is the resource outside etcd: a counter that, with fencing,
// rejects any token lower than the highest it has seen, reads included. It
// records every write it applies, in order.
type chaosStore struct {
	fencing bool

	mu      sync.Mutex
	highest int64
	value   int64
	history []int64 // values written, in order
}

func (s *chaosStore) admit(token int64) bool {
	if !s.fencing {
		return true
	}
	if token < s.highest {
		return false
	}
	s.highest = token
	return true
}

func (s *chaosStore) read(token int64) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.admit(token) {
		return 0, false
	}
	return s.value, true
}

// write stores v and returns its index in the history, or -1 if rejected.
func (s *chaosStore) write(token, v int64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.admit(token) {
		return -1
	}
	s.value = v
	s.history = append(s.history, v)
	return len(s.history) - 1
}

// lostUpdates counts the acknowledged writes (indices into history, the
// values applied in order) that a later write undid: with every increment
// made under the lock, each value is one more than the last, and a value
// at or below an earlier one means the increments in between were lost.
func lostUpdates(history []int64, acked []int) int {
	sufMin := make([]int64, len(history)+1)
	sufMin[len(history)] = 1<<63 - 1
	for i := len(history) - 1; i >= 0; i-- {
		sufMin[i] = min(sufMin[i+1], history[i])
	}
	lost := 0
	for _, i := range acked {
		if sufMin[i+1] <= history[i] {
			lost++
		}
	}
	return lost
}

// chaosRun is the shared state of one run.
type chaosRun struct {
	t       *testing.T
	cfg     chaosConfig
	name    string // the lock
	counter string // the etcd counter's key
	store   *chaosStore
	seed    uint64

	faulty    atomic.Bool // random cancels and TryLockFor on: the warm-up is over
	freezeReq atomic.Bool // the next holder to see it freezes
	freezing  atomic.Bool // a freeze is under way

	mu          sync.Mutex
	acqTimes    []time.Time
	faults      []chaosFault
	ackedRevs   []int64 // revisions of acknowledged etcd writes
	ackedStore  []int   // indices of acknowledged store writes
	counts      chaosResult
	countsMu    sync.Mutex
	workerError error

	holdsMu sync.Mutex
	inside  map[*chaosHold]bool // holds inside the critical section
	pairs   [][2]*chaosHold     // holds that were inside at once
}

// A chaosHold is one acquisition, from the critical section's entry to the
// unlock's result.
type chaosHold struct {
	frozen  bool // cut off from etcd, as a paused process, while inside
	lost    bool // UnlockContext reported the hold lost (ErrLockLost, ErrSessionExpired)
	unknown bool // UnlockContext failed otherwise
}

// enter records h inside the critical section, paired with every hold
// already there.
func (r *chaosRun) enter(h *chaosHold) {
	r.holdsMu.Lock()
	defer r.holdsMu.Unlock()
	for other := range r.inside {
		r.pairs = append(r.pairs, [2]*chaosHold{other, h})
	}
	r.inside[h] = true
}

func (r *chaosRun) leave(h *chaosHold) {
	r.holdsMu.Lock()
	defer r.holdsMu.Unlock()
	delete(r.inside, h)
}

// countOverlaps sorts the pairs of holds that were inside at once, once
// every hold has ended. Two holds that both ended with a clean, fenced
// unlock each kept their key from lock to unlock, so etcd had two owners at
// once: that is the violation. A pair with a lost hold is what a
// lease-based lock cannot prevent, and what fencing is for.
func (r *chaosRun) countOverlaps() {
	res := &r.counts
	for _, p := range r.pairs {
		a, b := p[0], p[1]
		res.overlaps++
		if a.frozen || b.frozen {
			res.overlapsFrozen++
		}
		switch {
		case a.lost || b.lost:
			res.overlapsLost++
		case !a.unknown && !b.unknown:
			res.overlapsClean++
		default:
			res.overlapsUnsure++
		}
	}
}

type chaosFault struct {
	kind string
	at   time.Time
}

func (r *chaosRun) add(field *int64, n int64) {
	r.countsMu.Lock()
	*field += n
	r.countsMu.Unlock()
}

func (r *chaosRun) add64(field *int) {
	r.countsMu.Lock()
	*field++
	r.countsMu.Unlock()
}

func (r *chaosRun) fault(kind string) {
	r.mu.Lock()
	r.faults = append(r.faults, chaosFault{kind: kind, at: time.Now()})
	r.mu.Unlock()
}

func runChaos(t *testing.T, cfg chaosConfig) *chaosResult {
	c := etcdtest.StartCluster(t, 3)
	observer := c.Client(t)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := &chaosRun{
		t:       t,
		cfg:     cfg,
		name:    lockName(t),
		counter: lockName(t) + "-counter",
		store:   &chaosStore{fencing: cfg.fencing},
		seed:    seed,
		inside:  make(map[*chaosHold]bool),
	}
	r.counts.fencing = cfg.fencing
	ctx := context.Background()
	put := func() int64 {
		for {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			resp, err := observer.Put(pctx, r.counter, "0")
			cancel()
			if err == nil {
				return resp.Header.Revision
			}
		}
	}
	startRev := put()

	workers := make([]*chaosWorker, cfg.workers)
	for i := range workers {
		client, proxy := c.ProxiedClient(t)
		workers[i] = &chaosWorker{run: r, id: i, client: client, proxy: proxy,
			rng: rand.New(rand.NewPCG(seed, uint64(i)))}
	}
	wctx, stopWorkers := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() { w.loop(wctx) })
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			stopWorkers()
			wg.Wait()
		}
	}
	defer stop()

	// The rate counts from the first acquisition, after the Sessions are made.
	time.Sleep(cfg.warmup)
	r.mu.Lock()
	warm := len(r.acqTimes)
	if warm > 0 {
		r.counts.warmupRate = float64(warm) / time.Since(r.acqTimes[0]).Seconds()
	}
	r.mu.Unlock()
	if r.counts.warmupRate < 20 {
		stop()
		t.Fatalf("acquisitions before the faults: got %.1f/s, want ≥ 20/s for the run to count", r.counts.warmupRate)
	}

	r.faulty.Store(true)

	// Faults, from the test's goroutine since Cluster reports through t.
	// A leader fault never overlaps a partition: a new leader renews every
	// lease for a full TTL (etcd keeps no remaining TTL across elections
	// without lease checkpoints), so the cut-off holder's lease would
	// outlive its freeze and the fault would test nothing.
	frng := rand.New(rand.NewPCG(seed, 1<<32))
	began := time.Now()
	nextLeader, nextPartition := began.Add(cfg.leaderEvery/2), began.Add(cfg.partitionEvery/3)
	for time.Since(began) < cfg.faults {
		now := time.Now()
		partitioned := r.freezing.Load() || r.freezeReq.Load()
		switch {
		case cfg.partitionEvery > 0 && now.After(nextPartition) && !partitioned:
			r.freezeReq.Store(true)
			nextPartition = now.Add(cfg.partitionEvery)
		case cfg.leaderEvery > 0 && now.After(nextLeader) && !partitioned:
			if lead := c.Leader(); lead >= 0 {
				kind := "leader stop"
				if r.counts.leaderFaults%2 == 1 {
					kind = "leader kill"
					c.Kill(lead)
				} else {
					c.Stop(lead)
				}
				r.fault(kind)
				r.counts.leaderFaults++
				time.Sleep(cfg.leaderDown/2 + time.Duration(frng.Int64N(int64(cfg.leaderDown))))
				c.Restart(lead)
				if c.Leader() < 0 {
					t.Fatal("no leader after a restart")
				}
			}
			nextLeader = time.Now().Add(cfg.leaderEvery)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for r.freezing.Load() || r.freezeReq.Load() {
		time.Sleep(50 * time.Millisecond)
	}
	r.counts.duration = time.Since(began)
	stop()
	if r.workerError != nil {
		t.Fatal(r.workerError)
	}

	res := &r.counts
	r.countOverlaps()
	res.recovery = r.recovery()
	for _, f := range r.faults {
		if f.kind == "partition" {
			res.partitions++
		}
	}
	res.keysLeft = len(lockKeys(t, observer, r.name))
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	leases, err := observer.Leases(lctx)
	if err != nil {
		t.Fatalf("list leases: got %v, want nil", err)
	}
	res.leasesLeft = len(leases.Leases)

	history, revs := counterHistory(t, observer, r.counter, startRev)
	var acked []int
	for _, rev := range r.ackedRevs {
		i, ok := slices.BinarySearch(revs, rev)
		if !ok {
			t.Fatalf("acknowledged write at revision %d not in the counter's history", rev)
		}
		acked = append(acked, i)
	}
	res.lostEtcd = lostUpdates(history, acked)
	res.lostStore = lostUpdates(r.store.history, r.ackedStore)
	return res
}

// counterHistory returns the values written to key after revision from, in
// order, with their revisions.
func counterHistory(t *testing.T, client *clientv3.Client, key string, from int64) ([]int64, []int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	resp, err := client.Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("get %q: got %v, want the counter", key, err)
	}
	last := resp.Kvs[0].ModRevision
	var values, revs []int64
	if last <= from {
		return values, revs
	}
	for wr := range client.Watch(ctx, key, clientv3.WithRev(from+1), clientv3.WithFilterDelete()) {
		if err := wr.Err(); err != nil {
			t.Fatalf("watch %q: got %v, want nil", key, err)
		}
		for _, ev := range wr.Events {
			v, err := strconv.ParseInt(string(ev.Kv.Value), 10, 64)
			if err != nil {
				t.Fatalf("counter value %q: %v", ev.Kv.Value, err)
			}
			values = append(values, v)
			revs = append(revs, ev.Kv.ModRevision)
			if ev.Kv.ModRevision >= last {
				return values, revs
			}
		}
	}
	t.Fatalf("watch %q ended before revision %d", key, last)
	return nil, nil
}

// recovery returns, for each kind of fault, the time from each fault to the
// next acquisition.
func (r *chaosRun) recovery() map[string][]time.Duration {
	out := make(map[string][]time.Duration)
	for _, f := range r.faults {
		i, _ := slices.BinarySearchFunc(r.acqTimes, f.at, time.Time.Compare)
		if i < len(r.acqTimes) {
			out[f.kind] = append(out[f.kind], r.acqTimes[i].Sub(f.at))
		}
	}
	return out
}

// chaosWorker is one process: its own client, through its own proxy, and a
// Session it replaces when it ends.
type chaosWorker struct {
	run    *chaosRun
	id     int
	client *clientv3.Client
	proxy  *etcdtest.Proxy
	rng    *rand.Rand
	s      *etcdlock.Session
}

func (w *chaosWorker) loop(ctx context.Context) {
	r := w.run
	defer func() {
		if w.s != nil {
			_ = w.s.Close()
		}
	}()
	for ctx.Err() == nil {
		if w.s == nil || isClosed(w.s.Done()) {
			if w.s != nil {
				_ = w.s.Close()
			}
			s, err := etcdlock.NewSession(w.client, etcdlock.WithTTL(r.cfg.ttl))
			if err != nil {
				w.s = nil
				r.add(&r.counts.lockErrors, 1)
				time.Sleep(50 * time.Millisecond)
				continue
			}
			w.s = s
			r.add(&r.counts.sessions, 1)
		}
		m := etcdlock.NewMutex(w.s, r.name)
		held, err := w.lock(ctx, m)
		switch {
		case held:
			w.critical(ctx, m)
		case err == nil:
			r.add(&r.counts.tryFalse, 1)
		case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
			r.add(&r.counts.cancels, 1)
		default:
			r.add(&r.counts.lockErrors, 1)
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// lock takes the lock in one of several ways, some with a random deadline
// once the warm-up is over.
func (w *chaosWorker) lock(ctx context.Context, m *etcdlock.Mutex) (bool, error) {
	n := w.rng.IntN(10)
	if !w.run.faulty.Load() {
		n = 9
	}
	switch {
	case n < 2:
		cctx, cancel := context.WithTimeout(ctx, time.Duration(w.rng.IntN(20000))*time.Microsecond)
		defer cancel()
		err := m.LockContext(cctx)
		return err == nil, err
	case n < 4:
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return m.TryLockFor(cctx, time.Duration(w.rng.IntN(50))*time.Millisecond)
	default:
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		err := m.LockContext(cctx)
		return err == nil, err
	}
}

// critical reads both counters, waits a little, writes them plus one and
// unlocks. It may be the one that freezes, cut off from etcd.
func (w *chaosWorker) critical(ctx context.Context, m *etcdlock.Mutex) {
	r := w.run
	r.mu.Lock()
	r.acqTimes = append(r.acqTimes, time.Now()) // in order: taken under mu
	r.mu.Unlock()
	r.add(&r.counts.acquisitions, 1)
	token, done := m.Token(), m.Done()

	h := &chaosHold{}
	r.enter(h)
	defer func() {
		r.leave(h)
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		err := m.UnlockContext(uctx)
		r.holdsMu.Lock()
		h.lost = errors.Is(err, etcdlock.ErrLockLost) || errors.Is(err, etcdlock.ErrSessionExpired)
		h.unknown = err != nil && !h.lost
		r.holdsMu.Unlock()
		if h.unknown {
			r.add(&r.counts.unlockUnknown, 1)
		}
	}()

	ev, ok := w.readEtcd(ctx, m)
	if !ok {
		return
	}
	sv, ok := r.store.read(token)
	if !ok {
		r.add(&r.counts.fencedStore, 1)
		return
	}
	time.Sleep(time.Duration(w.rng.IntN(2000)) * time.Microsecond)

	if isClosed(done) {
		// Done closed: stop touching the resources. Was the hold lost?
		r.add(&r.counts.doneSkips, 1)
		if w.stillOwner(ctx, m) {
			r.add(&r.counts.doneSpurious, 1)
		}
		return
	}
	frozen := r.freezeReq.CompareAndSwap(true, false)
	if frozen {
		// The worst moment to pause: Done was checked, the write is next.
		r.freezing.Store(true)
		r.holdsMu.Lock()
		h.frozen = true
		r.holdsMu.Unlock()
		w.proxy.Blackhole()
		r.fault("partition")
		time.Sleep(r.cfg.ttl + 1500*time.Millisecond)
		w.proxy.Unblackhole()
		if isClosed(done) {
			r.add(&r.counts.frozenDone, 1)
		}
		defer r.freezing.Store(false)
	}
	etcdOK := w.writeEtcd(ctx, m, ev+1)
	i := r.store.write(token, sv+1)
	if i >= 0 {
		r.mu.Lock()
		r.ackedStore = append(r.ackedStore, i)
		r.mu.Unlock()
		r.add(&r.counts.ackedStore, 1)
	} else {
		r.add(&r.counts.fencedStore, 1)
	}
	if frozen && r.cfg.fencing {
		switch {
		case etcdOK == chaosAcked:
			r.add64(&r.counts.partitionsSurvived)
		case etcdOK == chaosFenced && i < 0:
			r.add64(&r.counts.partitionsFenced)
		}
	}
}

// readEtcd reads the etcd counter, guarded by IsOwner with fencing.
func (w *chaosWorker) readEtcd(ctx context.Context, m *etcdlock.Mutex) (int64, bool) {
	r := w.run
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var got *clientv3.GetResponse
	if r.cfg.fencing {
		// With the counter, the oldest key of the lock: while our key is
		// there, it must be the oldest, whatever the unlocks say later.
		resp, err := w.client.Txn(cctx).If(m.IsOwner()).
			Then(clientv3.OpGet(r.counter), clientv3.OpGet(r.name+"/", clientv3.WithFirstCreate()...)).
			Commit()
		if err != nil {
			return 0, false
		}
		if !resp.Succeeded {
			r.add(&r.counts.fencedEtcd, 1)
			return 0, false
		}
		if len(resp.Responses) == 2 {
			got = (*clientv3.GetResponse)(resp.Responses[0].GetResponseRange())
			first := resp.Responses[1].GetResponseRange()
			if first == nil || len(first.Kvs) != 1 || string(first.Kvs[0].Key) != m.Key() {
				r.add(&r.counts.notOldest, 1)
			}
		}
	} else {
		resp, err := w.client.Get(cctx, r.counter)
		if err != nil {
			return 0, false
		}
		got = resp
	}
	if got == nil || len(got.Kvs) != 1 {
		r.fail(fmt.Errorf("worker %d: counter read: got %v, want one key", w.id, got))
		return 0, false
	}
	v, err := strconv.ParseInt(string(got.Kvs[0].Value), 10, 64)
	if err != nil {
		r.fail(fmt.Errorf("worker %d: counter value %q: %w", w.id, got.Kvs[0].Value, err))
		return 0, false
	}
	return v, true
}

// The outcomes of writeEtcd.
const (
	chaosUnknown = iota // etcd never answered
	chaosAcked
	chaosFenced
)

// writeEtcd writes v to the etcd counter, guarded by IsOwner with fencing,
// retrying for up to 20 s while etcd's answer is unknown (a cut-off holder
// reconnects, a leader is elected), and returns the outcome.
func (w *chaosWorker) writeEtcd(ctx context.Context, m *etcdlock.Mutex, v int64) int {
	r := w.run
	val := strconv.FormatInt(v, 10)
	deadline := time.Now().Add(20 * time.Second)
	for attempt := 0; time.Now().Before(deadline); attempt++ {
		if attempt > 0 {
			time.Sleep(100 * time.Millisecond)
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		var rev int64
		var ok bool
		var err error
		if r.cfg.fencing {
			var resp *clientv3.TxnResponse
			resp, err = w.client.Txn(cctx).If(m.IsOwner()).Then(clientv3.OpPut(r.counter, val)).Commit()
			if err == nil {
				rev, ok = resp.Header.Revision, resp.Succeeded
			}
		} else {
			var resp *clientv3.PutResponse
			resp, err = w.client.Put(cctx, r.counter, val)
			if err == nil {
				rev, ok = resp.Header.Revision, true
			}
		}
		cancel()
		switch {
		case err != nil:
			r.add(&r.counts.unknownEtcd, 1)
			continue
		case ok:
			r.mu.Lock()
			r.ackedRevs = append(r.ackedRevs, rev)
			r.mu.Unlock()
			r.add(&r.counts.ackedEtcd, 1)
			return chaosAcked
		default:
			r.add(&r.counts.fencedEtcd, 1)
			return chaosFenced
		}
	}
	return chaosUnknown
}

// stillOwner reports whether IsOwner still holds in etcd.
func (w *chaosWorker) stillOwner(ctx context.Context, m *etcdlock.Mutex) bool {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := w.client.Txn(cctx).If(m.IsOwner()).Commit()
	return err == nil && resp.Succeeded
}

func (r *chaosRun) fail(err error) {
	r.mu.Lock()
	if r.workerError == nil {
		r.workerError = err
	}
	r.mu.Unlock()
}

// checkCounts checks what every run must show: faults were injected, the
// lock kept being taken after each, and nothing was left behind.
func (res *chaosResult) checkCounts(t *testing.T, cfg chaosConfig) {
	t.Helper()
	if cfg.partitionEvery > 0 && res.partitions == 0 {
		t.Error("partitions: got 0, want ≥ 1")
	}
	if cfg.leaderEvery > 0 && res.leaderFaults == 0 {
		t.Error("leader faults: got 0, want ≥ 1")
	}
	for kind, ds := range res.recovery {
		if m := slices.Max(ds); m > 15*time.Second {
			t.Errorf("%s: next acquisition after %v, want ≤ 15s", kind, m)
		}
	}
	if res.keysLeft != 0 || res.leasesLeft != 0 {
		t.Errorf("after every client exited: got %d keys and %d leases, want 0 and 0", res.keysLeft, res.leasesLeft)
	}
}

func (res *chaosResult) log(t *testing.T) {
	t.Helper()
	fencing := "off"
	if res.fencing {
		fencing = "on"
	}
	row := func(what string, v any) { t.Logf("  %-58s %v", what, v) }
	t.Logf("chaos, fencing %s: %v of faults", fencing, res.duration.Round(time.Second))
	row("acquisitions/s before the faults (must be ≥ 20)", fmt.Sprintf("%.1f", res.warmupRate))
	row("acquisitions", res.acquisitions)
	row("acknowledged updates: etcd / store", fmt.Sprintf("%d / %d", res.ackedEtcd, res.ackedStore))
	row("acknowledged updates lost: etcd / store", fmt.Sprintf("%d / %d", res.lostEtcd, res.lostStore))
	row("fence rejections: etcd (IsOwner) / store (token)", fmt.Sprintf("%d / %d", res.fencedEtcd, res.fencedStore))
	row("overlaps (pairs of holds): all / cut-off holder / lost hold", fmt.Sprintf("%d / %d / %d", res.overlaps, res.overlapsFrozen, res.overlapsLost))
	row("overlaps of two holds that both unlocked cleanly", res.overlapsClean)
	row("overlaps with no lost hold and an unlock of unknown outcome", res.overlapsUnsure)
	row("holds not the oldest key in etcd, read inside the hold", res.notOldest)
	row("writes skipped on Mutex.Done / of which still owner", fmt.Sprintf("%d / %d", res.doneSkips, res.doneSpurious))
	row("cut-off holders whose Done had closed when they woke", res.frozenDone)
	row("etcd write attempts with unknown outcome (retried)", res.unknownEtcd)
	row("unlock errors that do not say whether the hold was lost", res.unlockUnknown)
	row("lock calls cancelled / TryLockFor ran out / errors", fmt.Sprintf("%d / %d / %d", res.cancels, res.tryFalse, res.lockErrors))
	row("sessions made", res.sessions)
	row("leader faults / partitions", fmt.Sprintf("%d / %d", res.leaderFaults, res.partitions))
	row("partitions: holder fenced off / its lease survived the cut", fmt.Sprintf("%d / %d", res.partitionsFenced, res.partitionsSurvived))
	kinds := make([]string, 0, len(res.recovery))
	for k := range res.recovery {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	for _, k := range kinds {
		ds := slices.Clone(res.recovery[k])
		slices.Sort(ds)
		row(fmt.Sprintf("%s → next acquisition: min / median / max", k), fmt.Sprintf("%v / %v / %v (n=%d)",
			ds[0].Round(time.Millisecond), ds[len(ds)/2].Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond), len(ds)))
	}
	row("keys / leases left after every client exited", fmt.Sprintf("%d / %d", res.keysLeft, res.leasesLeft))
}
