package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The wait queue in etcd that every primitive shares. A queue is the keys
// under one prefix, ordered by create revision: first come, first served. A
// primitive puts one key of its own per hold, and says which older keys
// block it (a rule); the queue does the rest: the enqueue Txn, the reads,
// the watches, the fenced release and the cleanup of a failed acquisition.

const (
	// replyGrace is how long the acquire Txn may still run after the call's
	// context ends, so that its outcome is known and not left to chance (D3).
	replyGrace = 250 * time.Millisecond
	// abortTimeout bounds the cleanup of a call that returns without the
	// lock. With replyGrace, LockContext returns within its deadline + 1 s.
	abortTimeout = 500 * time.Millisecond
	// unlockTimeout bounds the delete of a release.
	unlockTimeout = 3 * time.Second
	// retryTimeout bounds each background retry of a delete.
	retryTimeout = 2 * time.Second
	// ownWatchDelay is how long a wait goes on before it also watches our
	// own key, to learn at once that it was deleted (D8): most waits under
	// contention end sooner, and cost no second watch.
	ownWatchDelay = 100 * time.Millisecond
)

// window is how many older keys a lock's reads of its place bring: the
// predecessor, and one more if there is one, which says whether the
// predecessor is the holder.
const window = 2

// How long an acquisition waits for the holders to leave.
const (
	waitForever time.Duration = -1 // until held, or ctx ends
	tryOnly     time.Duration = 0  // not at all, and write nothing if blocked
)

// A rule says which keys of a queue block a key: the only part of the
// protocol that differs between primitives.
//
//   - Mutex: any older key of the lock (limit 0, blocking = the prefix);
//   - RWMutex writer: any older reader or writer (limit 0);
//   - RWMutex reader: any older writer (limit 0, blocking = the writers' prefix);
//   - Semaphore: limit or more older keys (limit n).
type rule struct {
	// blocking is the prefix under which lies every key that can block us.
	blocking string
	// member reports whether a key under blocking takes part in the queue,
	// and is not a key of a lock nested under it (D11).
	member func(key []byte) bool
	// limit is 0 for a lock and the number of holders for a semaphore.
	limit int
	// accept checks an older key's value (a semaphore's limit); nil: values
	// are not read.
	accept func(value []byte) error
	// busy: the last try with this rule found the queue blocked.
	busy atomic.Bool
}

// A ticket is one key of ours in a queue, from its enqueue to its release.
//
// What the ticket knows of its key in etcd (keyState and rev) and the
// marker that fences its late puts are owned together: they decide which
// key, if any, a cleanup deletes, and how.
type ticket struct {
	s     *Session
	lock  string // the lock's name, and its kind (KindMutex...), for observers
	kind  string
	rule  *rule
	key   string
	value string
	// marker is a key of this ticket's own, outside every lock's prefix,
	// that every Txn of the ticket that may put its key requires absent;
	// the cleanup of an unsure put writes it, so that a put applied after
	// the cleanup fails (a request held up in the network, or sent to a
	// member that applies it late).
	marker    string
	state     keyState
	rev       int64 // the key's create revision, the fencing token, while state is keyPut
	contended bool  // the acquisition waited for another holder
}

// A keyState is what a ticket knows of its key in etcd.
type keyState int

const (
	keyAbsent keyState = iota // not put, or deleted: nothing to clean up
	keyPut                    // put at rev, which fences its delete
	// keyUnsure: a Txn that may put the key got no reply; it may have been
	// applied, or may be yet. Only a cleanup that writes the marker ends it.
	keyUnsure
)

// newTicket returns a ticket for key in the queue of the lock name, of kind
// kind (KindMutex...), under rule.
func (s *Session) newTicket(name, kind string, r *rule, key, value string) *ticket {
	return &ticket{s: s, lock: name, kind: kind, rule: r, key: key, value: value,
		marker: fmt.Sprintf("%s\x00etcdlock/%x-%x", name, s.Lease(), s.seq.Add(1))}
}

// mayPut returns the compare every Txn that may put our key carries: our
// marker is absent, so no cleanup has run yet.
func (t *ticket) mayPut() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(t.marker), "=", 0)
}

