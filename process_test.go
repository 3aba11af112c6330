package etcdlock_test

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/syncbuf"
)

// The process test runs holders as separate OS processes: this test binary,
// run again with holderEnv set (TestMain calls holderMain). Each holder has
// its own client, through a proxy of its own, to a 3-member cluster; it
// loops: take the lock, read the register (a key in etcd) in a Txn guarded
// by IsOwner, write it plus one the same way, release. It reports every
// operation, with its times, on its standard output. The holders of the
// last slot hold on a Session WithRenewal, the others on Sessions that end
// with their leases (process_holder_test.go).
//
// Meanwhile the test SIGKILLs holders (and starts new ones), freezes them
// with SIGSTOP for TTL + 1.5 s and then SIGCONT (at any moment, or just
// before a write: the holder stops there and the test freezes it), cuts a
// holder off from etcd for as long, just before a write (its proxy stops
// forwarding, the write waits in it, TCP connections stay open, as in a
// partition), stops or kills the leader, and has a follower lag for
// 0.5–2 s (its peers' messages to it are held while it serves clients from
// its old state) before it catches up. One fault at a time: a new leader
// renews every lease for a full TTL, which would let a cut-off holder keep
// its hold.
//
// Checks: the history of every holder is linearizable for the fenced
// register model; every acknowledged write survives; no two holds that both
// ended with a clean release were held at once; the lock is taken again
// after every fault; no key or lease is left once the holders have exited
// and a TTL has passed. For each cut-off, the margin from the holder's Done
// closing to the next acquisition is measured; for each freeze, how soon
// after SIGCONT its Done closes (it cannot close before).
//
// ETCDLOCK_PROCESS_LONG=1 runs the faults for 10 minutes instead of 8 s per
// kind of lock; ETCDLOCK_PROCESS_LONG=3m, for 3 minutes.
// processConfig sizes a run of the process test.
type processConfig struct {
	kind    string
	holders int
	ttl     time.Duration
	faults  time.Duration
	gap     time.Duration // between two faults
	// unfenced turns the holders' fencing off: the run then must show lost
	// writes and a history that porcupine finds illegal.
	unfenced bool
	title    string // of the timeline
}

func TestProcessChaos(t *testing.T) { long(t); forEachKind(t, testProcessChaos) }

func testProcessChaos(t *testing.T, kind string) {
	cfg := processConfig{kind: kind, holders: 3, ttl: 2 * time.Second, faults: faultsFor(t, "ETCDLOCK_PROCESS_LONG", 6*time.Second), gap: time.Second,
		title: "Process chaos test"}
	runProcessChaos(t, cfg)
}

// holderProc is one holder process, as the test sees it.
type holderProc struct {
	id      int
	slot    int // its proxy's
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	stderr  *syncbuf.Buffer
	waiting chan int64     // the tokens of its Waiting lines
	exited  chan struct{}  // closed once it has exited and its output is read
	err     error          // of Wait, once exited
	killed  bool           // by the test
	acks    []time.Time    // its keep-alive acknowledgements; guarded by processRun.mu
	ended   []time.Time    // when its Sessions ended; guarded by processRun.mu
	holds   map[int64]bool // tokens it acquired; guarded by processRun.mu
}

// processRun is the state of one run of the process test.
type processRun struct {
	t        *testing.T
	cfg      processConfig
	cluster  *etcdtest.Cluster // nil where the test injects the faults of etcd itself
	net      holderNet
	name     string
	register string
	seed     uint64
	readers  sync.WaitGroup

	mu        sync.Mutex
	procs     []*holderProc
	ops       []historyOp
	calls     map[string]historyOp // writes sent, by id, until they return
	holding   map[*holderProc]int64
	dones     map[int64]time.Time // token → its Done closed
	skips     int
	stopping  bool // the holders were asked to exit
	lineError error
}

// holderNet is how holder processes reach etcd: each through a proxy of its
// own here (proxyNet), or from a network namespace of its own (net_test.go).
type holderNet interface {
	// command returns the command that runs holder slot with cfg, its
	// endpoints set.
	command(slot int, cfg holderConfig) *exec.Cmd
	// cut stops holder slot's traffic to etcd (TCP connections stay open,
	// as in a partition); heal lets it through again.
	cut(slot int)
	heal(slot int)
}

