package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/queue"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// The fault matrix of the calls for the people on call (release.go,
// maxhold.go, waiting.go, lockdelay.go), of CheckFence (fence.go) and of a
// Semaphore's limit (limit.go): each call, each fault it can suffer, injected by a
// seam (seams_test.go) on the client that makes it, and judged in etcd: whose
// keys are there, with which tokens, and who holds.
//
// The seam names each call as it names the lock's own: Release's fenced
// delete and a capped hold's delete are the first delete of the hold phase
// (callRelease); Waiting's read is a Txn of reads only (callTryRead); its
// watch, a watch from a revision of a key that is not a holder's
// (callOwnWatch). Lock-delay's read at our key's revision is callHistory,
// its question about a lease callLeaseTTL.

// An oncallCall is one etcd call of the on-call features, and how a case
// runs it.
type oncallCall struct {
	name   string
	seamAt call // how the seam names the call
	faults []fault
	run    func(oc *oncallCase)
}

var oncallCalls = []oncallCall{
	{"release", callRelease, txnFaults, (*oncallCase).release},
	{"cap-delete", callRelease, txnFaults, (*oncallCase).capDelete},
	{"waiting-read", callTryRead, []fault{faultLost, faultDropped, faultLate}, (*oncallCase).waitingRead},
	{"waiting-watch", callOwnWatch, []fault{faultLagging, faultEvent, faultDeleted, faultRevoked}, (*oncallCase).waitingWatch},
	{"lock-delay-read", callHistory, []fault{faultLost, faultDropped, faultLate}, (*oncallCase).lockDelay},
	{"lock-delay-lease", callLeaseTTL, []fault{faultLost, faultDropped, faultLate}, (*oncallCase).lockDelay},
	{"check-fence", callQueueRead, []fault{faultLost, faultDropped, faultLate}, (*oncallCase).checkFence},
	{"check-fence-permit", callQueueRead, []fault{faultLost, faultDropped, faultLate}, (*oncallCase).checkFencePermit},
	{"check-fence-permit-record", callHistory, []fault{faultLost, faultDropped, faultLate}, (*oncallCase).checkFencePermit},
	{"read-limit", callQueueRead, []fault{faultLost, faultDropped, faultLate}, (*oncallCase).readLimit},
	{"set-limit", callSetLimit, txnFaults, (*oncallCase).setLimit},
	{"set-limit-read", callQueueRead, []fault{faultLost, faultDropped, faultLate}, (*oncallCase).setLimit},
	{"set-limit-first", callSetLimit, txnFaults, (*oncallCase).setLimitFirst},
	{"limit-touch", callWatch, []fault{faultLagging, faultEvent}, (*oncallCase).limitTouch},
	{"early-watch", callWatch, []fault{faultLagging, faultEvent}, (*oncallCase).earlyWatch},
	{"limit-watch", callLimitWatch, []fault{faultLagging, faultEvent}, (*oncallCase).limitWatch},
}

// oncallCap is the cap of the capped holds of the cases.
const oncallCap = 500 * time.Millisecond

func TestOnCallFaultMatrix(t *testing.T) {
	testflags.Parallel(t)
	srv, healthy := startServer(t)
	for _, c := range oncallCalls {
		for _, f := range c.faults {
			t.Run(fmt.Sprintf("%s/%s", c.name, f), func(t *testing.T) {
				t.Parallel()
				oc := &oncallCase{t: t, srv: srv, healthy: healthy, name: lockName(t), sm: newSeam(c.seamAt, f, 1)}
				oc.sm.lagFrom = map[call]int64{callOwnWatch: firstWrite, callWatch: firstWrite, callLimitWatch: firstWrite}
				t.Cleanup(oc.sm.late.Wait)
				c.run(oc)
			})
		}
	}
}

// An oncallCase is one case: the seam, and the holder and waiter it sets up.
type oncallCase struct {
	t       *testing.T
	srv     *etcdtest.Server
	healthy *clientv3.Client
	name    string
	sm      *seam

	holder  *etcdlock.Session
	m       *etcdlock.Mutex
	held    etcdlock.QueueEntry // the holder's key, as etcd has it
	waiter  *worker
	waitKey *clientv3.GetResponse // the waiter's key, as etcd had it once queued
}