// sent records that a Txn that may put our key is about to be sent: until
// its reply comes, the key may be put.
func (t *ticket) sent() { t.state, t.rev = keyUnsure, 0 }

// A place is where our key stands in its queue, as read at one revision.
type place struct {
	seen   int64  // the revision of the read
	watch  string // what to watch while blocked; "" when we hold
	prefix bool   // watch every key under watch, for deletes (a semaphore's head waiter)
	puts   bool   // also wake on a put of watch (a semaphore waiter: its predecessor's admission)
	next   bool   // a key is queued behind ours
	// A lock's waiter: owner means watch is the only key that blocks us, so
	// that its delete makes us the holder with no read; watchRev is watch's
	// create revision.
	owner    bool
	watchRev int64
}

func (p place) holds() bool { return p.watch == "" }

// acquire puts our key in the queue and waits until it holds (wait < 0),
// until wait has passed, or not at all (tryOnly: then it writes nothing when
// blocked). On failure it has removed our key from etcd, or handed its
// removal to a background retry that calls then when done; on success then
// is not called. A try that finds the queue blocked returns errBusy; a wait
// that runs out returns opCtx's error, context.DeadlineExceeded.
func (t *ticket) acquire(ctx context.Context, wait time.Duration, then func()) error {
	err := t.enter(ctx, wait)
	for errors.Is(err, errKeyGone) && ctx.Err() == nil && !t.s.expired() {
		// Our key was deleted while we waited, by hand or by a revoke that
		// the keep-alive has not seen yet: queue again, as a new key. A
		// revoked lease fails the put with ErrLeaseNotFound.
		t.state, t.rev = keyAbsent, 0
		err = t.enter(ctx, wait)
	}
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.s.leaseGone()
	}
	if err != nil {
		t.abort(ctx, then)
	}
	return err
}

// enter puts our key in the queue and waits for its turn.
func (t *ticket) enter(ctx context.Context, wait time.Duration) error {
	var p place
	var err error
	if wait == tryOnly {
		p, err = t.try(ctx)
	} else {
		p, err = t.enqueue(ctx)
	}
	if err != nil {
		return err
	}
	if !p.holds() {
		t.contended = true
		if wait == tryOnly {
			return errBusy
		}
		// The place came from the acquire Txn: nobody was behind us.
		if p, err = t.wait(ctx, p); err != nil {
			return err
		}
		if p.next {
			return t.promote(ctx)
		}
	}
	return nil
}

// enqueue puts our key, if it is not there, and reads its place, in one Txn.
// (A compare on the prefix being empty could save the read when nobody
// holds, but etcd reads every key of the range to compare it: with a long
// queue, each enqueue would read all of it.)
func (t *ticket) enqueue(ctx context.Context) (place, error) {
	c := t.s.client
	// D3: if ctx ends while etcd applies the Txn, wait a little for the
	// reply rather than guess: a known revision makes the cleanup fenced, and
	// a cleanup sent while the Txn is still in flight could be applied first.
	rctx, cancel := graceContext(ctx, replyGrace)
	defer cancel()
	t.sent()
	resp, err := c.Txn(rctx).
		If(clientv3.Compare(clientv3.CreateRevision(t.key), "=", 0), t.mayPut()).
		Then(append([]clientv3.Op{t.put()}, t.rule.newest()...)...).
		Else(clientv3.OpGet(t.key)).
		Commit()
	if err != nil {
		// D3: the Txn may have been applied though the reply was lost, or
		// may be applied later: the key stays unsure.
		return place{}, err
	}
	p, err := t.placed(resp)
	if err != nil {
		return p, err
	}
	if err := ctx.Err(); err != nil {
		return p, err
	}
	if p.seen == 0 {
		// Our key was already there (WithLease), or the keys the Txn read
		// could not tell our place (D11): read it.
		return t.read(ctx)
	}
	return p, nil
}

