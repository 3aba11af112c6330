package etcdlock

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/etcdlock/etcdlock/internal/queue"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A term's loss watch: one goroutine per lease term (and the few it starts
// to open a watch or read), while any of its holds
// has a loss signal, watches for all of them. Keep-alive silence is the
// lease's, so one timer serves every hold; one watch of deletes over the
// longest prefix shared by their keys (once they are in queues of
// unrelated names, or where etcd refuses that watch, one per lock queue)
// sees any of them deleted; and the safety re-read, once a
// TTL, reads their keys 128 to a Txn (etcd's default limit of operations
// in a Txn).

const (
	// lossReadTimeout bounds the read that tells a deleted key from a
	// lease gone, for the observers.
	lossReadTimeout = 500 * time.Millisecond
	// lossReadBatch is how many keys one Txn of the safety re-read reads.
	lossReadBatch = 128
	// lossRetry is how soon a full read that failed is tried again while
	// no watch runs.
	lossRetry = time.Second
	// lossRebreak is the first pause before the read that restarts watches
	// that broke again within a TTL of their last break.
	lossRebreak = 100 * time.Millisecond
)

// A lossTerm is what a loss watch needs of the lease term it watches for
// (lease.go): its context, which ends with the term; the time left before
// the early warning; its TTL; its client; and whether its lease is gone.
type lossTerm interface {
	ctx() context.Context
	untilSilent() time.Duration
	lossTTL() time.Duration
	lossClient() *clientv3.Client
	leaseGone() bool
}

// A watched is one response of a watch, or its close (ok false).
type watched struct {
	wr clientv3.WatchResponse
	ok bool
}

// forward passes wch's responses to out, then its close, each as wrap
// makes it, until ctx ends.
func forward[T any](ctx context.Context, wch clientv3.WatchChan, out chan<- T, wrap func(watched) T) {
	for {
		wr, ok := <-wch
		select {
		case out <- wrap(watched{wr, ok}):
		case <-ctx.Done():
			return
		}
		if !ok {
			return
		}
	}
}

// A lossSubject is what a loss watch watches: a hold whose loss signal was
// asked for.
type lossSubject interface {
	// lossKeys returns its keys in etcd; lossToken, the create revision
	// they all share.
	lossKeys() []string
	lossToken() int64
	// signal closes its loss signal for why, at once, and reports whether
	// the loss is to be reported (the hold had not ended).
	signal(why LossReason) bool
	// report tells the observers, and deletes a capped hold's key; it may
	// block for a bounded time. leaseGone asks etcd, once for all the
	// holds lost together, whether the lease is gone.
	report(why LossReason, leaseGone func() bool)
}

// A lossWatch watches the holds of one term for their loss. The zero
// lossWatch is ready; its goroutine runs while it has subjects.
type lossWatch struct {
	mu       sync.Mutex
	running  bool // the goroutine runs; it sets false as it leaves
	subjects map[lossSubject]struct{}
	byKey    map[string][]lossSubject // the subjects of each key
	fresh    []lossSubject            // added since the goroutine last looked
	capped   []lossSubject            // whose cap has passed (maxhold.go)
	prefix   string                   // shared by every key added since the goroutine started: it only shortens
	wake     chan struct{}            // tells the goroutine to look (capacity 1)
	// perQueue counts the keys watched of each lock queue (name/), and
	// emptied lists the queues whose count fell to 0 since the goroutine
	// last looked: their watches, where there is one a queue, stop.
	perQueue map[string]int
	emptied  []string
}

// add watches sub for the loss of its hold, on the term tm, starting the
// goroutine with start (Session.goBackground) if it does not run. It
// reports false, and watches nothing, where start refuses.
func (w *lossWatch) add(tm lossTerm, sub lossSubject, start func(func()) bool) bool {
	keys := sub.lossKeys()
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.running {
		if w.wake == nil {
			w.wake = make(chan struct{}, 1)
		}
		w.subjects, w.byKey, w.perQueue = make(map[lossSubject]struct{}), make(map[string][]lossSubject), make(map[string]int)
		w.prefix = keys[0]
		if !start(func() { w.run(tm) }) {
			return false
		}
		w.running = true
	}
	w.subjects[sub] = struct{}{}
	for _, k := range keys {
		if len(w.byKey[k]) == 0 {
			w.perQueue[queue.PrefixOf(k)]++
		}
		w.byKey[k] = append(w.byKey[k], sub)
		w.prefix = sharedPrefix(w.prefix, k)
	}
	w.fresh = append(w.fresh, sub)
	w.poke()
	return true
}

