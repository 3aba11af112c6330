package etcdlock_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/queue"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// The fault matrix: for every kind of lock, every etcd call the lock makes
// (seams_test.go) and every fault that call can suffer, one case that runs
// an acquisition, a hold and a release with the fault injected at that
// call, and then judges the outcome in etcd, never from the library's own
// report:
//   - holders: a lock call that returns held has a key that etcd counts
//     among the holders (never more than the limit);
//   - nothing left: once a call returned without the lock, and once every
//     late request has been applied, no key of the actor's leases is under
//     the lock's prefix; after the release, none either;
//   - tokens: H's, A's and the last holder's tokens strictly increase;
//   - no stranded waiter: once the lock is free, the actor holds within
//     one TTL (the bound is 2 × (TTL + 1 s));
//   - Done: it stays open while the key and the lease are there, and
//     closes once they are gone (within 2 × 2 s), or once keep-alives went
//     silent, before the lease can expire;
//   - bookkeeping: at most maxBookkeeping keys on each of the actor's
//     leases besides lock keys, nothing under the lock's parent but the
//     lock's keys, and etcd's concurrency.Mutex takes the parent once the
//     lock is free; after every case, no goroutine of the library is left.
//
// Each case is named kind/call/fault. ETCDLOCK_MATRIX_LONG=1 runs the
// sweep: every case at the first three occurrences of its call, three
// times over. Under -short, each call and fault runs on one kind only
// (shortMatrix).

// matrixTTL is the actor's lease TTL: the bound of a stranded wait, and of
// Done after keep-alives went silent.
const matrixTTL = 3 * time.Second

// A matrixKind is a kind of lock in the matrix.
type matrixKind struct {
	name string
	// actor returns the lock under test on the seam's client: s is its
	// Session, nil for Lead, which makes its own.
	actor func(t *testing.T, client *clientv3.Client, s *etcdlock.Session, name string, sm *seam) actor
	// blocker, middle: locks of healthy clients that hold (H) and wait
	// (M, C, B) beside the actor.
	blocker, other func(s *etcdlock.Session, name string) famLock
	calls          []call
	// renew: the actor's Session is made WithRenewal, and goes on with a
	// new lease after a fault takes its lease away.
	renew bool
}

var txnFaults = []fault{faultLost, faultDropped, faultLate, faultDeleted, faultRevoked}

var matrix = []matrixKind{
	{"Mutex", famActor(openMutex), openMutex, openMutex, lockCalls(true, callCheck), false},
	{"RWMutex write", famActor(openWriter), openWriter, openWriter, lockCalls(true, callCheck), false},
	{"RWMutex read", famActor(openReader), openWriter, openWriter, lockCalls(true, callCheck), false},
	{"Semaphore", famActor(openSemaphore(2)), blockSemaphore(2), openSemaphore(2), lockCalls(true, callPromote), false},
	// Its second name is nested under the first: both keys lie under the
	// lock's prefix, where the cases look for what is left behind, and the
	// holders and waiters block it through the first.
	{"MultiMutex", famActor(openMulti), openMutex, openMutex, lockCalls(true, callCheck), false},
	{"Do", doActor, openMutex, openMutex, lockCalls(false, callCheck), false},
	// Every call of a Mutex, with the Session renewing behind the faults
	// that take its lease; and the renewal's grant (its lease revoked by
	// hand as the acquisition begins). renew_test.go has the renewal's
	// other seams (a revoke of the new lease as it is granted).
	{"Mutex renewing", famActor(openMutex), openMutex, openMutex, append([]call{callGrant}, lockCalls(true, callCheck)...), true},
	// Lead closes its Session as it returns: the revoke deletes the key,
	// and no release is retried in the background.
	{"Lead", leadActor, openMutex, openMutex, slices.DeleteFunc(append([]call{callGrant}, lockCalls(false, callCheck)...),
		func(c call) bool { return c == callBackground }), true},
}

