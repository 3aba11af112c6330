package etcdlock_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	clientv3 "go.etcd.io/etcd/client/v3"

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
// counts only if it is at least 20/s, and is skipped otherwise.
//
// Faults: the leader is stopped (or killed) and restarted every few
// seconds; a follower lags (its peers' messages to it are held) for
// 0.5–2 s and then catches up, while it keeps serving the clients that use
// it from its old state; a holder is cut off from etcd while it sleeps
// inside its critical section, after checking Done, and then writes (a
// process paused at the worst moment); and lock calls are cancelled at
// random. The cut lasts at least TTL + 1.5 s, and then until the holder's
// key is gone and a newer holder has read the store: a new leader renews
// every lease for a full TTL, so an election during the cut can keep the
// hold alive longer. A lag keeps the leader, and may come during a cut.
//
// Mutual exclusion is checked in etcd, not taken from the library's own
// reports: inside each hold, while its key is there, the key must be the
// oldest of the lock; and two holders inside at once is allowed only where
// the older hold (lower token) had lost its key and its lease by the time
// it left, that is, to the lease's expiry.
//
// Every operation on the lock and on the etcd counter is recorded and the
// history is checked with porcupine against the model of a fenced register
// (history_test.go): with fencing it must be linearizable, without it must
// not be. The workers take holds through a primitive (kinds_test.go), so
// the test runs any kind of lock of the family.
//
// The early warning is measured: for each cut-off, the margin from the
// cut-off holder's Mutex.Done closing to the next holder's acquisition, with
// what explains it: the holder's last keep-alive acknowledgement before the
// cut (seen on a keep-alive channel of the test's own on the same lease) and
// when etcd deleted the holder's key (seen by a watch). A negative margin,
// Done closing after the next holder acquired, fails the test.
//
// ETCDLOCK_CHAOS_LONG=1 runs the faults for 10 minutes instead of 8 s per
// kind of lock; ETCDLOCK_CHAOS_LONG=3m, for 3 minutes.

// chaosConfig sizes one run.
type chaosConfig struct {
	kind           string // of kinds
	workers        int
	ttl            time.Duration
	warmup         time.Duration // no faults; sets the acquisition rate that makes the run count
	faults         time.Duration
	leaderEvery    time.Duration // 0: no leader faults
	leaderDown     time.Duration
	lagEvery       time.Duration // 0: no member lags
	partitionEvery time.Duration
	fencing        bool
}

// minChaosRate is the acquisition rate without faults below which a run
// does not count.
const minChaosRate = 20

func TestChaos(t *testing.T) { long(t); forEachKind(t, testChaos) }

func testChaos(t *testing.T, kind string) {
	cfg := chaosConfig{
		kind:           kind,
		workers:        4,
		ttl:            2 * time.Second,
		warmup:         3 * time.Second,
		faults:         faultsFor(t, "ETCDLOCK_CHAOS_LONG", 8*time.Second),
		leaderEvery:    3 * time.Second,
		leaderDown:     time.Second,
		lagEvery:       3 * time.Second,
		partitionEvery: 6 * time.Second,
		fencing:        true,
	}
	r := runChaos(t, cfg)
	r.log(t)
	r.check(t, cfg)
	if r.history != porcupine.Ok {
		t.Errorf("history, fenced register model: got %s, want %s", r.history, porcupine.Ok)
	}
	if r.lostEtcd != 0 || r.lostStore != 0 {
		t.Errorf("acknowledged updates lost with fencing: got %d in etcd, %d in the store, want 0", r.lostEtcd, r.lostStore)
	}
	for i, p := range r.partitions {
		w := warning{done: p.doneAt, next: p.nextAcq}
		if m, ok := w.margin(); ok && m < 0 {
			t.Errorf("partition %d: the cut-off holder's Done closed %v after the next holder acquired, want before", i+1, (-m).Round(time.Millisecond))
		}
		if p.etcd != writeRejected {
			t.Errorf("partition %d: the cut-off holder's write to etcd: got %v, want rejected by IsOwner", i+1, p.etcd)
		}
		if p.store != writeRejected {
			t.Errorf("partition %d: the cut-off holder's write to the store: got %v, want rejected for its lower token", i+1, p.store)
		}
	}
}

// TestChaosUnfenced runs the partition fault with fencing off: the stale
// holder's write must show up as lost updates, an overlap, and a history
// that porcupine finds illegal for the fenced register model. It shows that
// the checks can fail; one kind of lock is enough for that.
func TestChaosUnfenced(t *testing.T) { long(t); testChaosUnfenced(t, "mutex") }