// hold takes the lock on a Session of client (with opts), and has the seam
// act on the holder's key or lease by hand.
func (oc *oncallCase) hold(client *clientv3.Client, opts ...etcdlock.SessionOption) {
	t := oc.t
	oc.holder = newSession(t, client, append([]etcdlock.SessionOption{etcdlock.WithTTL(matrixTTL)}, opts...)...)
	oc.m = etcdlock.NewMutex(oc.holder, oc.name)
	if err := oc.m.LockContext(testContext(t)); err != nil {
		t.Fatalf("lock: %v", err)
	}
	oc.held = entryOf(t, oc.healthy, oc.name, oc.holder.Lease())
	oc.sm.hand = func(f fault) {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		if f == faultRevoked {
			_, _ = oc.healthy.Revoke(ctx, oc.holder.Lease())
			return
		}
		_, _ = oc.healthy.Delete(ctx, oc.held.Key)
	}
}

// queueWaiter queues a Mutex of a healthy client behind the holder, and
// records its key.
func (oc *oncallCase) queueWaiter() {
	t := oc.t
	s := newSession(t, oc.healthy)
	oc.waiter = lockInGoroutine(t, testContext(t), oursOn(s, oc.name))
	key := keyOf(oc.name, s.Lease())
	eventually(t, "the waiter's key", func() bool { return slices.Contains(lockKeys(t, oc.healthy, oc.name), key) })
	resp, err := oc.healthy.Get(testContext(t), key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the waiter's key: %v, %v", resp, err)
	}
	oc.waitKey = resp
}

// waiterIntact fails the case unless the waiter's key is in etcd as it was
// put (the same create revision): no fault made anyone delete it.
func (oc *oncallCase) waiterIntact() {
	t := oc.t
	t.Helper()
	oc.sm.settle()
	kv := oc.waitKey.Kvs[0]
	resp, err := oc.healthy.Get(testContext(t), string(kv.Key))
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != kv.CreateRevision {
		t.Fatalf("the waiter's key %s@%d: got %v, %v; want it untouched", kv.Key, kv.CreateRevision, resp, err)
	}
}

// holderGone waits until etcd has no key of the holder's lease in the queue,
// and the waiter holds.
func (oc *oncallCase) holderGone(what string) {
	t := oc.t
	t.Helper()
	eventually(t, what, func() bool { return len(keysOfLease(t, oc.healthy, oc.name, oc.holder.Lease())) == 0 })
	if err := waitErr(t, oc.waiter.locked); err != nil {
		t.Fatalf("the waiter, once the holder's key is gone: %v", err)
	}
}

// unlockLost fails the case unless the holder's unlock says that its key
// was gone: ErrLockLost, or ErrSessionExpired where its lease was revoked
// and the Session has seen it.
func (oc *oncallCase) unlockLost() {
	t := oc.t
	t.Helper()
	err := oc.m.UnlockContext(testContext(t))
	if !errors.Is(err, etcdlock.ErrLockLost) && !(oc.sm.fault == faultRevoked && errors.Is(err, etcdlock.ErrSessionExpired)) {
		t.Fatalf("the holder's unlock: got %v, want ErrLockLost", err)
	}
}