// remove stops watching sub: its hold ended.
func (w *lossWatch) remove(sub lossSubject) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.drop(sub) && len(w.subjects) == 0 {
		w.poke() // the goroutine may end
	}
}

// capReached marks sub as past its cap.
func (w *lossWatch) capReached(sub lossSubject) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.subjects[sub]; ok {
		w.capped = append(w.capped, sub)
		w.poke()
	}
}

// dropped drops the subjects of notes, and returns the notes of those it
// dropped: a subject noted twice (a hold of several keys deleted together)
// is lost once. w.mu must be held.
func (w *lossWatch) dropped(notes []lossNote) []lossNote {
	kept := notes[:0]
	for _, n := range notes {
		if w.drop(n.sub) {
			kept = append(kept, n)
		}
	}
	return kept
}

// drop forgets sub, with w.mu held; it reports whether sub was watched.
func (w *lossWatch) drop(sub lossSubject) bool {
	if _, ok := w.subjects[sub]; !ok {
		return false
	}
	delete(w.subjects, sub)
	for _, k := range sub.lossKeys() {
		left := w.byKey[k]
		for i, s := range left {
			if s == sub {
				left = append(left[:i], left[i+1:]...)
				break
			}
		}
		if len(left) == 0 {
			delete(w.byKey, k)
			q := queue.PrefixOf(k)
			if w.perQueue[q]--; w.perQueue[q] <= 0 {
				delete(w.perQueue, q)
				w.emptied = append(w.emptied, q)
			}
		} else {
			w.byKey[k] = left
		}
	}
	return true
}

// poke wakes the goroutine, with w.mu held.
func (w *lossWatch) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// sharedPrefix returns the longest prefix of a and b.
func sharedPrefix(a, b string) string {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return a[:i]
		}
	}
	return a[:n]
}

// A lossNote is a subject found lost, and why.
type lossNote struct {
	sub lossSubject
	why LossReason
}

// lossRun is the state of one run of a loss watch's goroutine, which only
// that goroutine touches.
type lossRun struct {
	w   *lossWatch
	tm  lossTerm
	ctx context.Context // the run's reads' and watches': ends with the run

	// The watches: one of the prefix every key shares; or, once the keys
	// are in queues of unrelated names (that prefix would bring deletes
	// from anywhere between them: group), or etcd has refused that watch
	// (its authentication grants the lock's queues, not what lies between
	// them), one per lock queue (name/) of the keys.
	streams map[string]*lossStream // by prefix
	events  chan streamed          // every watch's responses
	grouped bool                   // one watch per lock queue
	// broken: a watch ended (its history compacted, or it failed), or the
	// shared prefix shortened; a full read started since restarts them all.
	// breaks counts the times, so that a read started before is not taken
	// for one: it could have missed a hold added meanwhile.
	broken bool
	breaks int
	soon   *time.Timer // a full read again, soon, while broken and the last one failed
	// lastBreak and inRow: when the watches last broke, and how many
	// breaks came each within a TTL of the one before.
	lastBreak time.Time
	inRow     int

	// The reads: one round at a time, by a goroutine of its own.
	reading  bool
	results  chan lossRead
	fullDue  bool          // read every key next round
	checkDue []lossSubject // read these next round: added after a watch passed their creation

	work sync.WaitGroup // the forwarders, readers and reporters of this run
}

// A lossStream is one watch of deletes under a prefix, opened by a
// goroutine that passes its responses on: opening a watch blocks while
// etcd is unreachable, and must not hold up the silence timer.
type lossStream struct {
	prefix string
	stop   context.CancelFunc
	seen   int64 // it has passed every event up to this revision
}

// A streamed is one response of a lossStream, or its close.
type streamed struct {
	st  *lossStream
	res watched
}

// A lossRead is what a round of reads found: for each key read, the
// revision of its Txn and its create revision (0: absent); rev 0, unread.
type lossRead struct {
	full  bool
	gen   int // r.breaks when it started
	keys  []string
	found []readAt
}

type readAt struct{ rev, create int64 }