func testChaosUnfenced(t *testing.T, kind string) {
	cfg := chaosConfig{
		kind:           kind,
		workers:        4,
		ttl:            2 * time.Second,
		warmup:         time.Second,
		faults:         5 * time.Second,
		partitionEvery: 5 * time.Second,
		fencing:        false,
	}
	r := runChaos(t, cfg)
	r.log(t)
	r.check(t, cfg)
	if r.lostEtcd == 0 || r.lostStore == 0 || r.overlaps == 0 {
		t.Errorf("with fencing off: got %d lost updates in etcd, %d in the store, %d overlaps; want each > 0",
			r.lostEtcd, r.lostStore, r.overlaps)
	}
	if r.history != porcupine.Illegal {
		t.Errorf("history with fencing off, fenced register model: got %s, want %s", r.history, porcupine.Illegal)
	}
}

// chaosResult holds the figures of a run.
type chaosResult struct {
	fencing      bool
	warmupRate   float64 // acquisitions per second before the faults
	duration     time.Duration
	acquisitions int64
	cancels      int64 // lock calls that returned the context's error
	tryFalse     int64 // TryLockFor whose wait ran out
	lockErrors   int64 // other lock errors (etcd unavailable, session expired)
	sessions     int64 // Sessions made, the first ones included
	ackedEtcd    int64
	ackedStore   int64
	retriedEtcd  int64 // etcd writes retried because etcd did not answer
	lostEtcd     int
	lostStore    int
	fencedEtcd   int64 // reads and writes refused by IsOwner
	fencedStore  int64 // reads and writes refused by the store
	doneSkips    int64 // writes skipped because Mutex.Done had closed
	doneSpurious int64 // of those, where IsOwner still held

	overlaps        int64 // entries into the critical section while another holder was inside
	overlapPairs    int   // pairs of holds inside at once
	pairsExpired    int   // of those, where the older hold's lease had expired: allowed
	pairsNotCut     int   // of the allowed, where the older holder had not been cut off
	pairsBothHeld   int   // where the older hold's key was still in etcd: a broken lock
	holdsKeyDeleted int   // holds whose key went while their lease lived: a broken lock
	notOldest       int64 // holds whose key, read inside the hold, was not the oldest of the lock

	leaderFaults int
	lagFaults    int
	partitions   []chaosPartition
	recovery     map[string][]time.Duration // fault kind → time to the next acquisition
	keysLeft     int
	leasesLeft   int

	history    porcupine.CheckResult // of the recorded operations, fenced register model
	operations int                   // operations checked
	unanswered [2]int                // writes without an answer: applied, and not (dropped)
}

// chaosPartition is what happened to one cut-off holder.
type chaosPartition struct {
	hold      *chaosHold
	cut, wake time.Time
	lastAck   time.Time // the last keep-alive acknowledgement of its lease before the cut
	ended     time.Time // its Session ended during the cut (zero: not by the wake)
	doneAt    time.Time // when its Done closed (zero: never seen)
	doneSeen  bool      // Done was closed when it woke
	deleted   time.Time // when etcd deleted its key, seen by the observer's watch
	nextAcq   time.Time // the next acquisition in its place: by anyone after the cut; for a shared lock, after its key was deleted
	extended  bool      // the hold outlived TTL + 1.5 s of cut-off
	etcd      writeResult
	store     writeResult
}

// writeResult is the outcome of a guarded write.
type writeResult int

const (
	writeNone writeResult = iota // not attempted
	writeAcked
	writeRejected
	writeUnknown  // etcd never answered
	writeConflict // a shared hold's write refused: another holder wrote since its read
)

func (w writeResult) String() string {
	return [...]string{"not attempted", "acknowledged", "rejected", "unanswered", "conflict"}[w]
}

// holdFate is what etcd says of a hold once its holder has left the
// critical section, before it unlocks.
type holdFate int

const (
	fateUnchecked  holdFate = iota
	fateHeld                // our key is still there: the hold was never lost
	fateExpired             // the key and the lease are gone: lost to the lease's expiry
	fateKeyDeleted          // the key is gone but the lease lives: someone deleted it
	fateUnknown             // etcd did not answer
)

