package etcdlock

import (
	"context"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// closedDone is the channel Done returns when nothing is held.
var closedDone = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// A keyHold is one hold of a key in etcd, from its acquisition to its
// release: the key, whose create revision is the fencing token, and the loss
// signal, whose channel closes when the hold ends or is lost.
type keyHold struct {
	t     *ticket   // our key
	since time.Time // when the hold began

	mu       sync.Mutex
	callCtx  context.Context // the call's that acquired the hold, for its events (Event.Context)
	done     chan struct{}
	signaled bool
	ended    bool // released: its end is not a loss
	watched  bool // the term's loss watch watches it (losswatch.go): lost was called
	gone     bool // the loss watch found the hold lost before its end
	capped   bool // the loss watch ended the hold at its cap (maxhold.go)
	// lostFor is why the loss watch found the hold lost, and lostLive
	// whether the lease term still lived then; set with gone.
	lostFor  LossReason
	lostLive bool
	// lossTold: HoldLost was emitted, by the loss's report or, if the
	// holder ended the hold first, by its end, which must come after it.
	lossTold bool
	// waiting closes once another acquisition waits behind the hold
	// (waiting.go); nil until asked for. stopWaiting stops its watch.
	waiting     chan struct{}
	stopWaiting context.CancelFunc
	capTimer    *time.Timer        // tells the loss watch of the cap; nil without one
	stopDrop    context.CancelFunc // stops the delete of a capped hold's key; nil until it starts
}

// newHold begins a hold of t's key.
func (t *ticket) newHold() *keyHold {
	h := &keyHold{t: t, since: time.Now(), done: make(chan struct{})}
	if t.maxHold > 0 {
		h.lost() // the loss watch enforces the cap
	}
	return h
}

// acquired records ctx as the context of the call that acquired the hold.
func (h *keyHold) acquired(ctx context.Context) {
	h.mu.Lock()
	h.callCtx = ctx
	h.mu.Unlock()
}

// acquiredBy returns the context of the call that acquired the hold.
func (h *keyHold) acquiredBy() context.Context {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.callCtx
}

// again returns a new hold of the same key: a local hand-off keeps the key
// and token but gives the next goroutine a loss signal of its own.
func (h *keyHold) again() *keyHold { return h.t.newHold() }

// Hold is one hold, as a snapshot taken at one moment; Done and IsOwner
// follow the hold after it. The zero Hold describes no hold.
type Hold struct {
	Name  string           // the lock's name; a MultiMutex's names, sorted, joined by commas
	Key   string           // our key; a MultiMutex's first name's (Keys has them all)
	Token int64            // the fencing token: the create revision of our key (every key of a MultiMutex's hold shares it)
	Lease clientv3.LeaseID // our key's lease, the Session's at the acquisition: a key f puts with it goes when that lease does

	h *keyHold // the hold, for Done; nil in the zero Hold
}

// Done returns this hold's loss signal, as Mutex.Done does.
func (h Hold) Done() <-chan struct{} {
	if h.h == nil {
		return closedDone
	}
	return h.h.lost()
}

// IsOwner returns a Txn comparison true only while Key lasts (for a
// MultiMutex's other keys, compare their CreateRevision to Token).
func (h Hold) IsOwner() clientv3.Cmp { return ownerCmp(h.Key, h.Token) }

// Keys returns every key of the hold: Key, or a MultiMutex's, one per name.
func (h Hold) Keys() []string {
	if h.h == nil {
		return nil
	}
	return h.h.t.Keys()
}

// ownerCmp returns a comparison for a clientv3 Txn that is true only while
// key exists with create revision rev; with rev 0 (nothing held), one that is
// always false.
func ownerCmp(key string, rev int64) clientv3.Cmp {
	if key == "" || rev == 0 {
		// No key has a negative create revision.
		key, rev = "\x00etcdlock/not-held", -1
	}
	return clientv3.Compare(clientv3.CreateRevision(key), "=", rev)
}

// snapshot returns the hold as a Hold of the lock name.
func (h *keyHold) snapshot(name string) Hold {
	return Hold{Name: name, Key: h.keyOf(name), Token: h.token(), Lease: h.t.term.id, h: h}
}

// keyOf returns the hold's key in the queue of the lock name: for a
// MultiMutex's hold seen through a Mutex of one of its names, that name's
// key; otherwise (and for the MultiMutex itself) the ticket's first key.
func (h *keyHold) keyOf(name string) string {
	if h.t.kind == KindMulti {
		key := mutexKey(name, h.t.term.id)
		if slices.Contains(h.t.Keys(), key) {
			return key
		}
	}
	return h.t.Key()
}

// token returns the hold's fencing token.
func (h *keyHold) token() int64 { return h.t.Rev() }

// knownLost reports whether the hold is known to be lost: its loss signal
// closed for a loss (not for its end), or the lease term of its key ended.
// A hold whose loss signal nobody asked for is known lost only by its term.
func (h *keyHold) knownLost() bool {
	h.mu.Lock()
	gone := h.gone
	h.mu.Unlock()
	return gone || h.t.term.Expired()
}

// end is called when the hold is released: it closes the channel and stops
// watching for its loss. A loss found after this is no loss. It reports
// whether this call ended the hold (false: it had ended already).
func (h *keyHold) end() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended {
		return false
	}
	h.ended = true
	if !h.signaled {
		h.signaled = true
		close(h.done)
	}
	if h.watched {
		h.t.term.loss.remove(h)
	}
	if h.capTimer != nil {
		h.capTimer.Stop()
	}
	if h.stopDrop != nil {
		h.stopDrop()
	}
	if h.stopWaiting != nil {
		h.stopWaiting()
	}
	return true
}