// try puts our key only if it would hold at once, and writes nothing
// otherwise: the first Txn assumes the queue is empty; if it is not, its
// reply says whether the keys there block us, and the next Txn puts our key
// only if no key was added since that read. A Txn that may put goes through
// etcd's raft log even when its compare fails, so after a try of this rule
// found the queue blocked, the next one reads first (a read-only Txn, no
// raft): a lock polled while held costs one read a try.
func (t *ticket) try(ctx context.Context) (p place, err error) {
	defer func() { t.rule.busy.Store(err == nil && !p.holds()) }()
	rctx, cancel := graceContext(ctx, replyGrace)
	defer cancel()
	unchanged := clientv3.Compare(clientv3.CreateRevision(t.rule.blocking), "=", 0).WithPrefix()
	for readFirst := t.rule.busy.Load(); ; readFirst = false {
		txn := t.s.client.Txn(rctx)
		if readFirst {
			txn = txn.Then(t.blockers()...)
		} else {
			t.sent()
			txn = txn.If(unchanged, clientv3.Compare(clientv3.CreateRevision(t.key), "=", 0), t.mayPut()).
				Then(append([]clientv3.Op{t.put()}, t.rule.newest()...)...).
				Else(t.blockers()...)
		}
		resp, err := txn.Commit()
		if err != nil {
			return place{}, err
		}
		if resp == nil || resp.Header == nil {
			return place{}, errMalformed
		}
		if resp.Succeeded && !readFirst {
			p, err := t.placed(resp)
			if err == nil && p.seen == 0 {
				p, err = t.read(ctx)
			}
			return p, err
		}
		if !readFirst {
			t.state = keyAbsent // the compare failed: nothing was put
		}
		p, adopt, err := t.blocked(ctx, resp)
		switch {
		case adopt:
			return t.enqueue(ctx)
		case err != nil || !p.holds():
			return p, err
		}
		unchanged = clientv3.Compare(clientv3.CreateRevision(t.rule.blocking), "<", p.seen+1).WithPrefix()
	}
}

// blockers are the Ops of a try that read our key and what blocks a key put
// now.
func (t *ticket) blockers() []clientv3.Op {
	return []clientv3.Op{clientv3.OpGet(t.key, clientv3.WithKeysOnly()), t.rule.oldest()}
}

// blocked reads the reply of blockers: the place a key put now would have,
// or adopt when our key is there already (WithLease: take it as it is).
func (t *ticket) blocked(ctx context.Context, resp *clientv3.TxnResponse) (p place, adopt bool, err error) {
	if resp == nil || resp.Header == nil || len(resp.Responses) != 2 {
		return place{}, false, errMalformed
	}
	mine := resp.Responses[0].GetResponseRange()
	if mine == nil {
		return place{}, false, errMalformed
	}
	if len(mine.Kvs) > 0 {
		return place{}, true, nil
	}
	p, err = t.rule.placeFirst(resp.Responses[1].GetResponseRange(), resp.Header.Revision)
	if err == nil && p.seen == 0 {
		// A nested key came first (D11): read every key.
		p, err = t.readAll(ctx)
	}
	return p, false, err
}

// put is the Op that puts our key with the Session's lease.
func (t *ticket) put() clientv3.Op {
	return clientv3.OpPut(t.key, t.value, clientv3.WithLease(t.s.Lease()))
}

// placed reads the reply of a Txn that put our key if it was absent and then
// read the rule's newest keys, or else read our key. It sets t.rev. A place
// with seen == 0 means the reply could not tell our place.
func (t *ticket) placed(resp *clientv3.TxnResponse) (place, error) {
	if resp == nil || resp.Header == nil || resp.Header.Revision <= 0 {
		return place{}, errMalformed
	}
	if !resp.Succeeded {
		// Our key was already there: left by an earlier process with this
		// lease (WithLease). Adopt it, as concurrency.Mutex does.
		if len(resp.Responses) != 1 {
			return place{}, errMalformed
		}
		mine := resp.Responses[0].GetResponseRange()
		if mine == nil || len(mine.Kvs) != 1 || mine.Kvs[0].CreateRevision <= 0 {
			return place{}, errMalformed
		}
		t.state, t.rev = keyPut, mine.Kvs[0].CreateRevision
		return place{}, nil
	}
	if len(resp.Responses) != 1+len(t.rule.newest()) {
		return place{}, errMalformed
	}
	t.state, t.rev = keyPut, resp.Header.Revision
	return t.rule.placeNew(t.key, resp.Responses[1:], t.rev)
}