// lockCalls lists the calls of an acquisition, a hold and a release: with
// the tries, or without (Do and Lead have none); extra is the kind's own.
func lockCalls(tries bool, extra call) []call {
	calls := []call{callEnqueue, callRequeue}
	if tries {
		calls = append(calls, callTry, callTryRead)
	}
	return append(calls, callRead, extra, callCleanup, callRelease, callBackground,
		callWatch, callOwnWatch, callLossWatch, callKeepAlive, callLossRead)
}

// faultsOf lists the faults a call can suffer.
func faultsOf(c call) []fault {
	switch c {
	case callGrant:
		return []fault{faultLost, faultDropped, faultLate}
	case callWatch, callOwnWatch, callLossWatch:
		return []fault{faultLagging, faultEvent, faultDeleted, faultRevoked}
	case callKeepAlive:
		return []fault{faultLost, faultDropped, faultDeleted, faultRevoked}
	}
	return txnFaults
}

// nthOf is the occurrence of a call that a case faults: a try's is the
// one after the lock came free, which puts our key.
func nthOf(c call) int {
	switch c {
	case callTry, callTryRead:
		return 2
	case callKeepAlive:
		return 2 // one acknowledged first, so that there is a last one
	}
	return 1
}

func TestFaultMatrix(t *testing.T) {
	// Not parallel with other tests: its cases time their faults, and run
	// 16 at a time already.
	srv, healthy := startServer(t)
	goroutines := runtime.NumGoroutine()
	rounds, nths := 1, []int{0}
	if faultsFor(t, "ETCDLOCK_MATRIX_LONG", 0) > 0 {
		rounds, nths = 3, []int{1, 2, 3}
	}
	// In the quick suite, each call and fault runs on one kind of lock, the kinds
	// taking turns from one call and fault to the next: every seam and every
	// fault still runs, on every kind, in a sixth of the time.
	var only map[string]bool
	if !testflags.Long() && rounds == 1 {
		only = shortMatrix()
	}
	// The cases spend most of their time waiting for etcd and for timers:
	// run many at once.
	slots := make(chan struct{}, 16)
	var wg sync.WaitGroup
	var mu sync.Mutex
	counts := make(map[string]int)
	for round := range rounds {
		for _, k := range matrix {
			for _, c := range k.calls {
				for _, f := range faultsOf(c) {
					for _, nth := range nths {
						name := fmt.Sprintf("%s/%s/%s", k.name, c, f)
						if only != nil && !only[name] {
							continue
						}
						if nth > 0 {
							name += fmt.Sprintf("/%d/round%d", nth, round)
						} else {
							nth = nthOf(c)
						}
						slots <- struct{}{}
						wg.Go(func() {
							defer func() { <-slots }()
							t.Run(name, func(t *testing.T) {
								mc := &matrixCase{t: t, kind: k, at: c, fault: f, nth: nth, sweep: len(nths) > 1}
								mc.run(srv, healthy)
								mu.Lock()
								counts[k.name]++
								mu.Unlock()
							})
						})
					}
				}
			}
		}
	}
	wg.Wait()
	t.Logf("cases run: %v", counts)
	// Every case closed its Sessions and clients: what they started is gone.
	var left []string
	ctxg, cancelg := context.WithTimeout(context.Background(), testTimeout)
	defer cancelg()
	if waitUntil(ctxg, func() bool { left = libraryGoroutines(); return len(left) == 0 }) != nil {
		t.Errorf("goroutines of the library left after every case ended: %d\n%s", len(left), strings.Join(left, "\n\n"))
	}
	t.Logf("goroutines: %d before the cases, %d after (the server's and the healthy client's), none of the library's", goroutines, runtime.NumGoroutine())
	if only != nil {
		t.Logf("-short: each call and fault on one kind (%d cases); go test without -short runs every kind", len(only))
	}
}

// shortMatrix returns the cases (kind/call/fault) of the -short run: for
// each call and fault, one of the kinds that make that call, in turn.
func shortMatrix() map[string]bool {
	type pair struct{ c, f string }
	var order []pair
	kindsOf := make(map[pair][]string)
	for _, k := range matrix {
		for _, c := range k.calls {
			for _, f := range faultsOf(c) {
				p := pair{fmt.Sprint(c), fmt.Sprint(f)}
				if _, ok := kindsOf[p]; !ok {
					order = append(order, p)
				}
				kindsOf[p] = append(kindsOf[p], k.name)
			}
		}
	}
	only := make(map[string]bool, len(order))
	for i, p := range order {
		ks := kindsOf[p]
		only[fmt.Sprintf("%s/%s/%s", ks[i%len(ks)], p.c, p.f)] = true
	}
	return only
}

