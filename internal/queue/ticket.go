// Package queue is the wait queue in etcd that every lock of etcdlock
// shares. A queue is the keys under one prefix, ordered by create revision:
// first come, first served. A lock puts one key of its own per hold, and
// says which older keys block it (a Rule); the queue does the rest: the
// enqueue Txn, the reads, the watches, the wake-up of a semaphore's next
// waiter, and the fenced delete.
//
// The package knows etcd's KV and Watcher and the lease its keys are put
// with, and nothing of sessions, holds, observers or goroutines: a caller
// decides when a delete is retried, and what a failure means to its users.
package queue

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// replyGrace is how long the acquire Txn may still run after the call's
// context ends, so that its outcome is known and not left to chance (D3).
const replyGrace = 250 * time.Millisecond

// How long an acquisition waits for the holders to leave: a positive
// duration is counted from when etcd first says other keys block ours, so
// that a request etcd has not answered yet does not count (ctx bounds it).
const (
	WaitForever time.Duration = -1 // until held, or ctx ends
	TryOnly     time.Duration = 0  // not at all, and write nothing if blocked
)

// A waitBudget is how long an acquisition may still wait for other keys to
// go: its clock starts at the first wait, and every later wait (another
// queue of a group, a queue entered again) shares it.
type waitBudget struct {
	wait time.Duration // WaitForever, or a positive duration
	end  time.Time     // zero until the first wait
}

// context returns ctx bounded by what is left of the budget, starting its
// clock if it has not started.
func (b *waitBudget) context(ctx context.Context) (context.Context, context.CancelFunc) {
	if b.wait <= 0 {
		return context.WithCancel(ctx)
	}
	if b.end.IsZero() {
		b.end = time.Now().Add(b.wait)
	}
	return context.WithDeadline(ctx, b.end)
}

// A Lease is the lease a queue's keys are put with, as the protocol needs
// it.
type Lease interface {
	// ID returns the lease's ID.
	ID() clientv3.LeaseID
	// Expired reports whether the lease is known to be gone.
	Expired() bool
	// Gone is told that etcd answered a put with "lease not found".
	Gone()
}

// A Conn is what a ticket talks to: etcd, the lease of its keys, the
// period of the reads that catch a lost watch event, and the fence of the
// lease's puts.
type Conn struct {
	KV      clientv3.KV
	Watcher clientv3.Watcher
	Lease   Lease
	// TTL is how often a wait reads its place, whatever its watches say:
	// a lost event costs at most that.
	TTL time.Duration
	// FenceKey is the key that fences the late puts of the lease's tickets:
	// one key per lease, put with it, which no lock counts (its name has
	// no "/", so it lies under no lock's prefix). Every Txn that may put a
	// key of a ticket requires the fence unchanged since the ticket last
	// read it; the delete of an unsure put writes it first, so that a put
	// applied after that delete fails, whichever ticket sent it. Where
	// etcd's authentication refuses it, the lease's tickets go without it
	// (role.go).
	FenceKey string

	fenceRev  atomic.Int64 // the fence's mod revision, as last seen; 0 while it is absent
	fenceOff  readAt       // when etcd last refused the fence to the client's role: go without it for a TTL
	fenceRead readAt       // the role was last found to read the fence (role.go)
}

// fenceSeen records the fence's mod revision as a reply of etcd gave it. A
// reply older than one already seen is ignored, except one that finds the
// fence gone (deleted by hand): a wrong guess costs one more Txn, which
// reads it again.
func (c *Conn) fenceSeen(rev int64) {
	for {
		cur := c.fenceRev.Load()
		if rev == cur || (rev < cur && rev != 0) || c.fenceRev.CompareAndSwap(cur, rev) {
			return
		}
	}
}

// unfenced returns the compare every Txn that may put a key carries: the
// fence is as last seen (rev), so no delete of an unsure put has run since.
func (c *Conn) unfenced(rev int64) clientv3.Cmp {
	return clientv3.Compare(clientv3.ModRevision(c.FenceKey), "=", rev)
}

// readFence is the Op that reads the fence, after a Txn's compare failed.
func (c *Conn) readFence() clientv3.Op { return clientv3.OpGet(c.FenceKey, clientv3.WithKeysOnly()) }