// read reads our place: one linearizable read, and no write, guarded by our
// key, so that it fails with errKeyGone if our key is no longer in etcd (the
// post-wait check of etcd #16221 / #19597).
func (t *ticket) read(ctx context.Context) (place, error) {
	for _, full := range []bool{false, true} {
		ops := t.rule.older(t.rev, full)
		resp, err := t.s.client.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(t.key), "=", t.rev)).
			Then(ops...).
			Commit()
		if err != nil {
			return place{}, err
		}
		if resp == nil || resp.Header == nil {
			return place{}, errMalformed
		}
		if !resp.Succeeded {
			return place{}, errKeyGone
		}
		if len(resp.Responses) != len(ops) {
			return place{}, errMalformed
		}
		p, err := t.rule.placeOlder(resp.Responses, t.rev, resp.Header.Revision, full)
		if err != nil || p.seen != 0 {
			return p, err
		}
	}
	return place{}, errMalformed
}

// readAll reads the place a key put now would have, from every key of the
// queue; the place's seen is the revision of the read.
func (t *ticket) readAll(ctx context.Context) (place, error) {
	resp, err := t.s.client.Get(ctx, t.rule.blocking, t.rule.allOptions(0)...)
	if err != nil {
		return place{}, err
	}
	if resp == nil || resp.Header == nil {
		return place{}, errMalformed
	}
	return t.rule.placeAll((*pb.RangeResponse)(resp), resp.Header.Revision)
}