// release: an operator's Release, faulted on the operator's client.
func (oc *oncallCase) release() {
	t := oc.t
	oc.hold(oc.healthy)
	done := oc.m.Done()
	oc.queueWaiter()
	op := serverClient(t, oc.srv, oc.sm.unary, oc.sm.stream)
	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	oc.sm.enter(phaseHold, cancel)
	err := etcdlock.Release(ctx, op, oc.name, oc.held)
	if oc.sm.fires() != 1 {
		t.Fatalf("the fault fired %d times, want once", oc.sm.fires())
	}
	again := func() error { return etcdlock.Release(testContext(t), op, oc.name, oc.held) }
	switch oc.sm.fault {
	case faultLost:
		if err == nil || errors.Is(err, etcdlock.ErrNotHeld) {
			t.Fatalf("Release, its reply lost: got %v, want etcd's error", err)
		}
		oc.holderGone("the holder's key gone, the reply lost")
		if err := again(); !errors.Is(err, etcdlock.ErrNotHeld) {
			t.Fatalf("Release again: got %v, want ErrNotHeld", err)
		}
	case faultDropped:
		if err == nil || errors.Is(err, etcdlock.ErrNotHeld) {
			t.Fatalf("Release, dropped: got %v, want etcd's error", err)
		}
		if keys := keysOfLease(t, oc.healthy, oc.name, oc.holder.Lease()); len(keys) != 1 {
			t.Fatalf("the holder's key after a dropped Release: got %v, want it there", keys)
		}
		if isClosed(done) {
			t.Fatalf("Done closed after a dropped Release")
		}
		if err := again(); err != nil {
			t.Fatalf("Release again: got %v, want nil", err)
		}
		oc.holderGone("the holder's key gone, released again")
	case faultLate:
		if err == nil {
			t.Fatalf("Release, late: got nil, want the context's error")
		}
		// Before the late Txn applies: the holder unlocks and queues again
		// behind the waiter, with a new key on the same lease.
		if err := oc.m.UnlockContext(testContext(t)); err != nil {
			t.Fatalf("the holder's unlock before the late Release: %v", err)
		}
		relock := lockInGoroutine(t, testContext(t), ours{oc.m})
		if err := waitErr(t, oc.waiter.locked); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the holder's new key", func() bool { return len(keysOfLease(t, oc.healthy, oc.name, oc.holder.Lease())) == 1 })
		oc.waiterIntact()
		again := entryOf(t, oc.healthy, oc.name, oc.holder.Lease())
		if again.Token == oc.held.Token {
			t.Fatalf("the holder's key: token %d, want a new one", again.Token)
		}
		if err := oc.waiter.Release(); err != nil {
			t.Fatal(err)
		}
		if err := waitErr(t, relock.locked); err != nil {
			t.Fatalf("the holder's new hold, after the late Release: %v", err)
		}
		return
	case faultDeleted, faultRevoked:
		if !errors.Is(err, etcdlock.ErrNotHeld) {
			t.Fatalf("Release of a key gone: got %v, want ErrNotHeld", err)
		}
		oc.holderGone("the holder's key gone by hand")
	}
	if _, ok := closedWithin(done, doneBound); !ok {
		t.Fatalf("the holder's Done open %v after its key went", doneBound)
	}
	oc.unlockLost()
	oc.waiterIntact()
}

// capDelete: a capped hold's delete, faulted on the holder's client.
func (oc *oncallCase) capDelete() {
	t := oc.t
	client := serverClient(t, oc.srv, oc.sm.unary, oc.sm.stream)
	oc.hold(client, etcdlock.WithMaxHold(oncallCap))
	done := oc.m.Done()
	oc.sm.enter(phaseHold, nil)
	oc.queueWaiter()
	if _, ok := closedWithin(done, oncallCap+doneBound); !ok {
		t.Fatalf("Done open %v after a hold capped at %v", oncallCap+doneBound, oncallCap)
	}
	// Where the delete failed, its retry in the background deletes the key;
	// a late one times out first (3 s).
	oc.holderGone("the capped hold's key gone")
	if oc.sm.fires() != 1 {
		t.Fatalf("the fault fired %d times, want once", oc.sm.fires())
	}
	oc.unlockLost()
	oc.waiterIntact()
}

// askWaiting takes the lock on the seam's client, asks for its Waiting
// signal, and returns it once the fault has fired.
func (oc *oncallCase) askWaiting() <-chan struct{} {
	t := oc.t
	oc.hold(serverClient(t, oc.srv, oc.sm.unary, oc.sm.stream))
	h, _ := oc.m.Held()
	oc.sm.enter(phaseHold, nil)
	waiting := h.Waiting()
	eventually(t, "the fault", func() bool { return oc.sm.fires() == 1 })
	return waiting
}