// fenceMoved reads the reply of readFence: whether the fence is no longer
// at rev, which a failed compare was made with; it records what it read.
func (c *Conn) fenceMoved(reply *pb.ResponseOp, rev int64) (bool, error) {
	r := reply.GetResponseRange()
	if r == nil || len(r.Kvs) > 1 {
		return false, ErrMalformed
	}
	var now int64
	if len(r.Kvs) == 1 {
		now = r.Kvs[0].ModRevision
	}
	c.fenceSeen(now)
	return now != rev, nil
}

// A Ticket is one key of ours in a queue, from its enqueue to its release;
// or, made by NewGroup, one key in each of several queues, all put by one
// Txn, so at one revision, and held together.
//
// What the ticket knows of its keys in etcd (state and rev) decides which
// keys, if any, a delete removes, and how.
type Ticket struct {
	c     *Conn
	rule  *Rule
	key   string
	value string
	// chained: a semaphore's key that a waiter behind it may watch (it
	// waited NearHead-1 or more keys back): it owes a promote once admitted.
	chained bool
	*known  // shared by every ticket of a group: one state, one revision
}

// known is what one acquisition knows of its keys in etcd, kept once: a
// group's tickets share it.
type known struct {
	state     keyState
	rev       int64 // the keys' create revision, the fencing token, while state is keyPut
	contended bool  // the acquisition waited for another holder
	// group is every ticket of the acquisition, the first first: one key per
	// queue.
	group []*Ticket
}

// A keyState is what a ticket knows of its key in etcd.
type keyState int

const (
	keyAbsent keyState = iota // not put, or deleted: nothing to delete
	keyPut                    // put at rev, which fences its delete
	// keyUnsure: a Txn that may put the key got no reply; it may have been
	// applied, or may be yet. Only a delete that writes the fence ends it.
	keyUnsure
)

// NewTicket returns a ticket for key, with value, in the queue of rule r.
// Until the ticket ends, no other ticket of the lease may use key.
func NewTicket(c *Conn, r *Rule, key, value string) *Ticket {
	t := &Ticket{c: c, rule: r.use(c.TTL), key: key, value: value, known: &known{}}
	t.group = []*Ticket{t}
	return t
}

// A Slot is one key of a group ticket: the key, its value, and the rule of
// its queue.
type Slot struct {
	Rule       *Rule
	Key, Value string
}

// NewGroup returns one ticket for several keys, one per queue (at least
// one; no key may lie in another's queue as a member), which it puts in one
// Txn, at one revision: it holds when every queue says so. A key waits only
// for older keys, and all keys of a group are as old as each other, so
// groups that wait for each other cannot wait in a cycle. Until the ticket
// ends, no other ticket of the lease may use its keys.
func NewGroup(c *Conn, slots ...Slot) *Ticket {
	k := &known{group: make([]*Ticket, len(slots))}
	for i, sl := range slots {
		k.group[i] = &Ticket{c: c, rule: sl.Rule.use(c.TTL), key: sl.Key, value: sl.Value, known: k}
	}
	return k.group[0]
}

// Held returns a ticket for key, known to be in etcd with create revision
// rev: its delete is fenced on rev.
func Held(c *Conn, r *Rule, key string, rev int64) *Ticket {
	t := &Ticket{c: c, rule: r.use(c.TTL), key: key, known: &known{state: keyPut, rev: rev}}
	t.group = []*Ticket{t}
	return t
}

// Key returns the ticket's key (a group's first key).
func (t *Ticket) Key() string { return t.key }

// Keys returns the ticket's keys: one, or a group's, in the order given.
func (t *Ticket) Keys() []string {
	keys := make([]string, len(t.group))
	for i, m := range t.group {
		keys[i] = m.key
	}
	return keys
}

// set records what the ticket knows of its keys: for every key of a group,
// which shares it.
func (t *Ticket) set(state keyState, rev int64) {
	t.state, t.rev = state, rev
}

// Rev returns the key's create revision, the fencing token, once the key
// is known to be put; 0 otherwise.
func (t *Ticket) Rev() int64 { return t.rev }

// Contended reports whether the acquisition found another holder first.
func (t *Ticket) Contended() bool { return t.contended }