// A matrixCase is one case of the matrix.
type matrixCase struct {
	t     *testing.T
	kind  matrixKind
	at    call
	fault fault
	nth   int
	sweep bool // a later occurrence may not come: not a failure

	healthy *clientv3.Client
	parent  string // a name of the case's own, whose queue holds the lock's
	name    string // the lock's: parent/lock
	sm      *seam
	session *etcdlock.Session // the actor's; nil for Lead
	tokens  []int64           // of the holds, in the order they began
	// returned is set once the acquisition under test has returned (for
	// Do and Lead: once f runs). A watch of our key opened before it is the
	// wait's own watch, even where our key already holds (a wait's watch
	// opened late, on a loaded machine); only one opened after can be the
	// loss watch's. Do and Lead ask for their loss signal just before f
	// runs: its watch waits for returned (holder).
	returned atomic.Bool
}

// leases returns the actor's leases: every lease granted through its
// client, for Lead and a renewing Session.
func (mc *matrixCase) leases() []clientv3.LeaseID {
	if mc.session != nil && !mc.kind.renew {
		return []clientv3.LeaseID{mc.session.Lease()}
	}
	return mc.sm.granted()
}

// actorKeys returns the actor's keys under the lock's prefix.
func (mc *matrixCase) actorKeys(ctx context.Context) ([]string, error) {
	resp, err := mc.healthy.Get(ctx, mc.name+"/", clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	leases := mc.leases()
	var keys []string
	for _, kv := range resp.Kvs {
		if slices.Contains(leases, clientv3.LeaseID(kv.Lease)) {
			keys = append(keys, string(kv.Key))
		}
	}
	return keys, nil
}

// hand deletes the actor's keys, or revokes its leases: an operator, or
// the expiry of the lease, between two calls.
func (mc *matrixCase) hand(f fault) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if f == faultRevoked {
		for _, id := range mc.leases() {
			_, _ = mc.healthy.Revoke(ctx, id)
		}
		return
	}
	keys, err := mc.actorKeys(ctx)
	if err != nil {
		mc.t.Errorf("read the actor's keys: %v", err)
	}
	for _, k := range keys {
		_, _ = mc.healthy.Delete(ctx, k)
	}
}

// removes reports whether the case's fault takes the actor's key or lease
// away at some point: a hold may then be lost.
func (mc *matrixCase) removes() bool {
	switch {
	case mc.fault == faultDeleted, mc.fault == faultRevoked:
		return true
	case mc.at == callKeepAlive:
		return true // lost and dropped: keep-alives go silent
	case mc.at == callOwnWatch && mc.fault == faultEvent, mc.at == callLossWatch && mc.fault == faultEvent:
		return true // the case deletes the key, and the watch loses the event
	}
	return false
}

// stranded is the longest a waiter may take to hold once the lock is free:
// one TTL, the period of its safety read, with 2× slack.
var stranded = 2 * (matrixTTL + time.Second)

