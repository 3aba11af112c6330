package etcdlock

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/etcdlock/etcdlock/internal/queue"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// closedDone is the channel Done returns when nothing is held.
var closedDone = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// lossReadTimeout bounds the read that tells a deleted key from a lease gone,
// for the observers.
const lossReadTimeout = 500 * time.Millisecond

// A keyHold is one hold of a key in etcd, from its acquisition to its
// release: the key, whose create revision is the fencing token, and the loss
// signal, whose channel closes when the hold ends or is lost.
type keyHold struct {
	t     *ticket   // our key
	since time.Time // when the hold began

	mu       sync.Mutex
	done     chan struct{}
	signaled bool
	ended    bool // released: its end is not a loss
	gone     bool // the monitor found the hold lost before its end
	capped   bool // the monitor ended the hold at its cap (maxhold.go)
	// waiting closes once another acquisition waits behind the hold
	// (waiting.go); nil until asked for. stopWaiting stops its watch.
	waiting     chan struct{}
	stopWaiting context.CancelFunc
	stop        context.CancelFunc // stops the monitor goroutine; nil until lost is called
}

// newHold begins a hold of t's key.
func (t *ticket) newHold() *keyHold {
	h := &keyHold{t: t, since: time.Now(), done: make(chan struct{})}
	if t.maxHold > 0 {
		h.lost() // the monitor enforces the cap
	}
	return h
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

// IsOwner returns a comparison for a clientv3 Txn that is true only while
// Key lasts; for a MultiMutex's other keys, compare their CreateRevision to
// Token.
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
// the monitor. A loss the monitor finds after this is no loss. It reports
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
	if h.stop != nil {
		h.stop()
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

// lost returns the hold's loss signal for our key, starting on the first
// call a goroutine of the Session that closes it when the hold is lost.
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
	s := h.t.s
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stop == nil && !h.signaled {
		ctx, cancel := context.WithCancel(h.t.term.ctx())
		h.stop = cancel
		if !s.goBackground(func() { h.monitor(ctx) }) {
			h.signaled = true
			close(h.done)
		}
	}
	return h.done
}

// monitor closes the channel when the hold is lost, and returns when it is,
// or when ctx ends (the hold ended or the Session ended).
func (h *keyHold) monitor(ctx context.Context) {
	var why LossReason
	for from := h.token() + 1; from != 0; {
		from, why = h.watchLoss(ctx, from)
	}
	// Closing the channel and deciding that it is a loss happen at once:
	// an end (release) is either before both or after both.
	h.mu.Lock()
	ended := h.ended
	h.gone = !ended
	h.capped = !ended && why == LossMaxHold
	if !h.signaled {
		h.signaled = true
		close(h.done)
	}
	capped := h.capped
	h.mu.Unlock()
	if s := h.t.s; !ended && s.events != nil {
		s.events.emit(Event{Kind: HoldLost, Lock: h.t.lock, Primitive: h.t.kind, Lease: h.t.term.id, Key: h.t.Key(), Token: h.token(), Reason: h.lossReason(why)})
	}
	if capped {
		dropCapped(ctx, h.t)
	}
}

// lossReason tells the observers why the hold was lost, given why the
// monitor stopped. Silence is its own reason, even when the Session ended
// with it (the term ends a TTL after the last acknowledged renewal was
// sent).
// A deleted key is asked about once, within a bound, since the revoke or
// expiry of our lease deletes it too; only observed Sessions pay that read.
func (h *keyHold) lossReason(why LossReason) LossReason {
	s, tm := h.t.s, h.t.term
	if why == LossKeepAliveSilent || why == LossMaxHold {
		return why
	}
	if why == LossKeyDeleted && !tm.Expired() {
		ctx, cancel := context.WithTimeout(tm.ctx(), lossReadTimeout)
		resp, err := s.client.TimeToLive(ctx, tm.id)
		cancel()
		if (err == nil && resp.TTL == -1) || errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return LossLeaseGone
		}
	}
	switch {
	case !tm.Expired():
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

// watchLoss watches our keys (one, or a group's) from revision from. It
// returns 0 and why when the hold is lost, keep-alives went silent or ctx
// ended, and the revision to watch from again when a watch can no longer
// tell (its history was compacted, or it failed) but a read finds our keys
// still there.
//
// A watch event can be lost (etcd #17529, #18089, #19179, #20221), so our keys
// are also read once per TTL: a lost delete costs at most one TTL. Events at
// or before our keys' creation are an earlier key of the same name, from a
// watch served by a member that lags (or etcd #20221): they are no loss.
//
// The clock of silence runs from the start: opening a watch can block while
// etcd is unreachable (the client dials a new stream), which is when the
// clock matters most. So each key's watch is opened, and its responses
// passed on, by a goroutine of its own, which watchLoss waits for before it
// returns.
func (h *keyHold) watchLoss(ctx context.Context, from int64) (int64, LossReason) {
	s, tm := h.t.s, h.t.term
	wctx, cancel := context.WithCancel(ctx)
	responses := make(chan watched)
	var wg sync.WaitGroup
	for _, key := range h.t.Keys() {
		wg.Go(func() {
			forward(wctx, s.client.Watch(wctx, key, clientv3.WithRev(from), clientv3.WithFilterPut()), responses)
		})
	}
	defer wg.Wait()
	defer cancel()

	broken := false // a watch failed: only the reads tell
	timer := time.NewTimer(tm.untilSilent())
	defer timer.Stop()
	reread := time.NewTicker(tm.ttl)
	defer reread.Stop()
	capped, stopCap := capTimer(h.since, h.t.maxHold)
	defer stopCap()
	for {
		select {
		case w := <-responses:
			switch wr, ok := w.wr, w.ok; {
			case ok && wr.Err() == nil && len(queue.After(wr.Events, h.token())) > 0:
				return 0, LossKeyDeleted
			case ok && wr.Err() == nil:
			case ctx.Err() != nil:
				return 0, LossSessionClosed
			default:
				// Compacted, or failed: read the keys instead, and watch
				// again from that read.
				rev, there := h.keyThere(ctx)
				switch {
				case !there:
					return 0, LossKeyDeleted
				case rev > 0:
					return rev + 1, ""
				}
				// Unknown: the next read decides, and the silence clock
				// runs meanwhile.
				responses, broken = nil, true
			}
		case <-reread.C:
			rev, there := h.keyThere(ctx)
			switch {
			case !there:
				return 0, LossKeyDeleted
			case broken && rev > 0:
				return rev + 1, ""
			}
		case <-timer.C:
			d := tm.untilSilent()
			if d <= 0 {
				return 0, LossKeepAliveSilent
			}
			timer.Reset(d)
		case <-capped:
			return 0, LossMaxHold
		case <-ctx.Done():
			return 0, LossSessionClosed
		}
	}
}

// A watched is one response of a watch, or its close (ok false).
type watched struct {
	wr clientv3.WatchResponse
	ok bool
}

// forward passes wch's responses to out, then its close, until ctx ends.
func forward(ctx context.Context, wch clientv3.WatchChan, out chan<- watched) {
	for {
		wr, ok := <-wch
		select {
		case out <- watched{wr, ok}:
		case <-ctx.Done():
			return
		}
		if !ok {
			return
		}
	}
}

// keyThere reads our keys: it reports false if etcd says a key of the hold
// is gone, and otherwise the revision of the read, 0 where the read failed
// (we cannot tell: the hold is taken as still there).
//
// The read ends by the point of keep-alive silence, too: a read that hangs on
// an unreachable etcd must not hold up the early warning, which the caller
// gives as soon as the read returns.
func (h *keyHold) keyThere(ctx context.Context) (int64, bool) {
	s, tm := h.t.s, h.t.term
	d := min(tm.ttl/3, tm.untilSilent())
	if d <= 0 {
		return 0, true // cannot tell; silent already
	}
	rctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	resp, err := s.client.Txn(rctx).If(h.t.Ours()...).Commit()
	switch {
	case err != nil || resp == nil || resp.Header == nil:
		return 0, true
	case !resp.Succeeded:
		return resp.Header.Revision, false
	}
	return resp.Header.Revision, true
}

// reportEnd reports the end of hold h: its release, or its hand-off to
// another goroutine of this process.
func (h *keyHold) reportEnd() {
	t := h.t
	if t.s.events != nil {
		now := time.Now()
		t.s.events.emit(Event{Kind: HoldEnded, Time: now, Lock: t.lock, Primitive: t.kind, Lease: t.term.id, Key: t.Key(), Token: t.Rev(), HeldFor: now.Sub(h.since)})
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