// MayBeInEtcd reports whether the key is, or may yet be, in etcd: a failed
// acquisition must then delete it.
func (t *Ticket) MayBeInEtcd() bool { return t.state != keyAbsent }

// sent records that a Txn that may put our key is about to be sent: until
// its reply comes, the key may be put.
func (t *Ticket) sent() { t.set(keyUnsure, 0) }

// unsent records the error of a Txn that may have put our key: where etcd
// refused it, nothing was put, and nothing can be later.
func (t *Ticket) unsent(err error) {
	if t.state == keyUnsure && refused(err) {
		t.set(keyAbsent, 0)
	}
}

// put is the Op that puts our key with the lease.
func (t *Ticket) put() clientv3.Op {
	return clientv3.OpPut(t.key, t.value, clientv3.WithLease(t.c.Lease.ID()))
}

// Acquire puts our keys in their queues and waits until it holds in each
// (WaitForever), or until ctx ends, or not at all (TryOnly: then it writes
// nothing when blocked, and returns ErrBusy). A key deleted while it waits
// (by hand, or by a revoke the lease has yet to see) is queued again, as a
// new key; a group deletes its other keys first and queues them all again,
// at one new revision. On failure the keys may be in etcd (MayBeInEtcd):
// the caller deletes them.
func (t *Ticket) Acquire(ctx context.Context, wait time.Duration) error {
	budget := &waitBudget{wait: wait}
	err := t.enter(ctx, budget)
	for errors.Is(err, ErrKeyGone) && ctx.Err() == nil && !t.c.Lease.Expired() {
		if len(t.group) > 1 {
			if _, err = t.Delete(ctx); err != nil {
				break
			}
		}
		// A revoked lease fails the put with ErrLeaseNotFound.
		t.set(keyAbsent, 0)
		err = t.enter(ctx, budget)
	}
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.c.Lease.Gone()
	}
	return err
}

// enter puts our keys in their queues and waits for their turn, within
// what is left of budget.
func (t *Ticket) enter(ctx context.Context, budget *waitBudget) error {
	wait := budget.wait
	var ps []place
	var err error
	var early *watching
	if wait == TryOnly {
		ps, err = t.try(ctx)
	} else {
		early = t.watchEarly(ctx)
		defer early.stop()
		ps, err = t.enqueue(ctx)
		if err == nil && t.rule.limit > 0 {
			t.rule.nearHead.Store(ps[0].turn != nil)
		}
	}
	switch {
	case err != nil:
		return err
	case slices.ContainsFunc(ps, func(p place) bool { return p.verdict == gone }):
		return ErrKeyGone
	case !slices.ContainsFunc(ps, func(p place) bool { return p.verdict != held }):
		return nil
	}
	t.contended = true
	if wait == TryOnly {
		return ErrBusy
	}
	for i, m := range t.group {
		// A waiter behind ours watches ours only if it found more than
		// NearHead-1 keys waiting ahead of it, ours one of them; keys
		// only leave, so ours had as many ahead when it was put, or when
		// the read that placed it ran, if a later one.
		m.chained = ps[i].verdict == blocked && (ps[i].ahead >= NearHead-1 || ps[i].seen != m.rev)
	}
	// One queue after the other: once a queue holds our key, it holds it
	// until the key goes, for only older keys block it, and they only ever
	// go.
	for i, m := range t.group {
		if ps[i].verdict == held {
			continue
		}
		// The place came from the acquire Txn: nobody was behind us.
		wctx, cancel := budget.context(ctx)
		p, err := m.wait(wctx, ps[i], early)
		cancel()
		switch {
		case err != nil:
			return err
		case p.verdict == gone:
			return ErrKeyGone
		case p.next && m.chained:
			if err := m.promote(ctx); err != nil {
				return err
			}
		}
		if len(t.group) > 1 {
			if err := t.reread(ctx, ps, i+1); err != nil {
				return err
			}
		}
	}
	return nil
}