// chaosHold is one hold, from the holder's entry into the critical section.
type chaosHold struct {
	worker  int
	token   int64
	isOwner clientv3.Cmp
	lease   clientv3.LeaseID
	frozen  bool      // this holder was cut off
	older   bool      // a newer hold (higher token) was inside at the same time
	fate    holdFate  // checked only for older holds; written by the holder, read after the run
	doneAt  time.Time // when its Done closed; guarded by chaosRun.mu
}

// chaosPair is two holds inside at once.
type chaosPair struct{ older, newer *chaosHold }

// chaosStore is the resource outside etcd: a counter that, with fencing,
// rejects any token lower than the highest it has seen, reads included. It
// records every write it applies, in order.
type chaosStore struct {
	fencing bool

	mu      sync.Mutex
	highest int64 // the highest token seen, kept with fencing off too
	value   int64
	history []int64 // values written, in order
}

func (s *chaosStore) admit(token int64) bool {
	if s.fencing && token < s.highest {
		return false
	}
	s.highest = max(s.highest, token)
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

// seen returns the highest token the store has seen.
func (s *chaosStore) seen() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.highest
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
	t        *testing.T
	cfg      chaosConfig
	name     string // the lock
	counter  string // the etcd counter's key
	store    *chaosStore
	observer *clientv3.Client // never cut off

	kind      kind
	rec       *recorder
	deleted   deletions      // of the lock's keys
	bg        sync.WaitGroup // the observer's watch, and a watcher of each hold's Done
	faulty    atomic.Bool    // random cancels and TryLockFor on: the warm-up is over
	freezeReq atomic.Bool    // the next holder to see it is cut off
	freezing  atomic.Bool    // a cut-off is under way

	mu          sync.Mutex
	acqTimes    []time.Time
	inside      map[*chaosHold]bool
	holds       []*chaosHold
	pairs       []chaosPair
	faults      []chaosFault
	partitions  []*chaosPartition
	ackedRevs   []int64 // revisions of acknowledged etcd writes
	ackedStore  []int   // indices of acknowledged store writes
	counts      chaosResult
	countsMu    sync.Mutex
	workerError error
}

type chaosFault struct {
	kind    string
	at, end time.Time
}

func (r *chaosRun) add(field *int64, n int64) {
	r.countsMu.Lock()
	*field += n
	r.countsMu.Unlock()
}

func (r *chaosRun) fault(kind string, at, end time.Time) {
	r.mu.Lock()
	r.faults = append(r.faults, chaosFault{kind: kind, at: at, end: end})
	r.mu.Unlock()
}