// checkFence: CheckFence's read of the queue, faulted on the checker's
// client. While the hold holds in etcd it answers nil or an error, never
// lost; once etcd has deleted the key, lost; it writes nothing, and leaves
// nothing on any lease. (Its read through a member that lags:
// TestCheckFenceLaggingMember.)
func (oc *oncallCase) checkFence() {
	t := oc.t
	oc.hold(oc.healthy)
	h, _ := oc.m.Held()
	f := h.Fence()
	checker := serverClient(t, oc.srv, oc.sm.unary, oc.sm.stream)
	rev := revision(t, oc.healthy)
	ctx, cancel := context.WithTimeout(testContext(t), 2*time.Second)
	oc.sm.enter(phaseHold, cancel)
	err := etcdlock.CheckFence(ctx, checker, f)
	cancel()
	if errors.Is(err, etcdlock.ErrLockLost) {
		t.Fatalf("CheckFence of a hold that etcd has: got %v, want nil or another error", err)
	}
	t.Logf("CheckFence, faulted: %v", err)
	if oc.sm.fires() != 1 {
		t.Fatalf("the fault fired %d times, want once", oc.sm.fires())
	}
	oc.sm.settle()
	for _, w := range wroteSince(t, oc.healthy, rev) { // the other cases share the server
		if strings.Contains(w, `"`+oc.name+"/") {
			t.Fatalf("CheckFence wrote %s", w)
		}
	}
	if err := etcdlock.CheckFence(testContext(t), checker, f); err != nil {
		t.Fatalf("CheckFence once healthy: got %v, want nil", err)
	}
	if _, err := oc.healthy.Delete(testContext(t), f.Key); err != nil {
		t.Fatal(err)
	}
	if err := etcdlock.CheckFence(testContext(t), checker, f); !errors.Is(err, etcdlock.ErrLockLost) {
		t.Fatalf("CheckFence after the key's delete: got %v, want ErrLockLost", err)
	}
	oc.unlockLost()
	if keys := keysOfLease(t, oc.healthy, oc.name, oc.holder.Lease()); len(keys) != 0 {
		t.Fatalf("keys of the holder's lease: got %v, want none", keys)
	}
}

// waitingRead: Waiting's read of the queue, faulted: it is read again, and
// Waiting closes once a waiter queues, not before.
func (oc *oncallCase) waitingRead() {
	t := oc.t
	waiting := oc.askWaiting()
	if isClosed(waiting) {
		t.Fatalf("Waiting closed with nobody waiting")
	}
	oc.queueWaiter()
	if _, ok := closedWithin(waiting, 2*(3*time.Second+doneBound)); !ok {
		t.Fatalf("Waiting open with a waiter in the queue")
	}
	if n := queueWaiters(t, testContext(t), oc.healthy, oc.name); n != 1 {
		t.Fatalf("waiters in etcd: got %d, want 1", n)
	}
	if err := oc.m.UnlockContext(testContext(t)); err != nil {
		t.Fatal(err)
	}
	oc.waiterIntact()
}

// waitingWatch: Waiting's watch of the queue, faulted. Served from an old
// revision, it does not close for the old puts it replays; its event lost, a
// read per TTL finds the waiter; the holder's key or lease gone by hand, it
// does not close when another takes the lock, and stops.
func (oc *oncallCase) waitingWatch() {
	t := oc.t
	waiting := oc.askWaiting()
	if _, closed := closedWithin(waiting, 300*time.Millisecond); closed {
		t.Fatalf("Waiting closed with nobody waiting")
	}
	oc.queueWaiter()
	switch oc.sm.fault {
	case faultDeleted, faultRevoked:
		// The waiter holds at once: nobody waits.
		if err := waitErr(t, oc.waiter.locked); err != nil {
			t.Fatal(err)
		}
		if _, closed := closedWithin(waiting, 300*time.Millisecond); closed {
			t.Fatalf("Waiting closed when another took the lock the holder lost")
		}
		_ = oc.m.UnlockContext(testContext(t))
		oc.waiterIntact()
		return
	}
	bound := doneBound
	if oc.sm.fault == faultEvent {
		bound = 2 * (matrixTTL + time.Second) // the read per TTL
	}
	if _, ok := closedWithin(waiting, bound); !ok {
		t.Fatalf("Waiting open %v with a waiter in the queue", bound)
	}
	if err := oc.m.UnlockContext(testContext(t)); err != nil {
		t.Fatal(err)
	}
	oc.waiterIntact()
}