// over reports whether the hold was released (end was called).
func (h *keyHold) over() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ended
}

// lost returns the hold's loss signal for our key; on the first call, the
// term's loss watch (losswatch.go) begins to watch the hold.
//
// The channel closes:
//   - within about 100 ms of our key being deleted, by anyone, or of the
//     lease being revoked (which deletes the key);
//   - two thirds of the TTL after the last keep-alive that etcd
//     acknowledged was sent, before etcd can expire the lease however late
//     the reply came; never while etcd answers the keep-alives (sent every
//     TTL/4) within 5/12 of the TTL;
//   - when the Session ends, and when the hold ends.
func (h *keyHold) lost() <-chan struct{} {
	tm := h.t.term
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.watched && !h.signaled {
		h.watched = true
		if !tm.loss.add(tm, h, h.t.s.goBackground) {
			h.signaled = true
			close(h.done)
			return h.done
		}
		h.capTimer = capTimer(h.since, h.t.maxHold, func() { tm.loss.capReached(h) })
	}
	return h.done
}

// lossKeys returns our keys, for the loss watch.
func (h *keyHold) lossKeys() []string { return h.t.Keys() }

// lossToken returns our keys' create revision, for the loss watch.
func (h *keyHold) lossToken() int64 { return h.token() }

// signal closes the channel for a loss the loss watch found, and reports
// whether it is a loss: the hold had not ended. Closing the channel and
// deciding that it is a loss happen at once: an end (release) is either
// before both or after both.
func (h *keyHold) signal(why LossReason) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.capTimer != nil {
		h.capTimer.Stop()
	}
	if h.ended || h.gone {
		return false // ended, or its loss was reported already
	}
	h.gone = true
	h.capped = why == LossMaxHold
	h.lostFor, h.lostLive = why, !h.t.term.Expired()
	if !h.signaled {
		h.signaled = true
		close(h.done)
	}
	return true
}