func runChaos(t *testing.T, cfg chaosConfig) *chaosResult {
	c := etcdtest.StartCluster(t, 3)
	observer := c.Client(t)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	k, ok := kinds[cfg.kind]
	if !ok {
		t.Fatalf("kind %q: not one of the kinds", cfg.kind)
	}
	r := &chaosRun{
		t:        t,
		cfg:      cfg,
		name:     lockName(t),
		counter:  lockName(t) + "-counter",
		store:    &chaosStore{fencing: cfg.fencing},
		observer: observer,
		kind:     k,
		rec:      &recorder{},
		inside:   make(map[*chaosHold]bool),
	}
	r.counts.fencing = cfg.fencing
	ctx := context.Background()
	put := func() int64 {
		for {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			resp, err := observer.Put(pctx, r.counter, registerValue(0, "init"))
			cancel()
			if err == nil {
				return resp.Header.Revision
			}
		}
	}
	startRev := put()
	wctx, stopWatch := context.WithCancel(ctx)
	r.bg.Go(func() { r.deleted.watch(wctx, observer, r.name+"/", startRev) })
	defer func() {
		stopWatch()
		r.bg.Wait()
	}()

	workers := make([]*chaosWorker, cfg.workers)
	for i := range workers {
		client, proxy := c.ProxiedClient(t)
		workers[i] = &chaosWorker{run: r, id: i, client: client, proxy: proxy,
			rng: rand.New(rand.NewPCG(seed, uint64(i))),
			reg: &register{client: client, key: r.counter, lock: r.name, kind: k, fenced: cfg.fencing, id: i, sink: r.rec}}
	}
	workCtx, stopWorkers := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() { w.loop(workCtx) })
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

	r.counts.warmupRate = r.warmUp()
	if r.counts.warmupRate < minChaosRate {
		// The checks hold at any rate; the figures of a slow run mean less.
		t.Logf("acquisitions before the faults: %.1f/s at best, under the %d/s of a run whose figures count (machine busy)",
			r.counts.warmupRate, minChaosRate)
	}

	r.faulty.Store(true)

	// Faults, from the test's goroutine since Cluster reports through t.
	// No leader fault is injected during a cut-off: a new leader renews
	// every lease for a full TTL, which would only make the cut-off longer.
	frng := rand.New(rand.NewPCG(seed, 1<<32))
	began := time.Now()
	nextLeader, nextPartition := began.Add(cfg.leaderEvery/2), began.Add(cfg.partitionEvery/3)
	nextLag := began.Add(cfg.lagEvery * 2 / 3)
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
				at := time.Now()
				r.counts.leaderFaults++
				time.Sleep(cfg.leaderDown/2 + time.Duration(frng.Int64N(int64(cfg.leaderDown))))
				c.Restart(lead)
				r.fault(kind, at, time.Now())
				if c.Leader() < 0 {
					t.Fatal("no leader after a restart")
				}
			}
			nextLeader = time.Now().Add(cfg.leaderEvery)
		case cfg.lagEvery > 0 && now.After(nextLag):
			if lead := c.Leader(); lead >= 0 {
				i := (lead + 1 + frng.IntN(c.Members()-1)) % c.Members()
				at := time.Now()
				c.Lag(i)
				r.counts.lagFaults++
				time.Sleep(500*time.Millisecond + time.Duration(frng.Int64N(int64(1500*time.Millisecond))))
				c.CatchUp(i)
				r.fault("member lag", at, time.Now())
			}
			nextLag = time.Now().Add(cfg.lagEvery)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for r.freezing.Load() || r.freezeReq.Load() {
		time.Sleep(50 * time.Millisecond)
	}
	ended := time.Now()
	r.counts.duration = ended.Sub(began)
	stop()
	if r.workerError != nil {
		t.Fatal(r.workerError)
	}

	res := &r.counts
	slices.SortFunc(r.acqTimes, time.Time.Compare)
	res.recovery = r.recovery()
	r.mu.Lock()
	for _, p := range r.partitions {
		p.doneAt, p.deleted = p.hold.doneAt, r.deleted.of(p.hold.token)
		from := p.cut
		if r.kind.shared {
			from = p.deleted // before, the hold still counts against the limit
		}
		if i, ok := r.nextAcquisition(from); ok && !from.IsZero() {
			p.nextAcq = r.acqTimes[i]
		}
		res.partitions = append(res.partitions, *p)
	}
	r.mu.Unlock()
	r.classify(res)
	// A Session closed while cut off, or whose revoke was lost to a leader
	// kill, could not revoke its lease: it expires within the TTL (a leader
	// change during the faults renews it once more), and etcd reaps expired
	// leases every 500 ms, with their keys. Keys are counted after that:
	// what the library promises is that nothing outlives its lease.
	lctx, cancel := context.WithTimeout(ctx, 2*cfg.ttl+2*time.Second)
	defer cancel()
	var left []clientv3.LeaseStatus
	_ = waitUntil(lctx, func() bool {
		leases, err := sessionLeases(lctx, observer)
		if err == nil {
			left = leases
		}
		return err == nil && len(left) == 0
	})
	res.leasesLeft = len(left)
	res.keysLeft = len(lockKeys(t, observer, r.name))
	for _, l := range left {
		if ttl, err := observer.TimeToLive(lctx, l.ID, clientv3.WithAttachedKeys()); err == nil {
			t.Logf("lease %x left: TTL %d s of %d s, keys %q", l.ID, ttl.TTL, ttl.GrantedTTL, ttl.Keys)
		}
	}

	hctx, hcancel := context.WithTimeout(ctx, testTimeout)
	defer hcancel()
	puts, err := registerHistory(hctx, observer, r.counter, startRev)
	if err != nil {
		t.Fatalf("the counter's history: %v", err)
	}
	if res.lostEtcd, err = lostAcked(puts, r.ackedRevs, writeTokens(r.rec.history())); err != nil {
		t.Fatal(err)
	}
	res.lostStore = lostUpdates(r.store.history, r.ackedStore)

	ops, applied, dropped := resolve(r.rec.history(), puts)
	res.operations, res.unanswered = len(ops), [2]int{applied, dropped}
	want := porcupine.Ok
	if !cfg.fencing {
		want = porcupine.Illegal
	}
	res.history = checkHistory(t, ops, false, want, max(time.Minute, cfg.faults))

	var windows []faultWindow
	for _, f := range r.faults {
		windows = append(windows, faultWindow{Kind: f.kind, From: f.at.Sub(began).Seconds(), To: f.end.Sub(began).Seconds()})
	}
	fencing, run := "on", cfg.kind
	if !cfg.fencing {
		fencing, run = "off", cfg.kind+"-unfenced"
	}
	writeTimeline(t, run, newTimeline(fmt.Sprintf("Chaos test, %s, fencing %s: %d workers in one process, TTL %v, 3 etcd members; acquisitions per second",
		cfg.kind, fencing, cfg.workers, cfg.ttl), began, ended, r.acqTimes, windows))
	return res
}