// lockDelay: lock-delay's read of the queue, or its question about the
// holder's lease, faulted, after a clean unlock. A reply lost or a request
// dropped is retried by the client (the seam sits below its retries); one
// that never comes back in time leaves it unable to tell, so it delays; the
// waiter holds, as etcd shows.
func (oc *oncallCase) lockDelay() {
	t := oc.t
	const d = 300 * time.Millisecond
	oc.hold(oc.healthy)
	client := serverClient(t, oc.srv, oc.sm.unary, oc.sm.stream)
	ws := newSession(t, client, etcdlock.WithTTL(matrixTTL), etcdlock.WithLockDelay(d))
	waiter := lockInGoroutine(t, testContext(t), oursOn(ws, oc.name))
	eventually(t, "the waiter queued", func() bool { return len(lockKeys(t, oc.healthy, oc.name)) == 2 })
	oc.sm.enter(phaseHold, nil)
	start := time.Now()
	if err := oc.m.UnlockContext(testContext(t)); err != nil {
		t.Fatal(err)
	}
	if err := waitErr(t, waiter.locked); err != nil {
		t.Fatalf("the waiter: %v", err)
	}
	if took := time.Since(start); oc.sm.fault == faultLate && took < d {
		t.Fatalf("the waiter returned %v after the unlock, where it could not tell: want the delay %v", took, d)
	}
	if oc.sm.fires() != 1 {
		t.Fatalf("the fault fired %d times, want once", oc.sm.fires())
	}
	if e := inspect(t, testContext(t), oc.healthy, oc.name); len(e) != 1 || e[0].Lease != ws.Lease() || !e[0].Holds {
		t.Fatalf("the queue: got %+v, want the waiter holding", e)
	}
	if err := waiter.Release(); err != nil {
		t.Fatal(err)
	}
}

// setLimit: SetLimit's read or its guarded write, faulted, lowering limit 2
// to 1 under two holders and a waiter; faultDeleted and faultRevoked end the
// first holder just before the write, which admits the waiter. Whatever the
// fault, etcd ends with no record or the right one: every permit that holds
// keeps holding (the admitted waiter too: a record that kept only the holders
// read would take its permit back), and a healthy SetLimit then settles it.
func (oc *oncallCase) setLimit() {
	t := oc.t
	ctx := testContext(t)
	const limit = 2
	sem := func() *etcdlock.Semaphore {
		return etcdlock.NewSemaphore(newSession(t, oc.healthy, etcdlock.WithTTL(matrixTTL)), oc.name, limit)
	}
	var holders []*etcdlock.Permit
	for range limit {
		p, err := sem().Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		holders = append(holders, p)
	}
	waiter := acquireInGoroutine(ctx, sem())
	eventually(t, "the waiter's key", func() bool { return len(lockKeys(t, oc.healthy, oc.name)) == limit+1 })
	oc.sm.hand = func(fault) { release(t, holders[0]) }
	setter := serverClient(t, oc.srv, oc.sm.unary, oc.sm.stream)
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	oc.sm.enter(phaseHold, cancel)
	err := etcdlock.SetLimit(sctx, setter, oc.name, 1)
	cancel()
	t.Logf("SetLimit, faulted: %v", err)
	if oc.sm.fires() != 1 {
		t.Fatalf("the fault fired %d times, want once", oc.sm.fires())
	}
	oc.sm.settle()

	held, ended := holders, oc.sm.fault == faultDeleted || oc.sm.fault == faultRevoked
	if ended {
		held = []*etcdlock.Permit{holders[1], admitted(t, waiter)}
	}
	if err := etcdlock.SetLimit(testContext(t), oc.healthy, oc.name, 1); err != nil {
		t.Fatalf("SetLimit once healthy: %v", err)
	}
	if n, err := etcdlock.ReadLimit(testContext(t), oc.healthy, oc.name); err != nil || n != 1 {
		t.Fatalf("ReadLimit: got %d, %v, want 1", n, err)
	}
	for _, p := range held {
		if err := etcdlock.CheckFence(testContext(t), oc.healthy, p.Fence()); err != nil {
			t.Fatalf("a permit that held before SetLimit, after it: %v (record %q)", err, limitRecord(t, oc.healthy, oc.name))
		}
	}
	for _, p := range held {
		release(t, p)
	}
	if !ended {
		p := admitted(t, waiter) // every kept permit gone: the waiter fits
		release(t, p)
	}
	if keys := lockKeys(t, oc.healthy, oc.name); len(keys) != 0 {
		t.Fatalf("keys left: %q", keys)
	}
}