// proxyNet is a proxy per holder slot.
type proxyNet []*etcdtest.Proxy

func (n proxyNet) command(slot int, cfg holderConfig) *exec.Cmd {
	cfg.Endpoints = n[slot].Endpoints()
	return holderCommand(cfg)
}

func (n proxyNet) cut(slot int)  { n[slot].Pause() }
func (n proxyNet) heal(slot int) { n[slot].Unpause() }

// holderCommand returns the command that runs this test binary as a holder
// with cfg, after prefix (a command that runs another, such as ip netns
// exec) if there is one.
func holderCommand(cfg holderConfig, prefix ...string) *exec.Cmd {
	b, _ := json.Marshal(cfg)
	argv := append(prefix, os.Args[0], "-test.run=^$")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), holderEnv+"="+string(b))
	return cmd
}

// processFault is one fault of the run.
type processFault struct {
	kind    string
	proc    *holderProc // the holder it hit, if any
	token   int64       // the hold it hit, if known
	at, end time.Time
}

func runProcessChaos(t *testing.T, cfg processConfig) {
	c := etcdtest.StartCluster(t, 3)
	var proxies proxyNet
	for range cfg.holders {
		_, proxy := c.ProxiedClient(t)
		proxies = append(proxies, proxy)
	}
	r := newProcessRun(t, cfg, proxies)
	r.cluster = c
	rotation := []string{"partition", "member lag", "freeze at write", "holder kill", "leader kill", "freeze", "holder kill at write", "leader stop"}
	r.run(c.Client(t), rotation, r.inject)
}

// newProcessRun returns a run whose holders reach etcd through n, with a
// seed of its own, logged.
func newProcessRun(t *testing.T, cfg processConfig, n holderNet) *processRun {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	return &processRun{t: t, cfg: cfg, net: n, name: lockName(t), register: lockName(t) + "-register", seed: seed,
		calls: make(map[string]historyOp), holding: make(map[*holderProc]int64), dones: make(map[int64]time.Time)}
}

// processFigures are the figures of a run that a report needs.
type processFigures struct {
	acquisitions  int
	acked, lost   int
	staleAccepted int                        // acknowledged writes of a hold sent after a newer hold was granted
	recovery      map[string][]time.Duration // fault kind → from its start to the next acquisition by another
	afterHeal     map[string][]time.Duration // fault kind → from its end to the next acquisition
	margins       []time.Duration            // early-warning margins of the partitions
	keysLeft      int
	leasesLeft    int
	history       porcupine.CheckResult
	// heldDuring and heldBetween are the shares of time (0 to 1) with at
	// least one hold, while faults last and between them.
	heldDuring, heldBetween float64
}

