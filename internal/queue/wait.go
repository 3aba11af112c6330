package queue

import (
	"context"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ownWatchDelay is how long a wait goes on before it also watches our own
// key, to learn at once that it was deleted (D8): most waits under
// contention end sooner, and cost no second watch.
const ownWatchDelay = 100 * time.Millisecond

// wait waits from the blocked place p until our key holds, or is gone, and
// returns the place that says which. When ctx ends first it returns ErrBusy:
// the last place etcd gave was blocked by other keys.
//
// D4: it watches from now, not from the revision of the read that gave p: a
// watch that starts behind the server's revision is "unsynced" and served
// only every 100 ms. If etcd's revision moved between that read and the
// watch's creation, it reads again, so that nothing in between is missed.
//
// D8: once the wait has lasted ownWatchDelay, it also watches our own key,
// from its creation: a delete (a revoked lease, or by hand) ends the wait at
// once, rather than when the holder leaves. A semaphore's waiter near the
// head needs no such watch: its watch of the prefix sees our key go; it
// watches the limit record instead.
//
// A watch event can be lost (etcd #17529, #18089, #19179, #20221): it reads
// again at least once per TTL, and after any watch error, so that a lost
// event costs at most one TTL. A watch that fails (compacted, or cancelled
// by etcd) is opened again, after a read and a pause: ownWatchDelay, doubled
// with each failure in a row, up to the TTL.
func (t *Ticket) wait(ctx context.Context, p place, early *watching) (place, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var own clientv3.WatchChan
	ownTimer := time.NewTimer(ownWatchDelay)
	defer ownTimer.Stop()
	safety := time.NewTicker(t.c.TTL)
	defer safety.Stop()

	// pause is how long to wait before the next watch after the last one
	// failed: 0 if it did not; it doubles with each failure in a row, up to
	// the TTL, so that a watch etcd keeps refusing costs a read a TTL.
	var pause time.Duration
	var recordPause time.Duration // the same, for the watch of the limit record
	for p.verdict == blocked {
		if pause > 0 {
			select {
			case <-time.After(pause):
			case <-ctx.Done():
				return p, ErrBusy
			}
		}
		wch, stop := t.open(wctx, p, early)
		early = nil
		// A waiter that counts its turn also watches the limit record once
		// the wait has lasted ownWatchDelay (most waits under contention
		// end sooner, and cost no second watch), from the read that placed
		// it: a raise whose touch missed it (it queued, or came near the
		// head, between SetLimit's read and write) admits it then.
		rctx, rstop := context.WithCancel(wctx)
		var record clientv3.WatchChan
		recordBroken := false
		recordTimer := time.NewTimer(ownWatchDelay)
		recordAfter := recordTimer.C
		if p.turn == nil || !t.rule.recorded() {
			recordTimer.Stop()
			recordAfter = nil
		}
		next := place{verdict: unchanged}
		var err error
		for next.verdict == unchanged && err == nil {
			select {
			case wr, ok := <-wch:
				switch {
				case ok && (wr.Err() != nil || wr.Canceled):
					// Compacted, or cancelled by etcd: the watch ends here.
					// Read the place, and watch again after a pause.
					pause = min(max(2*pause, ownWatchDelay), t.c.TTL)
					next, err = t.read(ctx) // not unchanged: a new watch
				case p.turn != nil:
					next, err = t.counted(ctx, p, wr, ok)
				default:
					next, err = t.woken(ctx, p, wr, ok)
				}
				if ok && len(wr.Events) > 0 {
					pause = 0 // the watch works
				}
			case <-recordAfter:
				recordAfter = nil
				opts := []clientv3.OpOption{clientv3.WithRev(p.seen + 1)}
				if recordBroken {
					// From now: the history since the read may be gone.
					opts = []clientv3.OpOption{clientv3.WithCreatedNotify()}
				}
				record = t.c.Watcher.Watch(rctx, t.rule.limitKey, opts...)
			case wr, ok := <-record:
				switch {
				case !ok || wr.Err() != nil || wr.Canceled:
					// Compacted, or failed: open it again after a pause
					// (doubled with each failure in a row, up to the TTL),
					// from now, and read once it is open.
					record, recordBroken = nil, true
					recordPause = min(max(2*recordPause, ownWatchDelay), t.c.TTL)
					if rctx.Err() == nil {
						recordTimer.Reset(recordPause)
						recordAfter = recordTimer.C
					}
				case wr.Created || len(After(wr.Events, p.seen)) > 0:
					if len(wr.Events) > 0 {
						recordPause = 0 // the watch works
					}
					next, err = t.read(ctx)
					next = changed(p, next)
				}
			case wr, ok := <-own:
				if !ok {
					own = nil // the safety net's reads still see our key go
					break
				}
				next, err = t.ownGone(ctx, wr)
			case <-ownTimer.C:
				if p.turn == nil {
					own = t.c.Watcher.Watch(wctx, t.key, clientv3.WithRev(t.rev+1), clientv3.WithFilterPut())
				}
			case <-safety.C:
				next, err = t.read(ctx)
				next = changed(p, next)
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
		stop()
		rstop()
		recordTimer.Stop()
		if err != nil && ctx.Err() != nil {
			return p, ErrBusy
		}
		if err != nil {
			return p, err
		}
		p = next
	}
	return p, nil
}

// A watching is a watch, and what stops it.
type watching struct {
	ch     clientv3.WatchChan
	cancel context.CancelFunc
}

// watchEarly opens, before a semaphore's enqueue, the watch that a wait near
// the head will need, when the last enqueue with the rule waited there: a
// watch created before our key was put brings every event after it, so the
// wait needs no read for what came between the enqueue and the watch (D4).
// Nil otherwise; a nil watching's stop does nothing.
func (t *Ticket) watchEarly(ctx context.Context) *watching {
	if len(t.group) > 1 || !t.rule.nearHead.Load() {
		return nil
	}
	wctx, stop := context.WithCancel(ctx)
	return &watching{ch: t.c.Watcher.Watch(wctx, t.rule.blocking, clientv3.WithPrefix(), clientv3.WithCreatedNotify()), cancel: stop}
}

// stop stops the watch, if there is one.
func (w *watching) stop() {
	if w != nil {
		w.cancel()
	}
}

// open returns the watch of a wait from p, and what stops it: early, the
// watch opened before the enqueue, if there is one and p counts its turn
// (stopping either stops it); else a new one, and early is stopped.
func (t *Ticket) open(ctx context.Context, p place, early *watching) (clientv3.WatchChan, context.CancelFunc) {
	if early != nil && p.turn != nil {
		return early.ch, early.cancel
	}
	early.stop()
	wctx, stop := context.WithCancel(ctx)
	return t.watch(wctx, p), stop
}

// watch opens the watch of a wait from p: of the key to watch; or, when it
// is the only key that blocks us and sits beside ours, of the range from it
// to our key, whose events come in revision order: our key's delete, if
// any, before the holder's.
func (t *Ticket) watch(ctx context.Context, p place) clientv3.WatchChan {
	if t.ownerRange(p) {
		lo, hi := min(p.watch, t.key), max(p.watch, t.key)
		return t.c.Watcher.Watch(ctx, lo, clientv3.WithRange(hi+"\x00"), clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
	}
	opts := []clientv3.OpOption{clientv3.WithCreatedNotify()}
	if p.turn != nil {
		opts = append(opts, clientv3.WithPrefix())
	}
	if t.rule.limit == 0 {
		// A lock's waiter wakes on deletes only; a semaphore's also on a put:
		// SetLimit's touch, or its predecessor's admission.
		opts = append(opts, clientv3.WithFilterPut())
	}
	return t.c.Watcher.Watch(ctx, p.watch, opts...)
}

// ownerRange reports whether a wait from p watches the range from the
// holder's key to ours: the holder is the only key that blocks us, and
// both keys are of one kind (a range from a reader's key to a writer's
// would span every reader's).
func (t *Ticket) ownerRange(p place) bool {
	return p.owner && t.rule.limit == 0 && PrefixOf(p.watch) == PrefixOf(t.key)
}

// woken reads a response of a watch of the wait from p, and returns the
// next place: unchanged to go on waiting.
//
// D4: if the watch was created at a revision other than the one p was read
// at, something may have changed in between: read again. Any other event
// means read again, but for the holder's delete in the owner range: keys
// older than ours only ever go, so once the only one goes, we hold, with no
// read, and the range's order has shown that our key was still there.
func (t *Ticket) woken(ctx context.Context, p place, wr clientv3.WatchResponse, ok bool) (place, error) {
	switch {
	case !ok && ctx.Err() != nil:
		return place{}, ctx.Err()
	case !ok:
		return place{}, ErrWatchClosed
	case wr.Created && wr.Header.Revision != p.seen && p.watchRev != 0:
		// A lock's place changes only when the key we watch goes: is it
		// still there? (A read of one key, where the place's read sorts the
		// queue.)
		return t.stillThere(ctx, p)
	case wr.Created && wr.Header.Revision != p.seen:
	default:
		// A watch served by a member that lags delivers what the read of p
		// already saw, such as the delete of an earlier key of the same
		// name (a Mutex's key is its name and lease: the holder may have
		// released and locked again): only what came after p's read counts.
		events := After(wr.Events, p.seen)
		switch {
		case len(events) == 0:
			return place{verdict: unchanged}, nil
		case t.ownerRange(p):
			// Our key's delete first, even in the holder's own Txn.
			if slices.ContainsFunc(events, func(ev *clientv3.Event) bool { return string(ev.Kv.Key) == t.key }) {
				return place{verdict: gone}, nil
			}
			for _, ev := range events {
				if string(ev.Kv.Key) == p.watch {
					return heldAt(ev.Kv.ModRevision), nil
				}
			}
			return place{verdict: unchanged}, nil
		}
	}
	next, err := t.read(ctx)
	return changed(p, next), err
}

// After returns the events of a watch response that came after revision
// rev: a watch can deliver older ones (served by a member that lags, or
// etcd #20221), which a read at rev, or a key created at rev, has seen.
// Events come in revision order.
func After(events []*clientv3.Event, rev int64) []*clientv3.Event {
	for i, ev := range events {
		if ev.Kv != nil && ev.Kv.ModRevision > rev {
			return events[i:]
		}
	}
	return nil
}

// stillThere reads whether the key a lock's place p watches is still there,
// guarded by our key: if it is, nothing changed; else it reads our place.
func (t *Ticket) stillThere(ctx context.Context, p place) (place, error) {
	resp, err := t.c.KV.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(t.key), "=", t.rev)).
		Then(clientv3.OpGet(p.watch, clientv3.WithKeysOnly())).
		Commit()
	switch {
	case err != nil:
		return place{}, err
	case resp == nil || resp.Header == nil:
		return place{}, ErrMalformed
	case !resp.Succeeded:
		return place{verdict: gone}, nil
	case len(resp.Responses) != 1 || resp.Responses[0].GetResponseRange() == nil:
		return place{}, ErrMalformed
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 && kvs[0].CreateRevision == p.watchRev {
		return place{verdict: unchanged}, nil
	}
	next, err := t.read(ctx)
	return changed(p, next), err
}

// ownGone reads a response of the watch on our own key: gone if the key was
// deleted, else unchanged.
func (t *Ticket) ownGone(ctx context.Context, wr clientv3.WatchResponse) (place, error) {
	deleted := len(After(wr.Events, t.rev)) > 0
	if wr.CompactRevision != 0 || wr.Err() != nil {
		// The history is gone: ask etcd whether the key still is.
		resp, err := t.c.KV.Get(ctx, t.key, clientv3.WithKeysOnly())
		if err != nil {
			return place{}, err
		}
		if resp == nil {
			return place{}, ErrMalformed
		}
		deleted = len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != t.rev
	}
	if deleted {
		return place{verdict: gone}, nil
	}
	return place{verdict: unchanged}, nil
}