// wait waits from p until our key holds, and returns the place that says so.
//
// D4: it watches from now, not from the revision of the read that gave p: a
// watch that starts behind the server's revision is "unsynced" and served
// only every 100 ms. If etcd's revision moved between that read and the
// watch's creation, it reads again, so that nothing in between is missed.
//
// D8: once the wait has lasted ownWatchDelay, it also watches our own key,
// from its creation: a delete (a revoked lease, or by hand) ends the wait at
// once with errKeyGone, rather than when the holder leaves.
//
// A watch event can be lost (etcd #17529, #18089, #19179, #20221): it reads
// again at least once per TTL, and after any watch error, so that a lost
// event costs at most one TTL.
func (t *ticket) wait(ctx context.Context, p place) (place, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var own clientv3.WatchChan
	ownTimer := time.NewTimer(ownWatchDelay)
	defer ownTimer.Stop()
	safety := time.NewTicker(t.s.ttl)
	defer safety.Stop()

	for !p.holds() {
		bctx, stop := context.WithCancel(wctx)
		wch := t.watch(bctx, p)
		var next place
		var err error
		for next.seen == 0 && err == nil {
			select {
			case wr, ok := <-wch:
				next, err = t.woken(ctx, p, wr, ok)
			case wr, ok := <-own:
				if !ok {
					own = nil // the safety net's reads still see our key go
					break
				}
				var gone bool
				if gone, err = t.ownGone(ctx, wr); err == nil && gone {
					err = errKeyGone
				}
			case <-ownTimer.C:
				own = t.s.client.Watch(wctx, t.key, clientv3.WithRev(t.rev+1), clientv3.WithFilterPut())
			case <-safety.C:
				next, err = t.read(ctx)
				next = changed(p, next)
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
		stop()
		if err != nil {
			return p, err
		}
		p = next
	}
	return p, nil
}

// watch opens the watch of a wait from p: of the key to watch; or, when it
// is the only key that blocks us and sits beside ours, of the range from it
// to our key, whose events come in revision order: our key's delete, if
// any, before the holder's.
func (t *ticket) watch(ctx context.Context, p place) clientv3.WatchChan {
	if t.ownerRange(p) {
		lo, hi := min(p.watch, t.key), max(p.watch, t.key)
		return t.s.client.Watch(ctx, lo, clientv3.WithRange(hi+"\x00"), clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
	}
	opts := []clientv3.OpOption{clientv3.WithCreatedNotify()}
	if p.prefix {
		opts = append(opts, clientv3.WithPrefix())
	}
	if !p.puts {
		opts = append(opts, clientv3.WithFilterPut())
	}
	return t.s.client.Watch(ctx, p.watch, opts...)
}

// ownerRange reports whether a wait from p watches the range from the
// holder's key to ours: the holder is the only key that blocks us, and
// both keys are of one kind (a range from a reader's key to a writer's
// would span every reader's).
func (t *ticket) ownerRange(p place) bool {
	return p.owner && t.rule.limit == 0 && parent(p.watch) == parent(t.key)
}

func parent(key string) string { return key[:strings.LastIndexByte(key, '/')+1] }

// woken reads a response of a watch of the wait from p, and returns the
// next place, or the zero place to go on waiting.
//
// D4: if the watch was created at a revision other than the one p was read
// at, something may have changed in between: read again. Any other event
// means read again, but for the holder's delete in the owner range: keys
// older than ours only ever go, so once the only one goes, we hold, with no
// read, and the range's order has shown that our key was still there.
func (t *ticket) woken(ctx context.Context, p place, wr clientv3.WatchResponse, ok bool) (place, error) {
	switch {
	case !ok && ctx.Err() != nil:
		return place{}, ctx.Err()
	case !ok:
		return place{}, errWatchClosed
	case wr.Err() != nil:
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
		events := after(wr.Events, p.seen)
		switch {
		case len(events) == 0:
			return place{}, nil
		case t.ownerRange(p):
			// Our key's delete first, even in the holder's own Txn.
			if slices.ContainsFunc(events, func(ev *clientv3.Event) bool { return string(ev.Kv.Key) == t.key }) {
				return place{}, errKeyGone
			}
			for _, ev := range events {
				if string(ev.Kv.Key) == p.watch {
					return place{seen: ev.Kv.ModRevision}, nil
				}
			}
			return place{}, nil
		}
	}
	next, err := t.read(ctx)
	return changed(p, next), err
}

// after returns the events of a watch response that came after revision
// rev: a watch can deliver older ones (served by a member that lags, or
// etcd #20221), which a read at rev, or a key created at rev, has seen.
// Events come in revision order.
func after(events []*clientv3.Event, rev int64) []*clientv3.Event {
	for i, ev := range events {
		if ev.Kv != nil && ev.Kv.ModRevision > rev {
			return events[i:]
		}
	}
	return nil
}

// stillThere reads whether the key a lock's place p watches is still there,
// guarded by our key: if it is, nothing changed (the zero place); else it
// reads our place.
func (t *ticket) stillThere(ctx context.Context, p place) (place, error) {
	resp, err := t.s.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(t.key), "=", t.rev)).
		Then(clientv3.OpGet(p.watch, clientv3.WithKeysOnly())).
		Commit()
	switch {
	case err != nil:
		return place{}, err
	case resp == nil || resp.Header == nil:
		return place{}, errMalformed
	case !resp.Succeeded:
		return place{}, errKeyGone
	case len(resp.Responses) != 1 || resp.Responses[0].GetResponseRange() == nil:
		return place{}, errMalformed
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 && kvs[0].CreateRevision == p.watchRev {
		return place{}, nil
	}
	next, err := t.read(ctx)
	return changed(p, next), err
}

// changed returns next if it differs from p in what to watch, and otherwise
// the zero place: nothing to do but go on waiting.
func changed(p, next place) place {
	if next.watch == p.watch && next.prefix == p.prefix && next.puts == p.puts && next.owner == p.owner {
		return place{}
	}
	return next
}

// ownGone reads a response of the watch on our own key and reports whether
// the key was deleted.
func (t *ticket) ownGone(ctx context.Context, wr clientv3.WatchResponse) (bool, error) {
	if wr.CompactRevision != 0 || wr.Err() != nil {
		// The history is gone: ask etcd whether the key still is.
		resp, err := t.s.client.Get(ctx, t.key, clientv3.WithKeysOnly())
		if err != nil {
			return false, err
		}
		if resp == nil {
			return false, errMalformed
		}
		return len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != t.rev, nil
	}
	return len(after(wr.Events, t.rev)) > 0, nil
}

// promote tells the key behind ours that we now hold, so that it learns its
// new place (a semaphore's waiters watch their predecessor for this): it
// puts our key again, fenced on its create revision.
func (t *ticket) promote(ctx context.Context) error {
	resp, err := t.s.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(t.key), "=", t.rev)).
		Then(t.put()).
		Commit()
	switch {
	case err != nil:
		return err
	case resp == nil:
		return errMalformed
	case !resp.Succeeded:
		return errKeyGone
	}
	return nil
}