// run starts the holders, injects the faults of rotation in turn with
// inject until cfg.faults has passed, stops the holders, then checks and
// logs what happened, as etcd and the holders' reports tell it.
func (r *processRun) run(observer *clientv3.Client, rotation []string, inject func(kind string, rng *rand.Rand) *processFault) processFigures {
	t, cfg := r.t, r.cfg
	resp, err := observer.Put(testContext(t), r.register, registerValue(0, "init"))
	if err != nil {
		t.Fatal(err)
	}
	startRev := resp.Header.Revision
	var deleted deletions
	wctx, stopWatch := context.WithCancel(context.Background())
	var watching sync.WaitGroup
	watching.Go(func() { deleted.watch(wctx, observer, r.name+"/", startRev) })
	defer func() {
		stopWatch()
		watching.Wait()
	}()
	t.Cleanup(r.killAll) // if the test ends early
	for i := range cfg.holders {
		r.start(i)
	}
	eventually(t, "every holder's first hold", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, p := range r.procs {
			if len(p.holds) == 0 {
				return false
			}
		}
		return true
	})

	rng := rand.New(rand.NewPCG(r.seed, 1<<32))
	var faults []*processFault
	began := time.Now()
	for i := 0; time.Since(began) < cfg.faults; i++ {
		if err := r.failure(); err != nil {
			t.Fatal(err)
		}
		f := inject(rotation[i%len(rotation)], rng)
		t.Logf("fault %d at +%v: %s", i+1, f.at.Sub(began).Round(time.Millisecond), f.kind)
		faults = append(faults, f)
		time.Sleep(cfg.gap/2 + time.Duration(rng.Int64N(int64(cfg.gap))))
	}
	ended := time.Now()
	// The lock is taken again after the last fault before the holders stop.
	last := faults[len(faults)-1]
	eventually(t, "an acquisition after the last fault", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return slices.ContainsFunc(r.ops, func(op historyOp) bool {
			return op.Kind == opAcquire && op.Return > last.at.UnixNano() && (last.proc == nil || op.Client != last.proc.id)
		})
	})
	r.stopAll()
	if err := r.failure(); err != nil {
		t.Fatal(err)
	}

	// Nothing left: the holders closed their Sessions, and the leases of
	// the killed ones expire within their TTL.
	left := func() (int, int) {
		lctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		leases, err := sessionLeases(lctx, observer)
		if err != nil {
			return -1, -1
		}
		return len(lockKeys(t, observer, r.name)), len(leases)
	}
	deadline := time.Now().Add(2*cfg.ttl + testTimeout)
	keysLeft, leasesLeft := left()
	for (keysLeft != 0 || leasesLeft != 0) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		keysLeft, leasesLeft = left()
	}
	if keysLeft != 0 || leasesLeft != 0 {
		t.Errorf("after every holder exited and its TTL passed: got %d keys and %d leases, want 0 and 0", keysLeft, leasesLeft)
	}

	// The history.
	hctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	puts, err := registerHistory(hctx, observer, r.register, startRev)
	if err != nil {
		t.Fatalf("the register's history: %v", err)
	}
	r.mu.Lock()
	ops := slices.Clone(r.ops)
	for _, op := range r.calls { // sent, never returned: the holder was killed
		op.Result, op.Return = resUnknown, math.MaxInt64
		ops = append(ops, op)
	}
	r.mu.Unlock()
	revOf := make(map[string]int64, len(puts))
	for _, p := range puts {
		revOf[p.id] = p.rev
	}
	var ackedRevs []int64
	acked := 0
	for _, op := range ops {
		if op.Kind == opWrite && op.Result == resOK {
			acked++
			ackedRevs = append(ackedRevs, revOf[op.ID])
		}
	}
	slices.Sort(ackedRevs)
	lost, err := lostAcked(puts, ackedRevs, writeTokens(ops))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range lostDetails(puts, ackedRevs, writeTokens(ops)) {
		t.Logf("acknowledged write lost: %s", d)
	}
	checked, applied, dropped := resolve(ops, puts)
	overlaps := 0
	if !kinds[cfg.kind].shared {
		overlaps = cleanOverlaps(checked)
	}
	wantHistory := porcupine.Ok
	if cfg.unfenced {
		wantHistory = porcupine.Illegal
	}
	history := checkHistory(t, checked, false, wantHistory, max(time.Minute, cfg.faults))
	stale := 0
	if !kinds[cfg.kind].shared {
		stale = staleAccepted(checked)
	}

	// Recovery and the early warning.
	var acqTimes []time.Time
	type acq struct {
		at   time.Time
		proc int
	}
	var acqs []acq
	for _, op := range checked {
		if op.Kind == opAcquire {
			acqs = append(acqs, acq{time.Unix(0, op.Return), op.Client})
		}
	}
	slices.SortFunc(acqs, func(a, b acq) int { return a.at.Compare(b.at) })
	for _, a := range acqs {
		acqTimes = append(acqTimes, a.at)
	}
	nextBy := func(at time.Time, notProc int) time.Time {
		i, _ := slices.BinarySearchFunc(acqs, at, func(a acq, t time.Time) int { return a.at.Compare(t) })
		for ; i < len(acqs); i++ {
			if acqs[i].proc != notProc {
				return acqs[i].at
			}
		}
		return time.Time{}
	}
	recovery := map[string][]time.Duration{}
	afterHeal := map[string][]time.Duration{}
	var ws []warning
	var failover []time.Duration // holder kills at a write → the next acquisition in the hold's place
	var windows []faultWindow
	staleWrites := map[string][3]int{} // kind → writes of the hit hold after the fault: refused, acknowledged, unanswered
	resumeToDone := map[string][]time.Duration{}
	var kindsSeen []string
	for _, f := range faults {
		if _, ok := recovery[f.kind]; !ok {
			kindsSeen = append(kindsSeen, f.kind)
		}
		notProc := -1
		if f.proc != nil {
			notProc = f.proc.id
		}
		next := nextBy(f.at, notProc)
		if next.IsZero() {
			t.Errorf("%s at %v: no acquisition after it", f.kind, f.at.Sub(began).Round(time.Millisecond))
		} else {
			recovery[f.kind] = append(recovery[f.kind], next.Sub(f.at))
		}
		if healed := nextBy(f.end, -1); !healed.IsZero() {
			afterHeal[f.kind] = append(afterHeal[f.kind], healed.Sub(f.end))
		}
		windows = append(windows, faultWindow{Kind: f.kind, From: f.at.Sub(began).Seconds(), To: f.end.Sub(began).Seconds()})
		if f.token == 0 || releasedBefore(checked, f.token, f.at) {
			continue // no hold was hit
		}
		if strings.HasPrefix(f.kind, "holder kill") {
			if f.kind != "holder kill at write" {
				continue // the kill may have come after a release not yet reported
			}
			// The failover: the next acquisition in the killed hold's place.
			takeover := next
			if kinds[cfg.kind].shared {
				takeover = nextBy(deleted.of(f.token), notProc)
			}
			if !takeover.IsZero() && !deleted.of(f.token).IsZero() {
				failover = append(failover, takeover.Sub(f.at))
			}
			continue
		}
		r.mu.Lock()
		done := r.dones[f.token]
		var lastAck, sessionEnd time.Time
		if i, _ := slices.BinarySearchFunc(f.proc.acks, f.at, time.Time.Compare); i > 0 {
			lastAck = f.proc.acks[i-1]
		}
		if i, _ := slices.BinarySearchFunc(f.proc.ended, f.at, time.Time.Compare); i < len(f.proc.ended) && f.proc.ended[i].Before(f.end) {
			sessionEnd = f.proc.ended[i]
		}
		r.mu.Unlock()
		if f.kind == "partition" {
			w := warning{kind: f.kind, token: f.token, cut: f.at, lastAck: lastAck, done: done, sessionEnd: sessionEnd,
				deleted: deleted.of(f.token), next: next}
			if kinds[cfg.kind].shared {
				w.next = time.Time{}
				if !w.deleted.IsZero() {
					w.next = nextBy(w.deleted, notProc) // before, the hold still counts against the limit
				}
			}
			ws = append(ws, w)
		} else if done.After(f.at) {
			// A frozen process cannot see its Done close before it runs again.
			resumeToDone[f.kind] = append(resumeToDone[f.kind], done.Sub(f.end))
		}
		sw := staleWrites[f.kind]
		for _, op := range checked {
			if op.Kind == opWrite && op.Token == f.token && op.Call >= f.at.UnixNano() {
				sw[min(int(op.Result), 2)]++ // ok, rejected, unknown → 0, 1, 2
			}
		}
		staleWrites[f.kind] = sw
	}

	// The share of time with a holder, while faults last and between them.
	spans := r.holdSpans(checked, &deleted, ended)
	var faulty []span
	for _, f := range faults {
		faulty = append(faulty, span{f.at, f.end})
	}
	heldDuring := coveredShare(spans, faulty)
	heldBetween := coveredShare(spans, between(faulty, began, ended))

	row := func(what string, v any) { t.Logf("  %-62s %v", what, v) }
	t.Logf("process chaos, %d %s holders, TTL %v: %v of faults", cfg.holders, cfg.kind, cfg.ttl, ended.Sub(began).Round(time.Second))
	r.mu.Lock()
	row("holder processes started / killed", fmt.Sprintf("%d / %d", len(r.procs), countKilled(r.procs)))
	skips := r.skips
	r.mu.Unlock()
	row("acquisitions", len(acqs))
	row("acknowledged writes / lost", fmt.Sprintf("%d / %d", acked, lost))
	row("acknowledged writes sent after a newer hold was granted (stale)", stale)
	row("writes skipped because Done had closed", skips)
	row("overlaps of two holds that both released cleanly", overlaps)
	row("history: operations checked / unanswered: writes applied, others dropped", fmt.Sprintf("%d / %d, %d", len(checked), applied, dropped))
	row("history, fenced register model (porcupine)", history)
	for _, k := range kindsSeen {
		row(fmt.Sprintf("%s (%d) → next acquisition by another: min / median / max", k, len(recovery[k])), spread(recovery[k]))
		row(fmt.Sprintf("%s: its end → next acquisition: min / median / max", k), spread(afterHeal[k]))
	}
	row("holder kill at write → next acquisition in its place (failover): min / median / max", spread(failover))
	for _, k := range kindsSeen {
		if sw, ok := staleWrites[k]; ok {
			row(fmt.Sprintf("%s: later writes of the hit hold: acknowledged / refused / unanswered", k), fmt.Sprintf("%d / %d / %d", sw[0], sw[1], sw[2]))
		}
	}
	for _, k := range kindsSeen {
		if d, ok := resumeToDone[k]; ok {
			row(fmt.Sprintf("%s: SIGCONT → Done closed (of holds whose Done was open when frozen)", k), spread(d))
		}
	}
	row("time with a holder: while faults last / between them", fmt.Sprintf("%.1f%% / %.1f%%", 100*heldDuring, 100*heldBetween))
	row("keys / leases left", fmt.Sprintf("%d / %d", keysLeft, leasesLeft))
	t.Log("early warning:")
	logWarnings(t, ws)
	writeTimeline(t, cfg.kind, newTimeline(fmt.Sprintf("%s: %d %s holder processes, TTL %v, 3 etcd members; acquisitions per second",
		cfg.title, cfg.holders, cfg.kind, cfg.ttl), began, ended, acqTimes, windows))

	if history != wantHistory {
		t.Errorf("history, fenced register model: got %s, want %s", history, wantHistory)
	}
	if !cfg.unfenced && (lost != 0 || stale != 0 || overlaps != 0) {
		t.Errorf("acknowledged writes lost / stale writes acknowledged / pairs of holds held at once that both released cleanly: got %d / %d / %d, want 0 / 0 / 0",
			lost, stale, overlaps)
	}
	for _, k := range kindsSeen {
		if len(recovery[k]) == 0 {
			continue
		}
		if m := slices.Max(recovery[k]); m > testTimeout {
			t.Errorf("%s: next acquisition after %v, want ≤ %v", k, m, testTimeout)
		}
	}
	fig := processFigures{acquisitions: len(acqs), acked: acked, lost: lost, staleAccepted: stale, recovery: recovery, afterHeal: afterHeal,
		keysLeft: keysLeft, leasesLeft: leasesLeft, history: history, heldDuring: heldDuring, heldBetween: heldBetween}
	for _, w := range ws {
		if m, ok := w.margin(); ok {
			fig.margins = append(fig.margins, m)
		}
	}
	return fig
}