// setLimitFirst: SetLimit's write of a name's first limit record, faulted,
// raising the limit of a lone holder made with limit 1 to 2, while the queue
// empties and fills with Semaphores made with limit 3: three hold and a
// fourth waits, counting its turn with its own limit. faultDeleted and
// faultRevoked bring them just before the write; the other faults just after
// SetLimit returns (faultLate: before its write is applied, a second after
// the caller gave up). A record that lands must keep whoever holds by the
// rule when it lands: judged in etcd, every permit Acquire returned holds by
// the rule (keys and record read in one Txn) from then on, each waiter is
// admitted once the rule says it holds, and a healthy SetLimit settles it.
func (oc *oncallCase) setLimitFirst() {
	t := oc.t
	ctx := testContext(t)
	sem := func(limit int) *etcdlock.Semaphore {
		return etcdlock.NewSemaphore(newSession(t, oc.healthy, etcdlock.WithTTL(matrixTTL)), oc.name, limit)
	}
	first, err := sem(1).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var comers []<-chan permitResult
	churn := func() {
		release(t, first)
		for range 4 {
			comers = append(comers, acquireInGoroutine(ctx, sem(3)))
			n := len(comers)
			eventually(t, "a newcomer's key", func() bool { return len(lockKeys(t, oc.healthy, oc.name)) == n })
		}
	}
	oc.sm.hand = func(fault) { churn() }
	setter := serverClient(t, oc.srv, oc.sm.unary, oc.sm.stream)
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	oc.sm.enter(phaseHold, cancel)
	err = etcdlock.SetLimit(sctx, setter, oc.name, 2)
	cancel()
	t.Logf("SetLimit, faulted: %v (record %q)", err, limitRecord(t, oc.healthy, oc.name))
	if oc.sm.fires() != 1 {
		t.Fatalf("the fault fired %d times, want once", oc.sm.fires())
	}
	if comers == nil {
		churn()
	}
	var held []*etcdlock.Permit
	// admit takes the permits whose Acquire has returned, and fails the case
	// if one does not hold by the rule in etcd; it reports whether every
	// key that holds by the rule is one of them.
	admit := func() bool {
		for i, ch := range comers {
			select {
			case r := <-ch:
				if r.err != nil {
					t.Fatalf("a newcomer's Acquire: %v", r.err)
				}
				held, comers[i] = append(held, r.p), nil
			default:
			}
		}
		holders, _ := permitsInEtcd(t, oc.healthy, oc.name, 3)
		for _, p := range held {
			if !slices.Contains(holders, p.Key()) {
				t.Fatalf("%s: Acquire returned it, and it waits by the rule in etcd: holders %q, record %q", p.Key(), holders, limitRecord(t, oc.healthy, oc.name))
			}
		}
		return len(holders) == len(held)
	}
	admit()
	oc.sm.settle()
	eventually(t, "every holder by the rule admitted", admit)
	if err := etcdlock.SetLimit(testContext(t), oc.healthy, oc.name, 2); err != nil {
		t.Fatalf("SetLimit once healthy: %v", err)
	}
	if n, err := etcdlock.ReadLimit(testContext(t), oc.healthy, oc.name); err != nil || n != 2 {
		t.Fatalf("ReadLimit: got %d, %v, want 2", n, err)
	}
	// Release the holders one at a time: once no holder is left, no key
	// is (the oldest key always holds).
	for {
		eventually(t, "every holder by the rule admitted", admit)
		if len(held) == 0 {
			break
		}
		release(t, held[0])
		held = held[1:]
	}
	if keys := lockKeys(t, oc.healthy, oc.name); len(keys) != 0 {
		t.Fatalf("keys left: %q", keys)
	}
}