func (mc *matrixCase) run(srv *etcdtest.Server, healthy *clientv3.Client) {
	t := mc.t
	mc.healthy, mc.parent = healthy, lockName(t)
	mc.name = mc.parent + "/lock"
	mc.sm = newSeam(mc.at, mc.fault, mc.nth)
	mc.sm.hand = mc.hand
	mc.sm.holder = mc.holder
	client := serverClient(t, srv, mc.sm.unary, mc.sm.stream)
	// Late requests are applied before the client closes, and after the
	// Session: a renewal's grant applied late waits for the Session's end.
	t.Cleanup(mc.sm.late.Wait)
	if mc.kind.name != "Lead" {
		opts := []etcdlock.SessionOption{etcdlock.WithTTL(matrixTTL)}
		if mc.kind.renew {
			opts = append(opts, etcdlock.WithRenewal())
		}
		mc.session = newSession(t, client, opts...)
	}
	ctx := testContext(t)

	// Warm-up, with no fault: the actor holds and releases once (a Mutex's
	// key then has an earlier incarnation in etcd's history), and H holds,
	// releases and holds again (so has H's, for a Mutex).
	warm := mc.kind.actor(t, client, mc.session, mc.name, mc.sm)
	if ok, err := warm.acquire(ctx, -1); !ok {
		t.Fatalf("warm-up: acquire: %v", err)
	}
	if err := warm.release(ctx); err != nil {
		t.Fatalf("warm-up: release: %v", err)
	}
	// A member that lags serves the wait's watch from before H's earlier
	// release (and after the actor's); the watches of our own key, from
	// before the actor's earlier release.
	mc.sm.lagFrom = map[call]int64{callWatch: revision(t, healthy) + 1, callOwnWatch: firstWrite, callLossWatch: firstWrite}
	h := mc.kind.blocker(newSession(t, healthy), mc.name)
	mustLock(t, h)
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	mustLock(t, h)
	mc.tokens = append(mc.tokens, h.Token())
	hHeld := true
	var freeAt time.Time
	releaseH := func() {
		if hHeld {
			hHeld = false
			if err := h.Unlock(ctx); err != nil {
				t.Errorf("H's unlock: %v", err)
			}
			freeAt = time.Now()
		}
	}
	defer releaseH()

	// M waits between H and the actor, so that the actor reads its place
	// when M goes; it holds only an instant. A Semaphore's waiter (its
	// kind's calls have the promote) reads its place, watches its own key
	// and promotes only with NearHead waiters ahead of it: nearer the head
	// it counts its turn from the queue's events. So many M's wait then.
	var mDone []<-chan error
	ahead := 0
	switch {
	case slices.Contains(mc.kind.calls, callPromote) && (mc.at == callRead || mc.at == callPromote || mc.at == callOwnWatch):
		ahead = queue.NearHead
	case mc.at == callRead:
		ahead = 1
	}
	for range ahead {
		mDone = append(mDone, mc.queue(ctx, mc.kind.other(newSession(t, healthy), mc.name), true))
	}

	a := mc.kind.actor(t, client, mc.session, mc.name, mc.sm)
	actx, acancel := context.WithCancel(ctx)
	defer acancel()
	mc.sm.enter(phaseAcquire, acancel)
	if mc.at == callCheck {
		mc.sm.setBump(func() { _, _ = healthy.Put(context.Background(), mc.parent+"-bump", "") })
	}
	if mc.at == callGrant && mc.session != nil {
		// A renewing Session grants a lease only after it lost one: its
		// lease goes as the acquisition begins, and the renewal's grant is
		// the call under test; the acquisition waits for the next lease.
		mc.hand(faultRevoked)
		eventually(t, "the renewal's grant", func() bool { return mc.sm.fires() > 0 })
	}

	var held bool
	var err error
	switch mc.at {
	case callTry, callTryRead:
		for range 2 {
			if held, err = a.acquire(actx, 0); held || err != nil {
				break
			}
		}
		if !held && err == nil {
			releaseH()
			held, err = a.acquire(actx, 0)
		}
	case callCleanup:
		held, err = a.acquire(actx, 400*time.Millisecond)
	default:
		held, err = mc.contend(actx, a, releaseH)
	}
	acquired := time.Now()
	mc.returned.Store(true)
	mc.sm.setBump(nil)
	var key string
	var token int64
	var done <-chan struct{}
	if held {
		// Judged at once, before H goes: a hold beside H's is two holders.
		key, token, done = a.hold()
		mc.judge(ctx, key, token)
		mc.tokens = append(mc.tokens, token)
	}
	releaseH()
	for _, done := range mDone {
		if err := waitErr(t, done); err != nil {
			t.Errorf("M: %v", err)
		}
	}
	if !held {
		mc.sm.settle()
		// The cleanup of a failed acquisition is bounded (500 ms), and
		// retried in the background once the bound runs out, as on a
		// loaded machine: the keys must go, within a few TTLs.
		// TestFamilyCancelAfterApply checks that they go at once.
		mc.noActorKeys(true, "after the acquisition returned without the lock (%v)", err)
	} else {
		if !freeAt.IsZero() && acquired.Sub(freeAt) > stranded && !mc.removes() {
			t.Errorf("the actor held %v after the lock came free: want at most %v", acquired.Sub(freeAt).Round(time.Millisecond), stranded)
		}
		mc.holdAndRelease(ctx, a, key, token, done)
	}
	releaseH()
	mc.sm.settle()
	mc.noActorKeys(true, "after the release")

	// The lock is free: B takes it at once, with a newer token.
	b := mc.kind.other(newSession(t, healthy), mc.name)
	if ok, err := b.TryLock(ctx, stranded); !ok {
		keys, _ := mc.actorKeys(ctx)
		queue, _ := etcdlock.Inspect(context.Background(), healthy, mc.name)
		t.Fatalf("B could not take the free lock: %v (the actor's keys: %v; the queue: %+v)", err, keys, queue)
	}
	mc.tokens = append(mc.tokens, b.Token())
	if err := b.Unlock(ctx); err != nil {
		t.Errorf("B's unlock: %v", err)
	}
	if !slices.IsSorted(mc.tokens) || len(slices.Compact(slices.Clone(mc.tokens))) != len(mc.tokens) {
		t.Errorf("tokens of successive holders do not strictly increase: %v", mc.tokens)
	}
	mc.bookkeeping(ctx)
	if mc.sm.fires() == 0 && !mc.sweep {
		t.Fatalf("the fault never fired: no %s call was made", mc.at)
	}
}