// reread reads again the places of a group's queues from the one at from on
// that did not say held, in one Txn guarded by every key of ours still being
// there (one may have gone while we waited for another queue): ErrKeyGone if
// one has. The holders that those queues waited for have often gone
// meanwhile: a holder of several of our names releases them at once.
func (t *Ticket) reread(ctx context.Context, ps []place, from int) error {
	var todo []int
	var ops []clientv3.Op
	for j := from; j < len(t.group); j++ {
		if ps[j].verdict != held {
			todo = append(todo, j)
			ops = append(ops, t.group[j].rule.older(t.rev, false)...)
		}
	}
	resp, err := t.c.KV.Txn(ctx).If(t.Ours()...).Then(ops...).Commit()
	if err := guarded(resp, err); err != nil {
		return err
	}
	if resp.Header == nil || len(resp.Responses) != len(ops) {
		return ErrMalformed
	}
	replies := resp.Responses
	for _, j := range todo {
		m := t.group[j]
		n := len(m.rule.older(t.rev, false))
		p, err := m.rule.placeOlder(replies[:n], t.rev, resp.Header.Revision, false)
		if err == nil && p.verdict == unread {
			p, err = m.read(ctx)
		}
		if err != nil {
			return err
		}
		ps[j], replies = p, replies[n:]
	}
	return nil
}

// Ours returns the compares that each of our keys is in etcd, put at rev:
// all true while the ticket holds.
func (t *Ticket) Ours() []clientv3.Cmp {
	cmps := make([]clientv3.Cmp, len(t.group))
	for i, m := range t.group {
		cmps[i] = clientv3.Compare(clientv3.CreateRevision(m.key), "=", m.rev)
	}
	return cmps
}

// enqueueOps returns what every Txn that may put our keys carries: the
// compares that each key is absent, and, fenced, that the fence is at
// fence; and the Ops that put every key and then read the newest keys of
// each queue.
func (t *Ticket) enqueueOps(fence int64, fenced bool) ([]clientv3.Cmp, []clientv3.Op) {
	cmps := make([]clientv3.Cmp, 0, len(t.group)+1)
	ops := make([]clientv3.Op, 0, 2*len(t.group))
	var reads []clientv3.Op
	for _, m := range t.group {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(m.key), "=", 0))
		ops = append(ops, m.put())
		reads = append(reads, m.rule.newest()...)
	}
	if fenced {
		cmps = append(cmps, t.c.unfenced(fence))
	}
	return cmps, append(ops, reads...)
}