// abort removes our key after a failed acquisition, if it may be in etcd, on
// a context detached from ctx and bounded; then runs when that is done. Where
// etcd does not confirm the delete, it is retried in the background, and then
// runs only after it succeeded or the Session ended.
func (t *ticket) abort(ctx context.Context, then func()) {
	if t.state != keyAbsent && !t.s.expired() {
		if _, err := t.release(ctx, abortTimeout); err != nil {
			t.releaseLater(then)
			return
		}
	}
	if then != nil {
		then()
	}
}

// release deletes our key (see deleteKey) on a context detached from ctx and
// bounded by timeout. It reports whether a key was deleted.
func (t *ticket) release(ctx context.Context, timeout time.Duration) (bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	return t.deleteKey(ctx)
}

// deleteKey deletes our key, on ctx as it is, and reports whether it did.
// A key known to be put is deleted fenced on its create revision (D6). Where
// a put is unsure, one Txn writes the marker, which fails every put of the
// ticket that etcd has yet to apply, and deletes the key by name: only this
// ticket uses the key meanwhile (a Mutex's key is its process's turn). The
// marker makes that Txn act once: a retry, or a copy of it applied late, can
// never delete a later key of the same name.
func (t *ticket) deleteKey(ctx context.Context) (bool, error) {
	txn := t.s.client.Txn(ctx)
	switch t.state {
	case keyAbsent:
		return false, nil
	case keyPut:
		txn = txn.If(clientv3.Compare(clientv3.CreateRevision(t.key), "=", t.rev)).Then(clientv3.OpDelete(t.key))
	default:
		txn = txn.If(t.mayPut()).Then(clientv3.OpPut(t.marker, "", clientv3.WithLease(t.s.Lease())), clientv3.OpDelete(t.key))
	}
	resp, err := txn.Commit()
	switch {
	case t.state == keyUnsure && errors.Is(err, rpctypes.ErrLeaseNotFound):
		// The lease is gone, and every key with it: no put of ours can
		// succeed.
		return false, nil
	case err != nil:
		return false, err
	case resp == nil:
		return false, errMalformed
	case t.state == keyPut || !resp.Succeeded:
		return resp.Succeeded, nil
	}
	if len(resp.Responses) != 2 || resp.Responses[1].GetResponseDeleteRange() == nil {
		return false, errMalformed
	}
	return resp.Responses[1].GetResponseDeleteRange().Deleted > 0, nil
}

// releaseLater retries the delete of our key in the background, with
// backoff, until it succeeds or the Session ends (which ends an attempt
// under way too: the revoke deletes the key anyway), then runs then (which
// may be nil).
func (t *ticket) releaseLater(then func()) {
	sctx := t.s.cs.Ctx()
	ok := t.s.goBackground(func() {
		if then != nil {
			defer then()
		}
		for b := newBackoff(); b.wait(sctx) == nil; {
			ctx, cancel := context.WithTimeout(sctx, retryTimeout)
			_, err := t.deleteKey(ctx)
			cancel()
			if err == nil {
				return
			}
		}
	})
	if !ok && then != nil {
		then()
	}
}

// unlock releases the key of hold h (ended already): it returns nil when it
// was deleted, ErrSessionExpired or ErrLockLost when it was already gone, and
// etcd's error, wrapped, when etcd did not confirm the delete; the delete is
// then retried in the background, and then runs after it. Otherwise then
// runs before unlock returns.
func (t *ticket) unlock(ctx context.Context, h *hold, then func()) error {
	h.reportEnd()
	if t.s.expired() {
		t.released(false, nil)
		if then != nil {
			then()
		}
		return ErrSessionExpired
	}
	deleted, err := t.release(ctx, unlockTimeout)
	t.released(deleted, err)
	if err != nil {
		t.releaseLater(then)
		return errorf("unlock", t.lock, err)
	}
	if then != nil {
		then()
	}
	if !deleted {
		if t.s.expired() {
			return ErrSessionExpired
		}
		return ErrLockLost
	}
	return nil
}

// startable returns the error that ends an acquisition before it starts:
// ctx's, or ErrSessionExpired.
func startable(ctx context.Context, s *Session) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.expired() {
		return ErrSessionExpired
	}
	return nil
}