// run watches the term's subjects until none is left, or the term ends,
// which loses them all.
func (w *lossWatch) run(tm lossTerm) {
	ctx := tm.ctx()
	rctx, cancel := context.WithCancel(ctx)
	r := &lossRun{w: w, tm: tm, ctx: rctx, streams: make(map[string]*lossStream), events: make(chan streamed), results: make(chan lossRead, 1)}
	defer r.work.Wait()
	defer cancel()
	defer r.unwatch()
	// The silence timer is armed while the lease has time left before the
	// early warning: a hold added after it, when etcd has acknowledged a
	// keep-alive again, arms it anew.
	silence := time.NewTimer(tm.untilSilent())
	defer silence.Stop()
	armed := true
	reread := time.NewTicker(tm.lossTTL())
	defer reread.Stop()
	r.soon = time.NewTimer(time.Hour)
	r.soon.Stop()
	defer r.soon.Stop()
	for {
		select {
		case <-ctx.Done():
			r.loseAll(LossSessionClosed)
		case <-w.wake:
			r.look()
		case <-r.soon.C:
			r.fullDue = true
		case ev := <-r.events:
			r.watched(ev.st, ev.res)
		case got := <-r.results:
			r.reading = false
			r.judge(got)
		case <-reread.C:
			r.fullDue = true
		case <-silence.C:
			armed = false
		}
		if r.done() {
			return
		}
		d := tm.untilSilent()
		if d <= 0 && ctx.Err() == nil {
			r.loseAll(LossKeepAliveSilent)
			if r.done() {
				return
			}
		}
		if !armed && d > 0 {
			silence.Reset(d)
			armed = true
		}
		r.read()
	}
}

// done reports whether the run ends: no subject is left. It then marks the
// goroutine as gone, so that the next add starts another.
func (r *lossRun) done() bool {
	w := r.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.subjects) > 0 {
		return false
	}
	w.running, w.fresh, w.capped, w.emptied = false, nil, nil, nil
	return true
}

// prefixOf returns the prefix of the watch that is to cover key: the one
// every key shares, w.prefix (with w.mu held); grouped, key's queue's.
func (r *lossRun) prefixOf(key string) string {
	if r.grouped {
		return queue.PrefixOf(key)
	}
	return r.w.prefix
}

// streamOf returns the watch that covers key, or nil.
func (r *lossRun) streamOf(key string) *lossStream {
	if r.grouped {
		return r.streams[queue.PrefixOf(key)]
	}
	for _, st := range r.streams {
		if strings.HasPrefix(key, st.prefix) {
			return st
		}
	}
	return nil
}

// look takes the subjects added and capped since the last look: the capped
// are lost; the added are watched, from their creation on, by a watch
// opened or reopened for them where none covers them, and read once where
// one covers them but has passed their creation.
func (r *lossRun) look() {
	r.group()
	w := r.w
	w.mu.Lock()
	fresh, capped, emptied := w.fresh, w.capped, w.emptied
	w.fresh, w.capped, w.emptied = nil, nil, nil
	if r.grouped {
		// A queue with no key watched any more: its watch stops.
		for _, q := range emptied {
			if st := r.streams[q]; st != nil && w.perQueue[q] == 0 {
				st.stop()
				delete(r.streams, q)
			}
		}
	}
	var lost []lossNote
	for _, sub := range capped {
		if w.drop(sub) {
			lost = append(lost, lossNote{sub, LossMaxHold})
		}
	}
	open := make(map[string]int64) // prefix: from
	for _, sub := range fresh {
		if _, ok := w.subjects[sub]; !ok {
			continue
		}
		if r.broken {
			// None runs until a read restarts them: read it.
			r.checkDue = append(r.checkDue, sub)
			continue
		}
		tok := sub.lossToken()
		check := false
		for _, k := range sub.lossKeys() {
			switch st := r.streamOf(k); {
			case st == nil:
				p := r.prefixOf(k)
				if from, ok := open[p]; !ok || tok+1 < from {
					open[p] = tok + 1
				}
			case tok < st.seen:
				// It may have passed the delete before it was ours to
				// judge.
				check = true
			}
		}
		if check {
			r.checkDue = append(r.checkDue, sub)
		}
	}
	w.mu.Unlock()
	r.lose(lost)
	for p, from := range open {
		if !r.grouped && len(r.streams) > 0 {
			// The shared prefix is shorter. Reopening the watch from
			// where the old one was would replay every delete under the
			// new prefix since then: the watch restarts from a read of
			// every key instead, as after a break (the holds added
			// meanwhile are read too).
			r.unwatch()
			r.breakWatch()
			break
		}
		r.watch(p, from)
	}
}