// libraryGoroutines returns the stacks of the goroutines that run code of
// the library (the root package or internal/queue), not of its tests.
func libraryGoroutines() []string {
	buf := make([]byte, 4<<20)
	var left []string
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "github.com/etcdlock/etcdlock.") || strings.Contains(g, "github.com/etcdlock/etcdlock/internal/queue.") {
			left = append(left, g)
		}
	}
	return left
}

// bookkeeping checks what the actor keeps in etcd besides lock keys: at
// most maxBookkeeping keys on each of its leases, and nothing where another
// lock counts it: under the lock's parent there are only the lock's keys,
// and when there are none, etcd's concurrency.Mutex takes the parent.
func (mc *matrixCase) bookkeeping(ctx context.Context) {
	t := mc.t
	for _, id := range mc.leases() {
		resp, err := mc.healthy.TimeToLive(ctx, id, clientv3.WithAttachedKeys())
		if err != nil || resp.TTL < 0 {
			continue // gone, and its keys with it
		}
		var other []string
		for _, k := range resp.Keys {
			if !strings.HasPrefix(string(k), mc.name+"/") {
				other = append(other, string(k))
			}
		}
		if len(other) > maxBookkeeping {
			t.Errorf("lease %x keeps %d keys besides lock keys, want ≤ %d: %q", id, len(other), maxBookkeeping, other)
		}
	}
	keys := lockKeys(t, mc.healthy, mc.parent)
	for _, k := range keys {
		if !strings.HasPrefix(k, mc.name+"/") {
			t.Errorf("key %q lies under the lock's parent %q, outside the lock", k, mc.parent)
		}
	}
	if len(keys) > 0 {
		return
	}
	up := concurrency.NewMutex(newUpstreamSession(t, mc.healthy, int(matrixTTL/time.Second)), mc.parent)
	if err := up.TryLock(ctx); err != nil {
		t.Errorf("concurrency.Mutex(%q).TryLock with nothing under it: got %v, want nil", mc.parent, err)
		return
	}
	if err := up.Unlock(ctx); err != nil {
		t.Errorf("concurrency.Mutex(%q).Unlock: %v", mc.parent, err)
	}
}