// warmUp returns the acquisition rate without faults: over the warm-up from
// the first acquisition (after the Sessions are made), or, if that is below
// the minimum, the best of up to three more windows as long, since a shared
// machine can be busy for a while.
func (r *chaosRun) warmUp() float64 {
	count := func() (int, time.Time) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.acqTimes) == 0 {
			return 0, time.Time{}
		}
		return len(r.acqTimes), r.acqTimes[0]
	}
	time.Sleep(r.cfg.warmup)
	var best float64
	if n, first := count(); n > 0 {
		best = float64(n) / time.Since(first).Seconds()
	}
	for range 3 {
		if best >= minChaosRate {
			break
		}
		n0, _ := count()
		start := time.Now()
		time.Sleep(r.cfg.warmup)
		n1, _ := count()
		best = max(best, float64(n1-n0)/time.Since(start).Seconds())
	}
	return best
}

// nextAcquisition returns the index of the first acquisition after at.
func (r *chaosRun) nextAcquisition(at time.Time) (int, bool) {
	i, _ := slices.BinarySearchFunc(r.acqTimes, at, time.Time.Compare)
	return i, i < len(r.acqTimes)
}

// recovery returns, for each kind of fault, the time from each fault to the
// next acquisition.
func (r *chaosRun) recovery() map[string][]time.Duration {
	out := make(map[string][]time.Duration)
	for _, f := range r.faults {
		if i, ok := r.nextAcquisition(f.at); ok {
			out[f.kind] = append(out[f.kind], r.acqTimes[i].Sub(f.at))
		}
	}
	return out
}

// classify sorts the overlaps. Two holds inside at once are allowed only if
// the older one (lower token) had lost its key to its lease's expiry: if its
// key was still in etcd once it had left, the key was there when the newer
// hold was granted, since a key never comes back with the same create
// revision, and the newer hold should never have been granted.
func (r *chaosRun) classify(res *chaosResult) {
	res.overlapPairs = len(r.pairs)
	if r.kind.shared {
		return // holds inside at once are the point; the history check judges them
	}
	for _, p := range r.pairs {
		if p.older.fate == fateExpired {
			res.pairsExpired++
			if !p.older.frozen {
				res.pairsNotCut++
			}
		} else {
			res.pairsBothHeld++
			if res.pairsBothHeld <= 5 {
				r.t.Logf("overlap: hold %d (worker %d) and hold %d (worker %d), the older one %v",
					p.older.token, p.older.worker, p.newer.token, p.newer.worker, p.older.fate)
			}
		}
	}
	for _, h := range r.holds {
		if h.fate == fateKeyDeleted {
			res.holdsKeyDeleted++
		}
	}
}

func (f holdFate) String() string {
	return [...]string{"not checked", "still held", "lost to its lease's expiry", "deleted while its lease lived", "unknown"}[f]
}

func (r *chaosRun) fail(err error) {
	r.mu.Lock()
	if r.workerError == nil {
		r.workerError = err
	}
	r.mu.Unlock()
}