// group turns a run that watches the prefix its keys share into one that
// watches each lock queue of them, once its keys are in lock queues of
// unrelated names: queues whose names share no parent ("alpha/job" and
// "beta/job", not "jobs/a" and "jobs/b"), so that the prefix the keys
// share has no "/" (often it is ""). Its watch would bring deletes from
// anywhere between them, up to every delete in etcd, and each widening a
// read of every key. Holds of names under one parent keep the one watch
// of that parent (a watch per queue costs a goroutine and a watcher in
// etcd). Each queue's watch starts where the shared one had passed.
func (r *lossRun) group() {
	w := r.w
	w.mu.Lock()
	spread := len(w.perQueue) > 1 && !strings.Contains(w.prefix, "/")
	w.mu.Unlock()
	if r.grouped || !spread {
		return
	}
	r.grouped = true
	for _, st := range r.streams { // the shared prefix's, if it runs
		r.unwatch()
		r.rewatch(st.seen + 1)
		return
	}
}

// breakWatch marks the watches as needing a full read, started from now
// on, to restart them.
func (r *lossRun) breakWatch() {
	r.broken = true
	r.breaks++
	// Watches that fail as soon as they are opened again (refused, or
	// compacted as they start) would cost a read of every key and a watch
	// each time: a break within a TTL of the last one waits before its
	// read, 100 ms doubled with each such break, up to the TTL (the period
	// of the safety re-read, which reads meanwhile).
	if time.Since(r.lastBreak) > r.tm.lossTTL() {
		r.inRow = 0
	}
	r.lastBreak = time.Now()
	if r.inRow == 0 {
		r.fullDue = true
	} else {
		r.soon.Reset(min(lossRebreak<<min(r.inRow-1, 16), r.tm.lossTTL()))
	}
	r.inRow++
}

// watch opens the watch of deletes under prefix, from revision from.
func (r *lossRun) watch(prefix string, from int64) {
	ctx, cancel := context.WithCancel(r.ctx)
	st := &lossStream{prefix: prefix, stop: cancel, seen: from - 1}
	r.streams[prefix] = st
	client, out := r.tm.lossClient(), r.events
	r.work.Go(func() {
		wch := client.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithFilterPut())
		forward(ctx, wch, out, func(w watched) streamed { return streamed{st, w} })
	})
}

// unwatch stops every watch.
func (r *lossRun) unwatch() {
	for p, st := range r.streams {
		st.stop()
		delete(r.streams, p)
	}
}

// rewatch opens the watches of every key from revision from.
func (r *lossRun) rewatch(from int64) {
	w := r.w
	w.mu.Lock()
	prefixes := map[string]bool{w.prefix: true}
	if r.grouped {
		clear(prefixes)
		for k := range w.byKey {
			prefixes[queue.PrefixOf(k)] = true
		}
	}
	w.mu.Unlock()
	for p := range prefixes {
		r.watch(p, from)
	}
}

// watched judges one response of the watch st: a delete of a key after a
// subject's creation loses it. A watch that ends (compacted, failed) is
// replaced, with the others, after a read of every key, from that read;
// one etcd refuses, of the shared prefix, by one watch per lock queue.
func (r *lossRun) watched(st *lossStream, res watched) {
	if r.streams[st.prefix] != st {
		return // stopped since
	}
	wr := res.wr
	if err := wr.Err(); !res.ok || err != nil || wr.Canceled {
		r.unwatch()
		if !r.grouped && refused(err) {
			r.grouped = true
			r.rewatch(st.seen + 1)
			return
		}
		r.breakWatch()
		return
	}
	w := r.w
	var lost []lossNote
	w.mu.Lock()
	for _, ev := range wr.Events {
		if ev.Kv == nil {
			continue
		}
		st.seen = max(st.seen, ev.Kv.ModRevision)
		if ev.Type != mvccpb.DELETE {
			continue
		}
		for _, sub := range w.byKey[string(ev.Kv.Key)] {
			// Events at or before its creation are an earlier key of the
			// same name, from a watch served by a member that lags.
			if ev.Kv.ModRevision > sub.lossToken() {
				lost = append(lost, lossNote{sub, LossKeyDeleted})
			}
		}
	}
	lost = w.dropped(lost)
	w.mu.Unlock()
	r.lose(lost)
}

// read starts a round of reads if one is due and none is under way.
func (r *lossRun) read() {
	if r.reading || (!r.fullDue && len(r.checkDue) == 0) {
		return
	}
	w := r.w
	w.mu.Lock()
	var keys []string
	if r.fullDue {
		keys = make([]string, 0, len(w.byKey))
		for k := range w.byKey {
			keys = append(keys, k)
		}
	} else {
		for _, sub := range r.checkDue {
			if _, ok := w.subjects[sub]; ok {
				keys = append(keys, sub.lossKeys()...)
			}
		}
	}
	w.mu.Unlock()
	full := r.fullDue
	r.fullDue, r.checkDue = false, nil
	if len(keys) == 0 {
		return
	}
	r.reading = true
	ctx, tm, out := r.ctx, r.tm, r.results
	gen := r.breaks
	r.work.Go(func() { out <- lossRead{full: full, gen: gen, keys: keys, found: readHeld(ctx, tm, keys)} })
}