// limitTouch: the watch of a Semaphore's waiter near the head, which counts
// its turn from the queue's events, served by a member that lags (it
// delivers what the waiter's read saw: an earlier holder's put and delete)
// or losing its first events (the raise's touch of the waiter's key): the
// waiter is not admitted while the holder fills the limit, and is admitted
// by the raise, at once or at its read per TTL.
func (oc *oncallCase) limitTouch() {
	oc.raiseWhileWaiting(func(ctx context.Context) error { return etcdlock.SetLimit(ctx, oc.healthy, oc.name, 2) })
}

// limitWatch: the watch of the limit record by a Semaphore's waiter near the
// head, which catches a raise whose touch missed it, served by a member that
// lags (it delivers the record's older write) or losing its first events: the
// waiter is not admitted by the old write, and is admitted by the raise, at
// once or at its read per TTL. The raise is written by hand, as SetLimit
// writes it but with no touch: only the record's watch can tell the waiter.
func (oc *oncallCase) limitWatch() {
	oc.raiseWhileWaiting(func(ctx context.Context) error {
		_, err := oc.healthy.Put(ctx, queue.LimitKey(oc.name), queue.Limit{N: 2}.Value())
		return err
	})
}

// raiseWhileWaiting queues a waiter on the seam's client behind a holder at
// limit 1 (recorded, and with an earlier holder's put and delete before),
// and raises the limit to 2 with raise once the seam's fault fired.
func (oc *oncallCase) raiseWhileWaiting(raise func(ctx context.Context) error) {
	t := oc.t
	ctx := testContext(t)
	oc.sm.lagFrom[callWatch] = revision(t, oc.healthy) + 1
	if err := etcdlock.SetLimit(ctx, oc.healthy, oc.name, 1); err != nil { // an older write the lagging watch replays
		t.Fatal(err)
	}
	sem := etcdlock.NewSemaphore(newSession(t, oc.healthy), oc.name, 1)
	earlier, err := sem.Acquire(ctx) // a put and a delete the lagging watch replays
	if err != nil {
		t.Fatal(err)
	}
	release(t, earlier)
	holder, err := sem.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	client := serverClient(t, oc.srv, oc.sm.unary, oc.sm.stream)
	oc.sm.enter(phaseHold, nil)
	waiter := acquireInGoroutine(ctx, etcdlock.NewSemaphore(newSession(t, client, etcdlock.WithTTL(matrixTTL)), oc.name, 1))
	oc.admittedAfter(waiter, "the raise", func() {
		if err := raise(ctx); err != nil {
			t.Fatal(err)
		}
	})
	release(t, holder)
}

// admittedAfter checks that the waiter waits while the seam's fault fires,
// and holds once act has run, at once or, if the fault lost a watch's
// events, at its read per TTL; then releases it.
func (oc *oncallCase) admittedAfter(waiter <-chan permitResult, what string, act func()) {
	t := oc.t
	t.Helper()
	eventually(t, "the fault", func() bool { return oc.sm.fires() == 1 })
	if !waiting(waiter, 300*time.Millisecond) {
		t.Fatal("the waiter got in at limit 1, under a holder")
	}
	start := time.Now()
	act()
	p := admitted(t, waiter)
	bound := doneBound
	if oc.sm.fault == faultEvent {
		bound = 2 * (matrixTTL + time.Second) // the read per TTL
	}
	checkBound(t, "the waiter admitted after "+what, time.Since(start), bound)
	if err := etcdlock.CheckFence(testContext(t), oc.healthy, p.Fence()); err != nil {
		t.Fatalf("the admitted waiter in etcd: %v", err)
	}
	release(t, p)
}