// report tells the observers of the loss, then deletes the key of a hold
// capped, until the holder's unlock ends the hold (whose delete then does
// the work) or the lease term ends (which deletes the key).
func (h *keyHold) report(why LossReason, leaseGone func() bool) {
	t := h.t
	if s := t.s; s.events != nil {
		h.mu.Lock()
		live := h.lostLive
		h.mu.Unlock()
		reason := h.lossReason(why, live, leaseGone)
		h.mu.Lock()
		h.tellLoss(reason)
		h.mu.Unlock()
	}
	if why != LossMaxHold {
		return
	}
	ctx, cancel := context.WithCancel(t.term.ctx())
	defer cancel()
	h.mu.Lock()
	ended := h.ended
	if !ended {
		h.stopDrop = cancel
	}
	h.mu.Unlock()
	if !ended {
		dropCapped(ctx, t)
	}
}

// tellLoss emits HoldLost for the hold, with reason, unless it was
// emitted already. Called with h.mu held.
func (h *keyHold) tellLoss(reason LossReason) {
	if h.lossTold {
		return
	}
	h.lossTold = true
	t := h.t
	t.s.events.emit(Event{Kind: HoldLost, Context: h.callCtx, Lock: t.lock, Primitive: t.kind, Lease: t.term.id, Key: t.Key(), Token: h.token(), Reason: reason})
}

// lossReason tells the observers why the hold was lost, given why the
// loss watch found it lost and whether the lease term lived then (a
// Session closed after that did not cause the loss). Silence is its own
// reason, even when the Session ended with it (the term ends a TTL after
// the last acknowledged renewal was sent). A deleted key is asked about
// once for the holds lost together, within a bound, since the revoke or
// expiry of our lease deletes it too; only observed Sessions pay that
// read. With leaseGone nil (the holder ended the hold before the read came
// back), a deleted key stays the reason.
func (h *keyHold) lossReason(why LossReason, live bool, leaseGone func() bool) LossReason {
	s, tm := h.t.s, h.t.term
	if why == LossKeepAliveSilent || why == LossMaxHold {
		return why
	}
	if why == LossKeyDeleted && live && leaseGone != nil && leaseGone() {
		return LossLeaseGone
	}
	switch {
	case live:
		return why
	case s.closedByUser():
		return LossSessionClosed
	case tm.untilSilent() <= -tm.ttl/3:
		// The term ended for silence: a whole TTL since the last
		// acknowledged renewal was sent.
		return LossKeepAliveSilent
	default:
		return LossLeaseGone
	}
}

// reportEnd reports the end of hold h: its release, or its hand-off to
// another goroutine of this process.
func (h *keyHold) reportEnd() {
	t := h.t
	if t.s.events != nil {
		h.mu.Lock()
		if h.gone && !h.lossTold {
			// Its loss's report is still asking etcd why: tell the loss
			// now, before the end, with what is known.
			h.tellLoss(h.lossReason(h.lostFor, h.lostLive, nil))
		}
		h.mu.Unlock()
		now := time.Now()
		t.s.events.emit(Event{Kind: HoldEnded, Context: h.acquiredBy(), Time: now, Lock: t.lock, Primitive: t.kind, Lease: t.term.id, Key: t.Key(), Token: t.Rev(), HeldFor: now.Sub(h.since)})
	}
}

// unlock releases the key of the hold (ended already): it returns nil when it
// was deleted, ErrSessionExpired or ErrLockLost when it was already gone, and
// etcd's error, wrapped, when etcd did not confirm the delete; the delete is
// then retried in the background, and then runs after it. Otherwise then
// runs before unlock returns.
func (h *keyHold) unlock(ctx context.Context, then func()) error {
	t := h.t
	h.reportEnd()
	if t.term.Expired() {
		t.released(false, nil)
		if then != nil {
			then()
		}
		return ErrSessionExpired
	}
	deleted, err := t.release(ctx, unlockTimeout)
	t.released(deleted, err)
	if err != nil {
		t.releaseLater(err, then)
		return errorf("unlock", t.lock, err)
	}
	if then != nil {
		then()
	}
	h.mu.Lock()
	capped := h.capped
	h.mu.Unlock()
	if !deleted || capped {
		// A hold capped before its end is lost, whichever delete came first.
		if t.term.Expired() {
			return ErrSessionExpired
		}
		return ErrLockLost
	}
	return nil
}