// readHeld reads keys, lossReadBatch to a Txn, and returns what it found
// of each; it stops at the first Txn that fails. Each Txn ends by the point
// of keep-alive silence, and none is sent after it: etcd unreachable then
// is what the silence timer reports.
func readHeld(ctx context.Context, tm lossTerm, keys []string) []readAt {
	found := make([]readAt, len(keys))
	ops := make([]clientv3.Op, 0, lossReadBatch)
	for i := 0; i < len(keys); i += lossReadBatch {
		batch := keys[i:min(i+lossReadBatch, len(keys))]
		d := min(tm.lossTTL()/3, tm.untilSilent())
		if d <= 0 {
			break
		}
		ops = ops[:0]
		for _, k := range batch {
			ops = append(ops, clientv3.OpGet(k, clientv3.WithKeysOnly()))
		}
		rctx, cancel := context.WithTimeout(ctx, d)
		resp, err := tm.lossClient().Txn(rctx).Then(ops...).Commit()
		cancel()
		if err != nil || resp == nil || resp.Header == nil || len(resp.Responses) != len(batch) {
			break
		}
		for j, op := range resp.Responses {
			rr := op.GetResponseRange()
			if rr == nil {
				continue
			}
			at := readAt{rev: resp.Header.Revision}
			if len(rr.Kvs) > 0 {
				at.create = rr.Kvs[0].CreateRevision
			}
			found[i+j] = at
		}
	}
	return found
}

// judge loses the subjects whose key a read found absent, or put again
// since their creation. A full read that read every key restarts a watch
// that had ended, from the read.
func (r *lossRun) judge(got lossRead) {
	w := r.w
	var lost []lossNote
	complete := true
	var oldest int64
	w.mu.Lock()
	for i, k := range got.keys {
		at := got.found[i]
		if at.rev == 0 {
			complete = false
			continue
		}
		if oldest == 0 || at.rev < oldest {
			oldest = at.rev
		}
		for _, sub := range w.byKey[k] {
			// A subject created after the read is not judged by it.
			if tok := sub.lossToken(); tok <= at.rev && at.create != tok {
				lost = append(lost, lossNote{sub, LossKeyDeleted})
			}
		}
	}
	lost = w.dropped(lost)
	w.mu.Unlock()
	r.lose(lost)
	switch {
	case !r.broken || !got.full || got.gen != r.breaks:
		// Not a read that can restart the watches: one started before
		// the last break may have missed a hold added since.
	case complete && oldest > 0:
		r.broken = false
		r.rewatch(oldest + 1)
	default:
		// Unknown: read again soon; the silence timer runs meanwhile.
		r.soon.Reset(lossRetry)
	}
}

// loseAll loses every subject, for why.
func (r *lossRun) loseAll(why LossReason) {
	w := r.w
	w.mu.Lock()
	lost := make([]lossNote, 0, len(w.subjects))
	for sub := range w.subjects {
		lost = append(lost, lossNote{sub, why})
	}
	lost = w.dropped(lost)
	w.mu.Unlock()
	r.lose(lost)
}

// lose closes the loss signals of lost, dropped already, then reports them
// from a goroutine of the run.
func (r *lossRun) lose(lost []lossNote) {
	report := lost[:0]
	for _, n := range lost {
		if n.sub.signal(n.why) {
			report = append(report, n)
		}
	}
	if len(report) == 0 {
		return
	}
	tm := r.tm
	gone := sync.OnceValue(tm.leaseGone)
	var rest []lossNote
	for _, n := range report {
		if n.why == LossMaxHold {
			// Its report deletes its key, which may take a while: the
			// next capped hold's must not wait for it.
			r.work.Go(func() { n.sub.report(n.why, gone) })
			continue
		}
		rest = append(rest, n)
	}
	if len(rest) > 0 {
		r.work.Go(func() {
			for _, n := range rest {
				n.sub.report(n.why, gone)
			}
		})
	}
}

// refused reports whether err, a watch's, says that etcd refused it for
// want of permission. clientv3 passes a cancelled watch's reason on as
// text.
func refused(err error) bool {
	return err != nil && (errors.Is(err, rpctypes.ErrPermissionDenied) || strings.Contains(err.Error(), rpctypes.ErrPermissionDenied.Error()))
}