// queue starts l's lock in a goroutine, waits until its key is in etcd, and
// returns the lock's result; with instant, it unlocks as soon as it holds.
func (mc *matrixCase) queue(ctx context.Context, l famLock, instant bool) <-chan error {
	t := mc.t
	before := len(lockKeys(t, mc.healthy, mc.name))
	done := make(chan error, 1)
	release := make(chan struct{})
	go func() {
		err := l.Lock(ctx)
		if err == nil {
			if !instant {
				select {
				case <-release:
				case <-ctx.Done():
				}
			}
			err = l.Unlock(context.WithoutCancel(ctx))
		}
		done <- err
	}()
	if !instant {
		t.Cleanup(func() { close(release); <-done })
	}
	eventually(t, "the waiter queued", func() bool { return len(lockKeys(t, mc.healthy, mc.name)) > before })
	return done
}

// contend runs the actor's acquisition while H holds, with what the call
// under test needs, then releases H; it returns the acquisition's result,
// without releasing H if it came before.
func (mc *matrixCase) contend(ctx context.Context, a actor, releaseH func()) (bool, error) {
	t := mc.t
	type result struct {
		held bool
		err  error
	}
	res := make(chan result, 1)
	go func() {
		held, err := a.acquire(ctx, -1)
		res <- result{held, err}
	}()
	var r *result
	wait := func(cond func() bool) {
		deadline := time.Now().Add(stranded)
		for r == nil && !cond() && time.Now().Before(deadline) {
			select {
			case got := <-res:
				r = &got
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	queued := func() bool { keys, _ := mc.actorKeys(ctx); return len(keys) > 0 }
	wait(queued)
	switch {
	case mc.at == callRequeue:
		mc.hand(faultDeleted)
		wait(func() bool { return mc.sm.fires() > 0 })
	case mc.at == callOwnWatch:
		time.Sleep(300 * time.Millisecond) // the own watch starts after 100 ms
		if mc.fault == faultEvent {
			mc.hand(faultDeleted)
			wait(func() bool { return mc.sm.fires() > 0 })
			wait(queued)
		}
	case mc.at == callPromote:
		mc.queue(ctx, mc.kind.other(newSession(t, mc.healthy), mc.name), false)
	case mc.at == callCheck:
		// The check follows the wait's watch, which may come after a read
		// of the place (a MultiMutex's, whose nested key fills the
		// enqueue's window): H still holds when it is made.
		wait(func() bool { return mc.sm.fires() > 0 })
	case mc.at == callWatch:
		// The wait's watch is open: give a lagging member time to deliver.
		wait(func() bool { return mc.sm.fires() > 0 })
		time.Sleep(200 * time.Millisecond)
	}
	if r == nil {
		select {
		case got := <-res:
			r = &got
		default:
		}
	}
	if r != nil {
		// Returned while H holds: judged before H goes.
		return r.held, r.err
	}
	releaseH()
	if r == nil {
		select {
		case got := <-res:
			r = &got
		case <-time.After(testTimeout):
			t.Fatal("the actor's acquisition never returned")
		}
	}
	return r.held, r.err
}

// holdAndRelease holds the actor's hold as the call under test needs,
// checks Done against etcd, and releases it.
func (mc *matrixCase) holdAndRelease(ctx context.Context, a actor, key string, token int64, done <-chan struct{}) {
	t := mc.t
	mc.sm.enter(phaseHold, nil)
	if key == "" {
		key = mc.keyOf(ctx, token)
	}
	gone := mc.follow(key, token)
	switch {
	case mc.at == callLossRead:
		// The safety re-read comes a TTL after Done was asked for.
		// A late read is given up by the loss watch first: only then is
		// it queued, to be applied before settle.
		wctx, cancel := context.WithTimeout(ctx, time.Duration(mc.nth+1)*matrixTTL)
		_ = waitUntil(wctx, func() bool {
			return mc.sm.fires() > 0 && (mc.fault != faultLate || mc.sm.lateQueued() > 0)
		})
		cancel()
		if mc.sm.fires() == 0 {
			// The sweep's later read may not come: a watch that sees a
			// delete first ends the hold. Outside the sweep, the case
			// fails below.
			break
		}
		if mc.removes() {
			mc.closesAfter(done, gone, 4*time.Second)
			break
		}
		// A read that failed tells nothing: the hold goes on.
		time.Sleep(300 * time.Millisecond)
		if isClosed(done) && !isClosed(gone.ch) {
			if quiet := mc.sm.silence(time.Now()); quiet < matrixTTL*2/3 {
				t.Errorf("Done closed after the %s fault on %s, with etcd still holding the key and its lease", mc.fault, mc.at)
			}
		}
	case mc.at == callLossWatch && mc.fault == faultEvent:
		fired := func() bool { return mc.sm.fires() > 0 || isClosed(done) }
		if mc.sweep {
			// A later occurrence may come only with the deletion.
			wctx, cancel := context.WithTimeout(ctx, time.Second)
			_ = waitUntil(wctx, fired)
			cancel()
		} else {
			eventually(t, "the loss watch", fired)
		}
		mc.hand(faultDeleted)
		mc.closesAfter(done, gone, stranded)
	case mc.removes() && (mc.at == callLossWatch || mc.at == callKeepAlive) && mc.firesWithin(ctx, matrixTTL+time.Second):
		closedAt := closeTime(done)
		select {
		case <-done:
		case <-time.After(3 * matrixTTL):
			t.Fatalf("Done did not close within %v of the %s fault on %s", 3*matrixTTL, mc.fault, mc.at)
		}
		if mc.fault == faultDeleted || mc.fault == faultRevoked {
			mc.closesAfter(done, gone, 4*time.Second)
			break
		}
		// Keep-alives silent: Done closes before etcd can expire the lease.
		select {
		case <-gone.ch:
			if at := closedAt(); !at.IsZero() && gone.time().Before(at) {
				t.Errorf("Done closed %v after etcd deleted the key", at.Sub(gone.time()).Round(time.Millisecond))
			}
		case <-time.After(testTimeout):
			t.Error("etcd kept the key of a lease no longer kept alive")
		}
	default:
		closedAt := closeTime(done)
		time.Sleep(300 * time.Millisecond)
		if at := closedAt(); !at.IsZero() && (!isClosed(gone.ch) || at.Before(gone.time())) {
			// The early warning: keep-alives silent for 2/3 of the TTL, as
			// etcd's replies show (a loaded machine can delay them), is a
			// loss signal the contract gives while the lease still lives.
			if quiet := mc.sm.silence(at); mc.sweep && mc.removes() && mc.sm.fires() > 0 {
				t.Logf("Done closed after the %s fault on %s, which came after the wait for it", mc.fault, mc.at)
			} else if quiet >= matrixTTL*2/3 {
				t.Logf("Done closed while etcd still had the key, after %v without a keep-alive acknowledgement: the early warning", quiet.Round(time.Millisecond))
			} else {
				t.Errorf("Done closed while etcd still had the key %s (token %d) and its lease; the last keep-alive acknowledgement came %v before", key, token, quiet.Round(time.Millisecond))
			}
		}
	}
	mc.sm.enter(phaseRelease, nil)
	if err := a.release(ctx); err != nil && !mc.removes() && mc.at != callRelease && mc.at != callBackground {
		t.Errorf("release: %v", err)
	}
}

// firesWithin reports whether the fault fires within d: at once outside the
// sweep, where it must; in the sweep, a later occurrence of a call may never
// come (a loss watch opens a second watch only after the first failed, or
// for a key outside its prefix),
// and the case then checks a hold with no fault.
func (mc *matrixCase) firesWithin(ctx context.Context, d time.Duration) bool {
	if !mc.sweep {
		return true
	}
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return waitUntil(wctx, func() bool { return mc.sm.fires() > 0 }) == nil
}

// judge checks in etcd that the actor's key with token is among the
// holders: else two hold at once.
func (mc *matrixCase) judge(ctx context.Context, key string, token int64) {
	t := mc.t
	entries, err := etcdlock.Inspect(ctx, mc.healthy, mc.name)
	if err != nil {
		t.Fatalf("inspect: %v", err)
	}
	for _, e := range entries {
		if e.Token == token && (key == "" || e.Key == key) {
			if !e.Holds {
				t.Errorf("two holders: the actor returned holding %s (token %d), which etcd counts as waiting: %+v", e.Key, token, entries)
			}
			return
		}
	}
	if !mc.removes() {
		t.Errorf("the actor returned holding token %d, whose key is not in etcd: %+v", token, entries)
	}
}

// keyOf returns the key of the lock with create revision token.
func (mc *matrixCase) keyOf(ctx context.Context, token int64) string {
	entries, err := etcdlock.Inspect(ctx, mc.healthy, mc.name)
	if err != nil {
		mc.t.Fatalf("inspect: %v", err)
	}
	for _, e := range entries {
		if e.Token == token {
			return e.Key
		}
	}
	return ""
}

// A keyWatch closes ch when etcd deletes a key, and records when.
type keyWatch struct {
	ch   chan struct{}
	mu   sync.Mutex
	when time.Time
}

func (g *keyWatch) time() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.when
}

// follow watches, on the healthy client, the actor's key from its creation
// until etcd deletes it.
func (mc *matrixCase) follow(key string, token int64) *keyWatch {
	g := &keyWatch{ch: make(chan struct{})}
	if key == "" {
		g.when = time.Now()
		close(g.ch)
		return g
	}
	ctx, cancel := context.WithCancel(context.Background())
	wch := mc.healthy.Watch(ctx, key, clientv3.WithRev(token+1), clientv3.WithFilterPut())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for wr := range wch {
			if len(wr.Events) > 0 {
				g.mu.Lock()
				g.when = time.Now()
				g.mu.Unlock()
				close(g.ch)
				return
			}
		}
	}()
	mc.t.Cleanup(func() { cancel(); <-stopped })
	return g
}

// closesAfter checks that done closes within bound of etcd deleting the key.
func (mc *matrixCase) closesAfter(done <-chan struct{}, gone *keyWatch, bound time.Duration) {
	t := mc.t
	select {
	case <-gone.ch:
	case <-time.After(testTimeout):
		t.Fatal("etcd never deleted the actor's key")
	}
	if d, ok := closedWithin(done, bound); !ok {
		t.Errorf("Done still open %v after etcd deleted the key", d.Round(time.Millisecond))
	}
}

// noActorKeys checks that no key of the actor's leases is under the lock's
// prefix: at once, or within a few seconds where a background retry or an
// expiry may do the delete (eventual).
func (mc *matrixCase) noActorKeys(eventual bool, format string, args ...any) {
	t := mc.t
	t.Helper()
	ctx := testContext(t)
	bound := time.Duration(0)
	if eventual || mc.removes() {
		bound = 3 * matrixTTL
	}
	deadline := time.Now().Add(bound)
	for {
		keys, err := mc.actorKeys(ctx)
		if err != nil {
			t.Fatalf("read the actor's keys: %v", err)
		}
		if len(keys) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%v: the actor's keys are left in etcd: %v", fmt.Sprintf(format, args...), keys)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// holder reports whether key is among the lock's holders in etcd; with
// prefix, whether a holder's key begins with it.
func (mc *matrixCase) holder(key string, prefix bool) bool {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	name := mc.name
	if mc.kind.name == "MultiMutex" && strings.Contains(key, mc.name+multiNested+"/") {
		name += multiNested // the queue of its second name (openMulti)
	}
	entries, err := etcdlock.Inspect(ctx, mc.healthy, name)
	if err != nil {
		return false
	}
	// key is as the client sent it: on an external etcd, under the test's
	// prefix, which Inspect's keys are not. A prefix shared by the keys of
	// a hold is at least the lock's name.
	match := func(e etcdlock.QueueEntry) bool {
		if !prefix {
			return strings.HasSuffix(key, e.Key)
		}
		for i := range len(key) - len(mc.name) + 1 {
			if strings.HasPrefix(e.Key, key[i:]) {
				return true
			}
		}
		return false
	}
	i := slices.IndexFunc(entries, func(e etcdlock.QueueEntry) bool { return e.Holds && match(e) })
	if i < 0 {
		return false
	}
	if !slices.Contains(mc.leases(), entries[i].Lease) {
		return true // another's hold: a wait's watch of the key ahead
	}
	// Our key holds: a loss watch once the acquisition has returned, else
	// the wait's. Do's and Lead's loss watch starts as they return: wait a
	// little for it.
	wctx, wcancel := context.WithTimeout(ctx, time.Second)
	defer wcancel()
	return waitUntil(wctx, mc.returned.Load) == nil
}