// check checks what every run must show, fencing or not: faults were
// injected, the lock kept being taken after each, every hold was the oldest
// key of the lock while its key was there, no two holds were inside at once
// unless the older had lost its lease, no key vanished while its lease
// lived, every cut-off holder had seen Done close by the time it woke, and
// nothing was left behind.
func (res *chaosResult) check(t *testing.T, cfg chaosConfig) {
	t.Helper()
	if cfg.partitionEvery > 0 && len(res.partitions) == 0 {
		t.Error("partitions: got 0, want ≥ 1")
	}
	if cfg.leaderEvery > 0 && res.leaderFaults == 0 {
		t.Error("leader faults: got 0, want ≥ 1")
	}
	if cfg.lagEvery > 0 && res.lagFaults == 0 {
		t.Error("member lags: got 0, want ≥ 1")
	}
	for kind, ds := range res.recovery {
		if m := slices.Max(ds); m > testTimeout {
			t.Errorf("%s: next acquisition after %v, want ≤ %v", kind, m, testTimeout)
		}
	}
	if res.pairsBothHeld != 0 {
		t.Errorf("holds inside at once while the older one's key was still in etcd: got %d pairs, want 0", res.pairsBothHeld)
	}
	if res.notOldest != 0 {
		t.Errorf("holds whose key, read in etcd inside the hold, was not the oldest of the lock: got %d, want 0", res.notOldest)
	}
	if res.holdsKeyDeleted != 0 {
		t.Errorf("holds whose key was deleted while their lease lived: got %d, want 0", res.holdsKeyDeleted)
	}
	for i, p := range res.partitions {
		if !p.doneSeen {
			t.Errorf("partition %d: Mutex.Done of the holder cut off for %v: got open when it woke, want closed",
				i+1, p.wake.Sub(p.cut).Round(time.Millisecond))
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
	row := func(what string, v any) { t.Logf("  %-60s %v", what, v) }
	t.Logf("chaos, fencing %s: %v of faults", fencing, res.duration.Round(time.Second))
	row(fmt.Sprintf("acquisitions/s before the faults (must be ≥ %d)", minChaosRate), fmt.Sprintf("%.1f", res.warmupRate))
	row("acquisitions", res.acquisitions)
	row("acknowledged updates: etcd / store", fmt.Sprintf("%d / %d", res.ackedEtcd, res.ackedStore))
	row("acknowledged updates lost: etcd / store", fmt.Sprintf("%d / %d", res.lostEtcd, res.lostStore))
	row("fence rejections: etcd (IsOwner) / store (token)", fmt.Sprintf("%d / %d", res.fencedEtcd, res.fencedStore))
	row("overlaps (entries with another holder inside)", res.overlaps)
	row("pairs inside at once: older lease expired / older still held", fmt.Sprintf("%d / %d", res.pairsExpired, res.pairsBothHeld))
	row("  of the expired, older holder not cut off (lost otherwise)", res.pairsNotCut)
	row("holds whose key was deleted while their lease lived", res.holdsKeyDeleted)
	row("holds not the oldest key of the lock, read inside the hold", res.notOldest)
	row("writes skipped on Mutex.Done / of which still owner", fmt.Sprintf("%d / %d", res.doneSkips, res.doneSpurious))
	row("etcd writes retried, unanswered", res.retriedEtcd)
	row("lock calls cancelled / TryLockFor ran out / errors", fmt.Sprintf("%d / %d / %d", res.cancels, res.tryFalse, res.lockErrors))
	row("sessions made", res.sessions)
	row("leader faults / member lags / partitions", fmt.Sprintf("%d / %d / %d", res.leaderFaults, res.lagFaults, len(res.partitions)))
	kinds := make([]string, 0, len(res.recovery))
	for k := range res.recovery {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	for _, k := range kinds {
		row(fmt.Sprintf("%s → next acquisition: min / median / max", k), spread(res.recovery[k]))
	}
	var cutFor []time.Duration
	extended, doneOpen := 0, 0
	var ws []warning
	for _, p := range res.partitions {
		cutFor = append(cutFor, p.wake.Sub(p.cut))
		if p.extended {
			extended++
		}
		if !p.doneSeen {
			doneOpen++
		}
		ws = append(ws, warning{kind: "partition", token: p.hold.token, cut: p.cut, lastAck: p.lastAck, done: p.doneAt, sessionEnd: p.ended,
			deleted: p.deleted, next: p.nextAcq})
	}
	row("partition: cut off for min / median / max", spread(cutFor))
	row("partitions whose hold outlived TTL + 1.5 s (cut-off extended)", extended)
	row("partitions whose holder found Done open when it woke", doneOpen)
	row("history: operations checked / unanswered: writes applied, others dropped", fmt.Sprintf("%d / %d, %d", res.operations, res.unanswered[0], res.unanswered[1]))
	row("history, fenced register model (porcupine)", res.history)
	t.Log("early warning:")
	logWarnings(t, ws)
	row("keys / leases left after every client exited", fmt.Sprintf("%d / %d", res.keysLeft, res.leasesLeft))
}