// failure returns the error of an acquisition of the lock name that did not
// take the lock: errBusy where a try or the wait (opCtx's own deadline) ran
// out, which each primitive reports its own way; else the caller's context's
// error; else ErrSessionExpired; else err, wrapped with the lock's name
// unless it is ErrLimitMismatch. An etcd error that came as the wait ran out
// is that error: only the end of opCtx itself is the wait running out.
func failure(ctx, opCtx context.Context, s *Session, name string, err error) error {
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case s.expired() || errors.Is(err, rpctypes.ErrLeaseNotFound):
		return ErrSessionExpired
	case errors.Is(err, errBusy),
		errors.Is(opCtx.Err(), context.DeadlineExceeded) && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)):
		return errBusy
	case errors.Is(err, ErrLimitMismatch):
		return err
	}
	return errorf("lock", name, err)
}

// isLockKey reports whether key is a waiter's or holder's key of the lock
// with prefix pfx, and not a key of a lock nested under it (D11): a name
// like "a/b" must not block "a".
func isLockKey(pfx string, key []byte) bool {
	rest, ok := strings.CutPrefix(string(key), pfx)
	return ok && !strings.Contains(rest, "/")
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

// graceContext returns a context that ends grace after ctx ends (or when
// cancel is called), and carries ctx's values.
func graceContext(ctx context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var timer atomic.Pointer[time.Timer]
	stop := context.AfterFunc(ctx, func() { timer.Store(time.AfterFunc(grace, cancel)) })
	return rctx, func() {
		stop()
		if t := timer.Load(); t != nil {
			t.Stop()
		}
		cancel()
	}
}

// newest returns the Ops that read, in the acquire Txn, the keys that tell
// the place of a key just put.
func (r *rule) newest() []clientv3.Op {
	if r.limit > 0 {
		return r.all(0)
	}
	// Our new key is the newest in etcd, so the newest keys under the
	// prefix are ours, usually our predecessor, and the one before it, if
	// any.
	return []clientv3.Op{clientv3.OpGet(r.blocking, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(window+1),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend))}
}

// oldest returns the Op that reads what blocks a key put now, when a try
// finds the queue not empty: for a lock, the oldest key; for a semaphore,
// every key.
func (r *rule) oldest() clientv3.Op {
	if r.limit > 0 {
		return r.all(0)[0]
	}
	return clientv3.OpGet(r.blocking, append(clientv3.WithFirstCreate(), clientv3.WithKeysOnly())...)
}

// all returns the Op that reads every key under the prefix created before
// rev (rev 0: every key), oldest first, with values only where the rule
// reads them.
func (r *rule) all(rev int64) []clientv3.Op {
	return []clientv3.Op{clientv3.OpGet(r.blocking, r.allOptions(rev)...)}
}

// allOptions returns the options of all's read.
func (r *rule) allOptions(rev int64) []clientv3.OpOption {
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)}
	if r.accept == nil {
		opts = append(opts, clientv3.WithKeysOnly())
	}
	if rev > 0 {
		opts = append(opts, clientv3.WithMaxCreateRev(rev-1))
	}
	return opts
}

// older returns the Ops that read what blocks the key at rev: for a lock,
// the two newest older keys (or, if full, every older key, to skip nested
// keys); for a semaphore, every older key, and the key behind ours, if any.
func (r *rule) older(rev int64, full bool) []clientv3.Op {
	switch {
	case r.limit > 0:
		return append(r.all(rev), clientv3.OpGet(r.blocking, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
			clientv3.WithMinCreateRev(rev+1), clientv3.WithLimit(1)))
	case full:
		return r.all(rev)
	}
	return []clientv3.Op{clientv3.OpGet(r.blocking, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(window),
		clientv3.WithMaxCreateRev(rev-1), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend))}
}

// placeNew reads the place of our key, just put at rev, from the replies of
// newest(). A place with seen == 0 means they could not tell.
func (r *rule) placeNew(key string, replies []*pb.ResponseOp, rev int64) (place, error) {
	for _, reply := range replies {
		if reply.GetResponseRange() == nil {
			return place{}, errMalformed
		}
	}
	rr := replies[0].GetResponseRange()
	kvs := make([]*mvccpb.KeyValue, 0, len(rr.Kvs))
	for _, kv := range rr.Kvs {
		switch {
		case string(kv.Key) == key:
			if kv.CreateRevision != rev {
				return place{}, errMalformed
			}
		case kv.CreateRevision >= rev:
			return place{}, errMalformed
		default:
			kvs = append(kvs, kv)
		}
	}
	if r.limit > 0 {
		return r.count(kvs, rev)
	}
	return r.lockPlace(kvs, len(rr.Kvs) < window+1, rev), nil
}