// earlyWatch: a Semaphore whose last acquisition waited near the head opens
// its next wait's watch before it enqueues; that watch served by a member
// that lags (it delivers the first wait's events again) or losing its first
// events: the waiter is not admitted while the holder fills the limit, and
// is admitted once it leaves, at once or at its read per TTL.
func (oc *oncallCase) earlyWatch() {
	t := oc.t
	ctx := testContext(t)
	oc.sm.lagFrom[callWatch] = revision(t, oc.healthy) + 1
	other := etcdlock.NewSemaphore(newSession(t, oc.healthy), oc.name, 1)
	holder, err := other.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	client := serverClient(t, oc.srv, oc.sm.unary, oc.sm.stream)
	sem := etcdlock.NewSemaphore(newSession(t, client, etcdlock.WithTTL(matrixTTL)), oc.name, 1)
	first := acquireInGoroutine(ctx, sem) // waits near the head: no fault yet
	eventually(t, "the first wait", func() bool { return len(lockKeys(t, oc.healthy, oc.name)) == 2 })
	release(t, holder)
	release(t, admitted(t, first))
	if holder, err = other.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	oc.sm.enter(phaseHold, nil)
	waiter := acquireInGoroutine(ctx, sem)
	oc.admittedAfter(waiter, "the holder left", func() { release(t, holder) })
}

// checkFencePermit: CheckFence of a Semaphore's permit reads its queue and
// then its limit record at that revision; either read faulted, it never
// answers lost while etcd has the permit holding, writes nothing, and
// answers lost once etcd deleted the key.
func (oc *oncallCase) checkFencePermit() {
	t := oc.t
	ctx := testContext(t)
	p, err := etcdlock.NewSemaphore(newSession(t, oc.healthy, etcdlock.WithTTL(matrixTTL)), oc.name, 1).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f := p.Fence()
	checker := serverClient(t, oc.srv, oc.sm.unary, oc.sm.stream)
	rev := revision(t, oc.healthy)
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	oc.sm.enter(phaseHold, cancel)
	err = etcdlock.CheckFence(cctx, checker, f)
	cancel()
	if errors.Is(err, etcdlock.ErrLockLost) {
		t.Fatalf("CheckFence of a permit etcd has: got %v, want nil or another error", err)
	}
	t.Logf("CheckFence, faulted: %v", err)
	if oc.sm.fires() != 1 {
		t.Fatalf("the fault fired %d times, want once", oc.sm.fires())
	}
	oc.sm.settle()
	for _, w := range wroteSince(t, oc.healthy, rev) {
		if strings.Contains(w, `"`+oc.name+"/") || strings.Contains(w, `"`+queue.LimitKey(oc.name)+`"`) {
			t.Fatalf("CheckFence wrote %s", w)
		}
	}
	if err := etcdlock.CheckFence(ctx, checker, f); err != nil {
		t.Fatalf("CheckFence once healthy: got %v, want nil", err)
	}
	if _, err := oc.healthy.Delete(ctx, f.Key); err != nil {
		t.Fatal(err)
	}
	if err := etcdlock.CheckFence(ctx, checker, f); !errors.Is(err, etcdlock.ErrLockLost) {
		t.Fatalf("CheckFence after the key's delete: got %v, want ErrLockLost", err)
	}
	_ = p.Release(ctx)
}

// readLimit: ReadLimit's read of the queue and the record, faulted: an
// error, or the limit etcd has (the record's, 3), never another.
func (oc *oncallCase) readLimit() {
	t := oc.t
	ctx := testContext(t)
	p, err := etcdlock.NewSemaphore(newSession(t, oc.healthy), oc.name, 2).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer release(t, p)
	if err := etcdlock.SetLimit(ctx, oc.healthy, oc.name, 3); err != nil {
		t.Fatal(err)
	}
	reader := serverClient(t, oc.srv, oc.sm.unary, oc.sm.stream)
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	oc.sm.enter(phaseHold, cancel)
	n, err := etcdlock.ReadLimit(rctx, reader, oc.name)
	cancel()
	t.Logf("ReadLimit, faulted: %d, %v", n, err)
	if err == nil && n != 3 {
		t.Fatalf("ReadLimit, faulted: got %d, want 3 or an error", n)
	}
	if oc.sm.fires() != 1 {
		t.Fatalf("the fault fired %d times, want once", oc.sm.fires())
	}
	oc.sm.settle()
	if n, err := etcdlock.ReadLimit(ctx, reader, oc.name); err != nil || n != 3 {
		t.Fatalf("ReadLimit once healthy: got %d, %v, want 3", n, err)
	}
}