// A span is a stretch of time.
type span struct{ from, to time.Time }

// holdSpans returns when each acquired hold of ops held, as its holder saw
// it: from the acquisition's return to the first of its release's call, its
// Done closing and its key's deletion in etcd (ended if none came).
func (r *processRun) holdSpans(ops []historyOp, deleted *deletions, ended time.Time) []span {
	released := map[int64]time.Time{}
	for _, op := range ops {
		if op.Kind == opRelease {
			released[op.Token] = time.Unix(0, op.Call)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var spans []span
	for _, op := range ops {
		if op.Kind != opAcquire {
			continue
		}
		end := ended
		for _, at := range []time.Time{released[op.Token], r.dones[op.Token], deleted.of(op.Token)} {
			if !at.IsZero() && at.Before(end) {
				end = at
			}
		}
		if from := time.Unix(0, op.Return); from.Before(end) {
			spans = append(spans, span{from, end})
		}
	}
	return spans
}

// coveredShare returns the share of the time of windows (0 to 1) that at
// least one of spans covers; 0 if windows last no time.
func coveredShare(spans, windows []span) float64 {
	var merged []span // sorted, disjoint
	for _, s := range slices.SortedFunc(slices.Values(spans), func(a, b span) int { return a.from.Compare(b.from) }) {
		if n := len(merged); n > 0 && !s.from.After(merged[n-1].to) {
			if s.to.After(merged[n-1].to) {
				merged[n-1].to = s.to
			}
			continue
		}
		merged = append(merged, s)
	}
	var total, covered time.Duration
	for _, w := range windows {
		total += w.to.Sub(w.from)
		for _, m := range merged {
			from, to := later(m.from, w.from), earlier(m.to, w.to)
			if to.After(from) {
				covered += to.Sub(from)
			}
		}
	}
	if total <= 0 {
		return 0
	}
	return float64(covered) / float64(total)
}

// between returns the stretches of [from, to] that no window covers.
func between(windows []span, from, to time.Time) []span {
	var gaps []span
	at := from
	for _, w := range slices.SortedFunc(slices.Values(windows), func(a, b span) int { return a.from.Compare(b.from) }) {
		if w.from.After(at) {
			gaps = append(gaps, span{at, earlier(w.from, to)})
		}
		at = later(at, w.to)
	}
	if to.After(at) {
		gaps = append(gaps, span{at, to})
	}
	return gaps
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// staleAccepted counts the acknowledged writes to the register sent after
// a hold with a higher token was granted: the writes of an exclusive lock's
// old holder that fencing must refuse.
func staleAccepted(ops []historyOp) int {
	var granted []historyOp
	for _, op := range ops {
		if op.Kind == opAcquire {
			granted = append(granted, op)
		}
	}
	slices.SortFunc(granted, func(a, b historyOp) int { return cmp.Compare(a.Return, b.Return) })
	highest := make([]int64, len(granted)+1) // highest[i]: the highest token of granted[:i]
	for i, g := range granted {
		highest[i+1] = max(highest[i], g.Token)
	}
	n := 0
	for _, op := range ops {
		if op.Kind != opWrite || op.Result != resOK {
			continue
		}
		i, _ := slices.BinarySearchFunc(granted, op.Call, func(g historyOp, call int64) int { return cmp.Compare(g.Return, call) })
		if highest[i] > op.Token {
			n++
		}
	}
	return n
}

func countKilled(procs []*holderProc) int {
	n := 0
	for _, p := range procs {
		if p.killed {
			n++
		}
	}
	return n
}

// renews tells whether the holders of slot hold on a Session WithRenewal:
// those of the last slot do, so that every run has a Session that outlives
// its leases beside Sessions that end with theirs.
func (r *processRun) renews(slot int) bool { return slot == r.cfg.holders-1 }

// start starts holder process number len(r.procs) behind proxy slot.
func (r *processRun) start(slot int) *holderProc {
	t := r.t
	r.mu.Lock()
	id := len(r.procs)
	r.mu.Unlock()
	cmd := r.net.command(slot, holderConfig{Kind: r.cfg.kind, Lock: r.name, Register: r.register, TTL: r.cfg.ttl, ID: id, Seed: r.seed,
		Unfenced: r.cfg.unfenced, Renew: r.renews(slot)})
	p := &holderProc{id: id, slot: slot, cmd: cmd, stderr: &syncbuf.Buffer{}, waiting: make(chan int64, 1),
		exited: make(chan struct{}), holds: make(map[int64]bool)}
	cmd.Stderr = p.stderr
	var inErr error
	p.stdin, inErr = cmd.StdinPipe()
	stdout, outErr := cmd.StdoutPipe()
	if err := errors.Join(inErr, outErr); err != nil {
		t.Fatalf("holder %d: pipes: %v", id, err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("holder %d: start: %v", id, err)
	}
	r.mu.Lock()
	r.procs = append(r.procs, p)
	r.mu.Unlock()
	r.readers.Go(func() {
		defer close(p.exited)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			r.line(p, sc.Bytes())
		}
		p.err = cmd.Wait()
	})
	return p
}

// line takes in one line of holder p.
func (r *processRun) line(p *holderProc, b []byte) {
	var l holderLine
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := json.Unmarshal(b, &l); err != nil {
		r.lineError = cmp.Or(r.lineError, fmt.Errorf("holder %d: line %q: %w", p.id, b, err))
		return
	}
	switch {
	case l.Call != nil:
		r.calls[l.Call.ID] = *l.Call
	case l.Op != nil:
		op := *l.Op
		r.ops = append(r.ops, op)
		switch op.Kind {
		case opWrite:
			delete(r.calls, op.ID)
		case opAcquire:
			r.holding[p] = op.Token
			p.holds[op.Token] = true
		case opRelease:
			delete(r.holding, p)
		}
	case l.Done != 0:
		if _, ok := r.dones[l.Done]; !ok {
			r.dones[l.Done] = time.Unix(0, l.At)
		}
	case l.Ack != 0:
		p.acks = append(p.acks, time.Unix(0, l.At))
	case l.Ended != 0:
		p.ended = append(p.ended, time.Unix(0, l.At))
	case l.Waiting != 0:
		select {
		case p.waiting <- l.Waiting:
		default:
		}
	case l.Skip != 0:
		r.skips++
	case l.Error != "":
		r.lineError = cmp.Or(r.lineError, fmt.Errorf("holder %d: %s", p.id, l.Error))
	}
}

// failure returns the first error a holder reported, or the exit of a
// holder the test did not kill.
func (r *processRun) failure() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lineError != nil {
		return r.lineError
	}
	for _, p := range r.procs {
		select {
		case <-p.exited:
			if !p.killed && (!r.stopping || p.err != nil) {
				return fmt.Errorf("holder %d exited: %v; its stderr:\n%s", p.id, p.err, p.stderr.String())
			}
		default:
		}
	}
	return nil
}

// target returns the holder that holds the lock now (by its reports), and
// its token; a live holder at random when none does.
func (r *processRun) target(rng *rand.Rand) (*holderProc, int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var live []*holderProc
	for _, p := range r.procs {
		if !p.killed {
			live = append(live, p)
		}
	}
	slices.SortFunc(live, func(a, b *holderProc) int { return cmp.Compare(r.holding[b], r.holding[a]) })
	if r.holding[live[0]] != 0 {
		return live[0], r.holding[live[0]]
	}
	return live[rng.IntN(len(live))], 0
}

// inject makes one fault and returns once it is over (a holder kill, once
// the killed holder's lease could have expired; its replacement starts at
// once).
func (r *processRun) inject(kind string, rng *rand.Rand) *processFault {
	t, c := r.t, r.cluster
	cut := r.cfg.ttl + 1500*time.Millisecond
	f := &processFault{kind: kind}
	switch kind {
	case "leader kill", "leader stop":
		lead := c.Leader()
		if lead < 0 {
			t.Fatal("no leader")
		}
		f.at = time.Now()
		if kind == "leader kill" {
			c.Kill(lead)
		} else {
			c.Stop(lead)
		}
		time.Sleep(500*time.Millisecond + time.Duration(rng.Int64N(int64(time.Second))))
		c.Restart(lead)
		f.end = time.Now()
		if c.Leader() < 0 {
			t.Fatal("no leader after a restart")
		}
	case "member lag":
		lead := c.Leader()
		if lead < 0 {
			t.Fatal("no leader")
		}
		i := (lead + 1 + rng.IntN(c.Members()-1)) % c.Members()
		f.at = time.Now()
		c.Lag(i)
		time.Sleep(500*time.Millisecond + time.Duration(rng.Int64N(int64(1500*time.Millisecond))))
		c.CatchUp(i)
		f.end = time.Now()
	case "holder kill", "holder kill at write":
		if kind == "holder kill" {
			f.proc, f.token = r.target(rng) // at whatever it is doing
		} else {
			f.proc, f.token = r.atWrite(rng)
		}
		f.at = time.Now()
		r.mu.Lock()
		f.proc.killed = true
		r.mu.Unlock()
		_ = f.proc.cmd.Process.Signal(syscall.SIGKILL)
		f.end = f.at.Add(r.cfg.ttl)
		r.start(f.proc.slot)
		// The killed holder's key blocks the lock until its lease expires:
		// let that pass before the next fault, whose recovery it would
		// otherwise delay.
		time.Sleep(cut)
	case "partition":
		// Cut off just before a write: it waits in the proxy.
		f.proc, f.token = r.atWrite(rng)
		f.at = time.Now()
		r.net.cut(f.proc.slot)
		_, _ = io.WriteString(f.proc.stdin, "go\n")
		time.Sleep(cut)
		r.net.heal(f.proc.slot)
		f.end = time.Now()
	case "freeze", "freeze at write":
		if kind == "freeze" {
			f.proc, f.token = r.target(rng) // at whatever it is doing
		} else {
			f.proc, f.token = r.atWrite(rng)
		}
		f.at = time.Now()
		_ = f.proc.cmd.Process.Signal(syscall.SIGSTOP)
		time.Sleep(cut)
		_ = f.proc.cmd.Process.Signal(syscall.SIGCONT)
		f.end = time.Now()
		if kind == "freeze at write" {
			_, _ = io.WriteString(f.proc.stdin, "go\n")
		}
	}
	return f
}

// atWrite has a holder stop at the worst moment, after its hold's Done
// check and before its write, and returns it and its token once it is
// there; it waits for "go".
func (r *processRun) atWrite(rng *rand.Rand) (*holderProc, int64) {
	p, _ := r.target(rng)
	_, _ = io.WriteString(p.stdin, "stop\n")
	select {
	case token := <-p.waiting:
		return p, token
	case <-time.After(testTimeout):
		r.t.Fatalf("holder %d: no hold reached its write in %v", p.id, testTimeout)
		return nil, 0
	}
}

// stopAll asks every holder to finish (its stdin closes) and waits for it,
// killing one that does not exit within testTimeout.
func (r *processRun) stopAll() {
	r.mu.Lock()
	procs := slices.Clone(r.procs)
	r.stopping = true
	r.mu.Unlock()
	for _, p := range procs {
		_ = p.stdin.Close()
	}
	for _, p := range procs {
		select {
		case <-p.exited:
		case <-time.After(testTimeout):
			_ = p.cmd.Process.Kill()
			<-p.exited
			r.mu.Lock()
			r.lineError = cmp.Or(r.lineError, fmt.Errorf("holder %d did not exit within %v of its stdin closing", p.id, testTimeout))
			r.mu.Unlock()
		}
	}
	r.readers.Wait()
}

// killAll kills the holders still running and waits for them: the cleanup
// of a test that ended early.
func (r *processRun) killAll() {
	r.mu.Lock()
	procs := slices.Clone(r.procs)
	r.mu.Unlock()
	for _, p := range procs {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
			_ = p.cmd.Process.Kill()
		}
	}
	r.readers.Wait()
}

// releasedBefore reports whether the hold with token was released before
// at: the holder was hit after its hold.
func releasedBefore(ops []historyOp, token int64, at time.Time) bool {
	return slices.ContainsFunc(ops, func(op historyOp) bool {
		return op.Kind == opRelease && op.Token == token && op.Call < at.UnixNano()
	})
}

func TestCoveredShare(t *testing.T) {
	at := func(s int) time.Time { return time.Unix(1000+int64(s), 0) }
	spans := []span{{at(5), at(7)}, {at(0), at(2)}, {at(1), at(3)}} // held 0–3 and 5–7
	windows := []span{{at(2), at(6)}}                               // 2–3 and 5–6 of 2–6 held
	if got := coveredShare(spans, windows); got != 0.5 {
		t.Errorf("coveredShare: got %v, want 0.5", got)
	}
	gaps := between([]span{{at(4), at(6)}, {at(1), at(2)}}, at(0), at(8))
	want := []span{{at(0), at(1)}, {at(2), at(4)}, {at(6), at(8)}}
	if !slices.Equal(gaps, want) {
		t.Errorf("between: got %v, want %v", gaps, want)
	}
	if got := coveredShare(spans, gaps); got != 3.0/5 { // 0–1, 2–3 and 6–7 of 5 s
		t.Errorf("coveredShare of the gaps: got %v, want 0.6", got)
	}
	if got := coveredShare(spans, nil); got != 0 {
		t.Errorf("coveredShare of no window: got %v, want 0", got)
	}
}