// placeOlder reads the place of the key at rev from the replies of
// older(rev, full), read at revision seen. A place with seen == 0 means
// they could not tell.
func (r *rule) placeOlder(replies []*pb.ResponseOp, rev, seen int64, full bool) (place, error) {
	for _, reply := range replies {
		if reply.GetResponseRange() == nil {
			return place{}, errMalformed
		}
	}
	older := replies[0].GetResponseRange().Kvs
	for _, kv := range older {
		if kv.CreateRevision >= rev {
			return place{}, errMalformed
		}
	}
	switch {
	case r.limit > 0 && len(replies) > 1:
		p, err := r.count(older, seen)
		p.next = len(replies[1].GetResponseRange().Kvs) > 0
		return p, err
	case r.limit > 0:
		return r.count(older, seen)
	case full:
		// Every older key, oldest first.
		newestFirst := slices.Clone(older)
		slices.Reverse(newestFirst)
		return r.lockPlace(newestFirst, true, seen), nil
	}
	return r.lockPlace(older, len(older) < window, seen), nil
}

// placeFirst reads what blocks a key put now from the reply of oldest(),
// read at revision seen. A place with seen == 0 means it could not tell.
func (r *rule) placeFirst(rr *pb.RangeResponse, seen int64) (place, error) {
	if rr == nil {
		return place{}, errMalformed
	}
	if r.limit > 0 {
		return r.count(rr.Kvs, seen)
	}
	switch {
	case len(rr.Kvs) == 0:
		return place{seen: seen}, nil
	case r.member(rr.Kvs[0].Key):
		return place{seen: seen, watch: string(rr.Kvs[0].Key)}, nil
	}
	return place{}, nil
}

// placeAll reads the place a key put now would have from the reply of
// all(0), read at revision seen.
func (r *rule) placeAll(rr *pb.RangeResponse, seen int64) (place, error) {
	reply := &pb.ResponseOp{Response: &pb.ResponseOp_ResponseRange{ResponseRange: rr}}
	return r.placeOlder([]*pb.ResponseOp{reply}, math.MaxInt64, seen, true)
}

// lockPlace reads a lock's place from the keys older than ours under the
// blocking prefix, newest first: every one if complete, else the newest
// few. We watch the newest member; when it is the only one, it holds, and
// its delete makes us the holder. A nested key in an incomplete window
// leaves the place unknown (seen == 0): read every key.
func (r *rule) lockPlace(newestFirst []*mvccpb.KeyValue, complete bool, seen int64) place {
	var members []*mvccpb.KeyValue
	for _, kv := range newestFirst {
		if !r.member(kv.Key) {
			if !complete {
				return place{}
			}
			continue
		}
		members = append(members, kv)
	}
	if len(members) == 0 {
		return place{seen: seen}
	}
	return place{seen: seen, watch: string(members[0].Key), watchRev: members[0].CreateRevision, owner: complete && len(members) == 1}
}

// count reads a semaphore's place from every key older than ours, oldest
// first, read at revision seen.
func (r *rule) count(kvs []*mvccpb.KeyValue, seen int64) (place, error) {
	var older []*mvccpb.KeyValue
	for _, kv := range kvs {
		if !r.member(kv.Key) {
			continue
		}
		if r.accept != nil {
			if err := r.accept(kv.Value); err != nil {
				return place{}, err
			}
		}
		older = append(older, kv)
	}
	switch n := len(older); {
	case n < r.limit:
		return place{seen: seen}, nil
	case n == r.limit:
		// The head waiter: any release of an older key admits us.
		return place{seen: seen, watch: r.blocking, prefix: true}, nil
	default:
		// Behind the head: our predecessor's admission, or its leaving,
		// moves us up.
		return place{seen: seen, watch: string(older[n-1].Key), puts: true}, nil
	}
}