// enqueue puts our keys, if none is there, and reads their places, in one
// Txn. (A compare on the prefix being empty could save the read when nobody
// holds, but etcd reads every key of the range to compare it: with a long
// queue, each enqueue would read all of it.)
func (t *Ticket) enqueue(ctx context.Context) ([]place, error) {
	// D3: if ctx ends while etcd applies the Txn, wait a little for the
	// reply rather than guess: a known revision makes the cleanup fenced, and
	// a cleanup sent while the Txn is still in flight could be applied first.
	rctx, cancel := graceContext(ctx, replyGrace)
	defer cancel()
	var ps []place
	for moved := true; moved; {
		fence, fenced := t.c.fenceRev.Load(), !t.c.fenceOff.recent(t.c.TTL)
		mine := make([]clientv3.Op, len(t.group), len(t.group)+1)
		for i, m := range t.group {
			mine[i] = clientv3.OpGet(m.key)
		}
		if fenced {
			mine = append(mine, t.c.readFence())
		}
		t.sent()
		cmps, ops := t.enqueueOps(fence, fenced)
		resp, err := t.c.KV.Txn(rctx).If(cmps...).Then(ops...).Else(mine...).Commit()
		if err != nil {
			// D3: the Txn may have been applied though the reply was
			// lost, or may be applied later: the keys stay unsure, unless
			// etcd refused it.
			t.unsent(err)
			if t.state == keyAbsent && t.narrow(rctx, err, fenced) {
				continue // refused, so not applied: send it again without
			}
			return nil, err
		}
		if ps, moved, err = t.placed(resp, fence, fenced); err != nil {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for i, m := range t.group {
		if ps[i].verdict == unread {
			// Our key was already there (WithLease), or the keys the Txn
			// read could not tell our place (D11): read it.
			var err error
			if ps[i], err = m.read(ctx); err != nil {
				return nil, err
			}
		}
	}
	return ps, nil
}

// try puts our keys only if they would hold at once, and writes nothing
// otherwise: the first Txn assumes every queue is empty; if one is not, its
// reply says whether the keys there block us, and the next Txn puts our keys
// only if no key was added since that read. A Txn that may put goes through
// etcd's raft log even when its compare fails, so after a try of a rule
// found its queue blocked, the next one reads first (a read-only Txn, no
// raft): a lock polled while held costs one read a try.
func (t *Ticket) try(ctx context.Context) (ps []place, err error) {
	defer func() {
		for i, m := range t.group {
			m.rule.busy.Store(err == nil && i < len(ps) && ps[i].verdict == blocked)
		}
	}()
	rctx, cancel := graceContext(ctx, replyGrace)
	defer cancel()
	// The first Txn assumes every queue empty: a key alone holds, whatever
	// the limit (limit.go).
	var unchanged []clientv3.Cmp
	readFirst := false
	for _, m := range t.group {
		unchanged = append(unchanged, clientv3.Compare(clientv3.CreateRevision(m.rule.blocking), "=", 0).WithPrefix())
		readFirst = readFirst || m.rule.busy.Load()
	}
	for ; ; readFirst = false {
		txn := t.c.KV.Txn(rctx)
		fence, fenced := t.c.fenceRev.Load(), !t.c.fenceOff.recent(t.c.TTL)
		var blockers []clientv3.Op
		for _, m := range t.group {
			blockers = append(blockers, m.blockers()...)
		}
		if fenced {
			blockers = append(blockers, t.c.readFence())
		}
		if readFirst {
			txn = txn.Then(blockers...)
		} else {
			t.sent()
			cmps, ops := t.enqueueOps(fence, fenced)
			txn = txn.If(append(slices.Clone(unchanged), cmps...)...).Then(ops...).Else(blockers...)
		}
		resp, err := txn.Commit()
		if err != nil {
			t.unsent(err)
			if t.state == keyAbsent && t.narrow(rctx, err, fenced) {
				// Refused, so not applied: try again, from the start,
				// without what the role may not read.
				return t.try(ctx)
			}
			return nil, err
		}
		if resp == nil || resp.Header == nil {
			return nil, ErrMalformed
		}
		if resp.Succeeded && !readFirst {
			ps, _, err := t.placed(resp, fence, fenced)
			for i, m := range t.group {
				if err == nil && ps[i].verdict == unread {
					ps[i], err = m.read(ctx)
				}
			}
			return ps, err
		}
		if !readFirst {
			t.set(keyAbsent, 0) // the compare failed: nothing was put
		}
		if len(resp.Responses) != len(blockers) {
			return nil, ErrMalformed
		}
		if fenced {
			moved, err := t.c.fenceMoved(resp.Responses[len(blockers)-1], fence)
			switch {
			case err != nil:
				return nil, err
			case moved && !readFirst:
				// A delete of an unsure put fenced our Txn: try again.
				continue
			}
		}
		ps := make([]place, len(t.group))
		free := true
		replies := resp.Responses
		for i, m := range t.group {
			n := len(m.blockers())
			p, adopt, err := m.blocked(ctx, replies[:n], resp.Header.Revision)
			switch {
			case adopt:
				return t.enqueue(ctx)
			case err != nil:
				return nil, err
			}
			ps[i], replies = p, replies[n:]
			free = free && p.verdict == held
		}
		if !free {
			return ps, nil
		}
		unchanged = unchanged[:0]
		for i, m := range t.group {
			unchanged = append(unchanged, m.rule.unchangedSince(ps[i].seen)...)
		}
	}
}

// blockers are the Ops of a try that read our key and what blocks a key put
// now.
func (t *Ticket) blockers() []clientv3.Op {
	return append([]clientv3.Op{clientv3.OpGet(t.key, clientv3.WithKeysOnly())}, t.rule.oldest()...)
}

// blocked reads the replies of blockers, read at revision seen: the place a
// key put now would have, or adopt when our key is there already
// (WithLease: take it as it is).
func (t *Ticket) blocked(ctx context.Context, replies []*pb.ResponseOp, seen int64) (p place, adopt bool, err error) {
	mine := replies[0].GetResponseRange()
	if mine == nil {
		return place{}, false, ErrMalformed
	}
	if len(mine.Kvs) > 0 {
		return place{}, true, nil
	}
	p, err = t.rule.placeFirst(replies[1:], seen)
	if err == nil && p.verdict == unread {
		// A nested key came first (D11): read every key.
		p, err = t.readAll(ctx)
	}
	return p, false, err
}

// placed reads the reply of a Txn that put our keys if they were absent and
// (fenced) the fence at fence, and then read the rules' newest keys, or else
// read our keys and (fenced) the fence: a place per key, or moved when the
// fence had moved
// (nothing was put: send again). It sets the keys' rev. A place is unread
// when the reply could not tell it.
func (t *Ticket) placed(resp *clientv3.TxnResponse, fence int64, fenced bool) (ps []place, moved bool, err error) {
	if resp == nil || resp.Header == nil || resp.Header.Revision <= 0 {
		return nil, false, ErrMalformed
	}
	ps = make([]place, len(t.group))
	if !resp.Succeeded {
		if fenced {
			if len(resp.Responses) != len(t.group)+1 {
				return nil, false, ErrMalformed
			}
			if moved, err := t.c.fenceMoved(resp.Responses[len(t.group)], fence); err != nil || moved {
				t.set(keyAbsent, 0)
				return nil, moved, err
			}
		} else if len(resp.Responses) != len(t.group) {
			return nil, false, ErrMalformed
		}
		// Our keys were already there: left by an earlier process with this
		// lease (WithLease). Adopt them, as concurrency.Mutex does; a
		// group's only if all are there at one revision, as one
		// acquisition of the same keys put them.
		var rev int64
		for _, reply := range resp.Responses[:len(t.group)] {
			mine := reply.GetResponseRange()
			switch {
			case mine == nil || len(mine.Kvs) > 1 || (len(mine.Kvs) == 1 && mine.Kvs[0].CreateRevision <= 0):
				return nil, false, ErrMalformed
			case len(t.group) == 1 && len(mine.Kvs) == 0:
				return nil, false, ErrMalformed
			case len(mine.Kvs) == 0 || (rev != 0 && rev != mine.Kvs[0].CreateRevision):
				t.set(keyAbsent, 0)
				return nil, false, ErrForeignKeys
			}
			rev = mine.Kvs[0].CreateRevision
		}
		t.set(keyPut, rev)
		return ps, false, nil
	}
	want := len(t.group)
	for _, m := range t.group {
		want += len(m.rule.newest())
	}
	if len(resp.Responses) != want {
		return nil, false, ErrMalformed
	}
	t.set(keyPut, resp.Header.Revision)
	replies := resp.Responses[len(t.group):]
	for i, m := range t.group {
		n := len(m.rule.newest())
		p, err := m.rule.placeNew(m.key, replies[:n], t.rev)
		if err != nil {
			return nil, false, err
		}
		ps[i], replies = p, replies[n:]
	}
	return ps, false, nil
}

// read reads our place: one linearizable read, and no write, guarded by our
// key, so that it says gone if our key is no longer in etcd (the post-wait
// check of etcd #16221 / #19597).
func (t *Ticket) read(ctx context.Context) (place, error) {
	for _, full := range []bool{false, true} {
		ops := t.rule.older(t.rev, full)
		resp, err := t.c.KV.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(t.key), "=", t.rev)).
			Then(ops...).
			Commit()
		if err != nil {
			return place{}, err
		}
		if resp == nil || resp.Header == nil {
			return place{}, ErrMalformed
		}
		if !resp.Succeeded {
			return place{verdict: gone, seen: resp.Header.Revision}, nil
		}
		if len(resp.Responses) != len(ops) {
			return place{}, ErrMalformed
		}
		p, err := t.rule.placeOlder(resp.Responses, t.rev, resp.Header.Revision, full)
		if err != nil || p.verdict != unread {
			return p, err
		}
	}
	return place{}, ErrMalformed
}

// readAll reads the place a key put now would have, from every key of the
// queue; the place's seen is the revision of the read.
func (t *Ticket) readAll(ctx context.Context) (place, error) {
	ops := t.rule.every()
	resp, err := t.c.KV.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return place{}, err
	}
	if resp == nil || resp.Header == nil || len(resp.Responses) != len(ops) {
		return place{}, ErrMalformed
	}
	return t.rule.placeAll(resp.Responses, resp.Header.Revision)
}
