package etcdlock_test

// The chaos test's workers (chaos_test.go): each one process with its own
// client and proxy, that locks, writes what it guards with its token, is
// cut off and frozen, and records every hold for the checks.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
)

// chaosWorker is one process: its own client, through its own proxy, and a
// Session it replaces when it ends.
type chaosWorker struct {
	run    *chaosRun
	id     int
	client *clientv3.Client
	proxy  *etcdtest.Proxy
	rng    *rand.Rand
	reg    *register
	s      *etcdlock.Session

	// A keep-alive channel of the test's own on the lease of the holds: it
	// gets each acknowledgement as the Session does.
	stopAcks func()
	acks     sync.WaitGroup
	ackMu    sync.Mutex
	lastAck  time.Time
	ended    time.Time // the Session's Done closed
}

func (w *chaosWorker) loop(ctx context.Context) {
	r := w.run
	defer w.endSession()
	for ctx.Err() == nil {
		if w.s == nil || isClosed(w.s.Done()) {
			w.endSession()
			s, err := etcdlock.NewSession(w.client, etcdlock.WithTTL(r.cfg.ttl))
			if err != nil {
				r.add(&r.counts.lockErrors, 1)
				time.Sleep(50 * time.Millisecond)
				continue
			}
			w.s = s
			w.watchAcks()
			r.add(&r.counts.sessions, 1)
		}
		h, err := w.lock(ctx)
		switch {
		case err == nil:
			w.critical(ctx, h)
		case errors.Is(err, errWaitRanOut):
			r.add(&r.counts.tryFalse, 1)
		case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
			r.add(&r.counts.cancels, 1)
		default:
			r.add(&r.counts.lockErrors, 1)
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// watchAcks follows the Session's end and, unless the kind holds on
// Sessions of its own, the keep-alive acknowledgements of its lease.
func (w *chaosWorker) watchAcks() {
	if w.run.kind.ownSession {
		return // followed hold by hold
	}
	s := w.s
	w.stopAcks = w.followLease(s.Lease())
	w.acks.Go(func() {
		<-s.Done() // closed by endSession at the latest
		w.ackMu.Lock()
		w.ended = time.Now()
		w.ackMu.Unlock()
	})
}

// followLease follows the keep-alive acknowledgements of lease into
// lastAck until the function it returns is called; nil if it cannot. For a
// kind that holds on Sessions of its own, the end of the lease's keep-alive
// is the end of the hold's Session.
func (w *chaosWorker) followLease(lease clientv3.LeaseID) func() {
	w.ackMu.Lock()
	w.lastAck, w.ended = time.Time{}, time.Time{}
	w.ackMu.Unlock()
	var end func(time.Time)
	if w.run.kind.ownSession {
		end = func(at time.Time) {
			w.ackMu.Lock()
			w.ended = at
			w.ackMu.Unlock()
		}
	}
	stop, err := followAcks(w.client, lease, func(at time.Time) {
		w.ackMu.Lock()
		w.lastAck = at
		w.ackMu.Unlock()
	}, end)
	if err != nil {
		return nil
	}
	return stop
}

// endSession closes the Session, if any, and stops following its lease.
func (w *chaosWorker) endSession() {
	if w.s == nil {
		return
	}
	_ = w.s.Close()
	w.s = nil
	if w.stopAcks != nil {
		w.stopAcks()
		w.stopAcks = nil
	}
	w.acks.Wait()
}

// lock takes a hold in one of several ways, some with a random deadline
// once the warm-up is over.
func (w *chaosWorker) lock(ctx context.Context) (*hold, error) {
	n := w.rng.IntN(10)
	if !w.run.faulty.Load() {
		n = 9
	}
	deadline, wait := 5*time.Second, time.Duration(-1)
	switch {
	case n < 2:
		deadline = time.Duration(w.rng.IntN(20000)) * time.Microsecond
	case n < 4:
		wait = time.Duration(w.rng.IntN(50)) * time.Millisecond
	}
	cctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	return w.reg.acquire(cctx, w.run.kind.make(w.s, w.run.name, wait))
}

// enter records a hold entering the critical section, and the pairs it
// makes with the holds already inside.
func (r *chaosRun) enter(h *chaosHold, acquired time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.acqTimes = append(r.acqTimes, acquired)
	r.holds = append(r.holds, h)
	for o := range r.inside {
		p := chaosPair{older: o, newer: h}
		if h.token < o.token {
			p = chaosPair{older: h, newer: o}
		}
		p.older.older = true
		r.pairs = append(r.pairs, p)
	}
	if len(r.inside) > 0 {
		r.counts.overlaps++
	}
	r.inside[h] = true
}

// leave records a hold leaving the critical section, and reports whether it
// was the older of a pair of holds inside at once.
func (r *chaosRun) leave(h *chaosHold) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.inside, h)
	return h.older
}

// critical reads both counters, waits a little, writes them plus one and
// releases. It may be the one that is cut off.
func (w *chaosWorker) critical(ctx context.Context, h *hold) {
	r := w.run
	r.add(&r.counts.acquisitions, 1)
	ch := &chaosHold{worker: w.id, token: h.token, isOwner: h.isOwner, lease: h.lease}
	stopAcks := func() {}
	if r.kind.ownSession {
		if stop := w.followLease(h.lease); stop != nil {
			stopAcks = stop // before the release, whose revoke would end the lease's keep-alive
		}
	}
	r.enter(ch, time.Unix(0, h.acquired))
	r.bg.Go(func() {
		<-h.done // closed, at the latest, by the release
		r.mu.Lock()
		ch.doneAt = time.Now()
		r.mu.Unlock()
	})
	defer func() {
		// Left the critical section; still holding, if the hold was not
		// lost. The fate of an older hold is read before the release,
		// which would delete the key.
		if r.leave(ch) {
			ch.fate = r.fate(ch)
		}
		stopAcks()
		_, _ = w.reg.release(ctx, h)
	}()

	ev, res, first, err := w.reg.read(ctx, h)
	switch {
	case err != nil:
		r.fail(fmt.Errorf("worker %d: %w", w.id, err))
		return
	case res == resRejected:
		r.add(&r.counts.fencedEtcd, 1)
		return
	case res != resOK:
		return
	case !first:
		r.add(&r.counts.notOldest, 1)
	}
	sv, ok := r.store.read(h.token)
	if !ok {
		r.add(&r.counts.fencedStore, 1)
		return
	}
	time.Sleep(time.Duration(w.rng.IntN(2000)) * time.Microsecond)

	if isClosed(h.done) {
		// Done closed: stop touching the resources. Was the hold lost?
		r.add(&r.counts.doneSkips, 1)
		if w.stillOwner(ctx, h) {
			r.add(&r.counts.doneSpurious, 1)
		}
		return
	}
	var p *chaosPartition
	if r.freezeReq.CompareAndSwap(true, false) {
		// The worst moment to pause: Done was checked, the write is next.
		r.freezing.Store(true)
		defer r.freezing.Store(false)
		ch.frozen = true
		p = w.cutOff(ch, h.done)
	}
	wres := w.writeEtcd(ctx, h, ev+1)
	sres := writeRejected
	if i := r.store.write(h.token, sv+1); i >= 0 {
		sres = writeAcked
		r.mu.Lock()
		r.ackedStore = append(r.ackedStore, i)
		r.mu.Unlock()
		r.add(&r.counts.ackedStore, 1)
	} else {
		r.add(&r.counts.fencedStore, 1)
	}
	if p != nil {
		p.etcd, p.store = wres, sres
	}
}

// cutOff cuts the worker off from etcd, as if its process were paused,
// for at least TTL + 1.5 s, and then until its key is gone from etcd and a
// newer holder has read the store, so that the write that follows is
// stale. It gives up after testTimeout more.
func (w *chaosWorker) cutOff(h *chaosHold, done <-chan struct{}) *chaosPartition {
	r := w.run
	w.ackMu.Lock()
	lastAck := w.lastAck
	w.ackMu.Unlock()
	w.proxy.Blackhole()
	defer w.proxy.Unblackhole()
	p := &chaosPartition{hold: h, cut: time.Now(), lastAck: lastAck}
	r.mu.Lock()
	r.partitions = append(r.partitions, p)
	r.mu.Unlock()

	least := p.cut.Add(r.cfg.ttl + 1500*time.Millisecond)
	deadline := least.Add(testTimeout)
	for {
		now := time.Now()
		if now.After(least) {
			if r.keyGone(h) && r.store.seen() > h.token {
				break
			}
			p.extended = true
		}
		if now.After(deadline) {
			r.fail(fmt.Errorf("worker %d cut off for %v: got its hold still in etcd or no newer holder, want the lock taken by another",
				w.id, now.Sub(p.cut).Round(time.Second)))
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.wake, p.doneSeen = time.Now(), isClosed(done)
	w.ackMu.Lock()
	if w.ended.After(p.cut) {
		p.ended = w.ended
	}
	w.ackMu.Unlock()
	r.fault("partition", p.cut, p.wake)
	return p
}

// keyGone reports whether the hold's key is gone from etcd; false when etcd
// does not answer.
func (r *chaosRun) keyGone(h *chaosHold) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := r.observer.Txn(ctx).If(h.isOwner).Commit()
	return err == nil && !resp.Succeeded
}

// fate asks etcd, through the observer, what became of a hold: still held,
// or gone, and then whether with its lease.
func (r *chaosRun) fate(h *chaosHold) holdFate {
	deadline := time.Now().Add(testTimeout)
	ask := func(f func(context.Context) error) bool {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := f(ctx)
			cancel()
			if err == nil {
				return true
			}
			if time.Now().After(deadline) {
				r.fail(fmt.Errorf("fate of hold %d: etcd did not answer: %w", h.token, err))
				return false
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	var held bool
	if !ask(func(ctx context.Context) error {
		resp, err := r.observer.Txn(ctx).If(h.isOwner).Commit()
		if err == nil {
			held = resp.Succeeded
		}
		return err
	}) {
		return fateUnknown
	}
	if held {
		return fateHeld
	}
	// A lease past its expiry is revoked together with its keys, so a lease
	// still there with our key gone means the key was deleted by someone.
	var leaseAlive bool
	if !ask(func(ctx context.Context) error {
		resp, err := r.observer.TimeToLive(ctx, h.lease)
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			return nil
		case err != nil:
			return err
		}
		leaseAlive = resp.TTL >= 0
		return nil
	}) {
		return fateUnknown
	}
	if leaseAlive {
		return fateKeyDeleted
	}
	return fateExpired
}

// writeEtcd writes v to the etcd counter, guarded by IsOwner with fencing,
// retrying while etcd does not answer (the cut-off holder reconnects, a
// leader is down) for up to testTimeout. A write whose reply was lost may
// have been applied; it is not counted as acknowledged, the history check
// learns from etcd whether it was, and the retry writes the same value.
func (w *chaosWorker) writeEtcd(ctx context.Context, h *hold, v int64) writeResult {
	r := w.run
	deadline := time.Now().Add(testTimeout)
	for {
		rev, res := w.reg.write(context.WithoutCancel(ctx), h, v)
		switch res {
		case resOK:
			r.mu.Lock()
			r.ackedRevs = append(r.ackedRevs, rev)
			r.mu.Unlock()
			r.add(&r.counts.ackedEtcd, 1)
			return writeAcked
		case resRejected:
			r.add(&r.counts.fencedEtcd, 1)
			return writeRejected
		case resConflict:
			return writeConflict
		}
		if time.Now().After(deadline) {
			r.fail(fmt.Errorf("worker %d: counter write unanswered for %v", w.id, testTimeout))
			return writeUnknown
		}
		r.add(&r.counts.retriedEtcd, 1)
		time.Sleep(50 * time.Millisecond)
	}
}

// stillOwner reports whether the hold's IsOwner still holds in etcd.
func (w *chaosWorker) stillOwner(ctx context.Context, h *hold) bool {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := w.client.Txn(cctx).If(h.isOwner).Commit()
	return err == nil && resp.Succeeded
}
