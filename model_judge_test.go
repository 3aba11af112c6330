package etcdlock_test

// The judge of the model-based test (model_test.go): every answer is checked
// against etcd, read by a client of its own when the answer is given, and
// against the model's count of what the goroutine holds.
//
//   - held (nil, true, a Permit) ⇒ the hold's keys are in etcd at its token
//     and hold by the primitive's rule, or its Done closes within lossBound;
//     and a goroutine whose Done had closed before it locked again is not
//     answered held;
//   - busy ((false, nil), ErrNoPermit) ⇒ another goroutine held, waited or
//     was acquiring, or etcd had a key of the lock, when the call began or
//     when it returned (a key whose delete is retried in the background is
//     one, until it lands);
//   - ErrLockLost on a lock ⇒ the goroutine held, and its Done closes within
//     lossBound; ErrWouldDeadlock ⇒ it held the lock another way;
//   - an unlock ⇒ ErrNotHeld if and only if the goroutine held nothing;
//   - and once the faults are healed: every key in etcd is a hold of a
//     goroutine (no call left a key behind), at most one fence per lease,
//     and once all is released, nothing under the lock's parent.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/queue"
)

// lossBound is how long after a loss a hold's Done may still be open: 2 s
// (doneBound) once the loss watch sees it, and up to a TTL more where the
// watch lost the event (a partition broke its stream): the loss watch reads
// the held keys once per TTL.
const lossBound = modelTTL + doneBound

// A rule says when keys hold, by their place in their queue.
type rule struct {
	kind   int
	prefix string // the queue; "": each key's own parent
}

const (
	ruleFirst          = iota // the oldest key of its queue (Mutex, writer, MultiMutex)
	ruleNoWriterBefore        // no older key that is not a reader's (RWMutex reader)
	ruleAmongFirst            // among the oldest whose permits fit (Semaphore: n, or its limit record)
)

// A modelCall is what the judge knows of a lock call from before it was made.
type modelCall struct {
	what         string
	names        []string
	prior        modelHold // the goroutine's hold of that kind before
	doneOpen     bool      // the prior hold's Done was still open
	othersBefore bool      // another goroutine held or used the lock, or etcd had a key of it
	epoch        int64     // the world's writeEpoch at the call's start: odd while writes are forbidden
}

func (a *goroutine) begin(what string, names []string, prior modelHold) modelCall {
	others := a.othersActive(names) || len(a.w.keysUnder(names)) > 0
	return modelCall{what: what, names: names, prior: prior, doneOpen: prior.n == 0 || !isClosed(prior.done), othersBefore: others, epoch: a.w.writeEpoch.Load()}
}

// gained judges a call that answered held, and counts the hold in target.
func (a *goroutine) gained(target *modelHold, c modelCall, h modelHold, rl rule) {
	w := a.w
	w.stats.judged.Add(1)
	w.log.add("g%d: %s: held, token %d", a.i, c.what, h.token)
	if c.prior.n > 0 {
		if !c.doneOpen {
			w.t.Errorf("g%d: %s of a hold whose Done had closed: answered held (HoldCount %d), want ErrLockLost", a.i, c.what, c.prior.n)
		}
		if h.token != c.prior.token {
			w.t.Errorf("g%d: %s again: token %d, want the hold's %d", a.i, c.what, h.token, c.prior.token)
		}
	}
	w.judgeHold(a, c.what, h, rl)
	a.mu.Lock()
	defer a.mu.Unlock()
	if target.n == 0 {
		*target = h
	}
	target.n++
}

// refused judges a call that did not answer held: busy (err nil) or err.
func (a *goroutine) refused(c modelCall, err error, wouldDeadlock bool) {
	w := a.w
	w.stats.judged.Add(1)
	w.log.add("g%d: %s: %v", a.i, c.what, orBusy(err))
	switch {
	case err == nil:
		if c.othersBefore || a.othersActive(c.names) {
			return
		}
		if keys := w.keysUnder(c.names); len(keys) == 0 {
			w.t.Errorf("g%d: %s answered busy, but no other goroutine held or used it and etcd has no key of it", a.i, c.what)
		}
	case errors.Is(err, etcdlock.ErrWouldDeadlock):
		if !wouldDeadlock {
			w.t.Errorf("g%d: %s: got ErrWouldDeadlock, but the goroutine holds none of its names another way", a.i, c.what)
		}
	case errors.Is(err, etcdlock.ErrLockLost):
		if c.prior.n == 0 {
			w.t.Errorf("g%d: %s: got ErrLockLost, but the goroutine held nothing", a.i, c.what)
			return
		}
		w.judgeLost(a, c.what, c.prior.done)
	case errors.Is(err, etcdlock.ErrNotHeld), errors.Is(err, etcdlock.ErrInvalidName), errors.Is(err, etcdlock.ErrInvalidArgument):
		w.t.Errorf("g%d: %s: got %v", a.i, c.what, err)
	case errors.Is(err, rpctypes.ErrPermissionDenied) && c.epoch%2 == 0 && w.writeEpoch.Load() == c.epoch:
		w.t.Errorf("g%d: %s: got %v, while the role had every permission README gives", a.i, c.what, err)
	}
	if wouldDeadlock && !errors.Is(err, etcdlock.ErrWouldDeadlock) && err != nil && errors.Is(err, context.DeadlineExceeded) {
		w.t.Errorf("g%d: %s by a goroutine that holds one of its names another way: got %v, want ErrWouldDeadlock", a.i, c.what, err)
	}
}

func orBusy(err error) any {
	if err == nil {
		return "busy"
	}
	return err
}

// unlocked judges an unlock of the hold h.
func (a *goroutine) unlocked(what string, h *modelHold, err error) {
	w := a.w
	w.stats.judged.Add(1)
	w.log.add("g%d: %s: %v", a.i, what, err)
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case h.n == 0 && !errors.Is(err, etcdlock.ErrNotHeld):
		w.t.Errorf("g%d: %s by a goroutine that holds nothing: got %v, want ErrNotHeld", a.i, what, err)
	case h.n == 0:
	case errors.Is(err, etcdlock.ErrNotHeld):
		w.t.Errorf("g%d: %s of a hold (count %d): got ErrNotHeld", a.i, what, h.n)
	default:
		h.n--
		if h.n == 0 {
			*h = modelHold{}
		}
	}
}

// judgeHold checks that h holds in etcd by rl, or that its Done closes
// within lossBound.
func (w *world) judgeHold(a *goroutine, what string, h modelHold, rl rule) {
	ok, detail := w.holds(h, rl)
	if ok {
		return
	}
	if _, closed := closedWithin(h.done, lossBound); !closed {
		w.t.Errorf("g%d: %s answered held, but in etcd %s, and its Done is still open %v later", a.i, what, detail, lossBound)
	}
}

// judgeLost checks that a hold the library says is lost has its Done closed
// within lossBound.
func (w *world) judgeLost(a *goroutine, what string, done <-chan struct{}) {
	if _, closed := closedWithin(done, lossBound); !closed {
		w.t.Errorf("g%d: %s: got ErrLockLost, but the hold's Done is still open %v later", a.i, what, lossBound)
	}
}

// queue reads the keys of a queue, oldest first.
func (w *world) queue(pfx string) []*mvccpb.KeyValue {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	resp, err := w.root.Get(ctx, pfx, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		w.t.Fatalf("judge: read %q: %v", pfx, err)
	}
	return resp.Kvs
}

// holds reports whether every key of h is in etcd at h's token and holds
// by rl, and if not, what etcd has.
func (w *world) holds(h modelHold, rl rule) (bool, string) {
	if len(h.keys) == 0 {
		return false, "no key"
	}
	for _, key := range h.keys {
		pfx := rl.prefix
		if pfx == "" {
			pfx = key[:strings.LastIndex(key, "/")+1]
		}
		kvs := w.queue(pfx)
		i := slices.IndexFunc(kvs, func(kv *mvccpb.KeyValue) bool { return string(kv.Key) == key })
		switch {
		case i < 0:
			return false, fmt.Sprintf("%s is gone (%s)", key, describeQueue(kvs))
		case kvs[i].CreateRevision != h.token:
			return false, fmt.Sprintf("%s has create revision %d, not the token %d", key, kvs[i].CreateRevision, h.token)
		}
		switch rl.kind {
		case ruleFirst:
			if i != 0 {
				return false, fmt.Sprintf("%s is not the oldest (%s)", key, describeQueue(kvs))
			}
		case ruleAmongFirst:
			// The oldest keys whose permits fit within the limit: the
			// record's, if any (keeping the keys up to its revision), else
			// the oldest key's; each weight counted at most the limit.
			limit, keep, _ := w.limitRecord(pfx, limitOf(kvs[0].Value))
			sum := 0
			for _, kv := range kvs[:i+1] {
				sum += min(weightOf(kv.Value), limit)
			}
			if kvs[i].CreateRevision > keep && sum > limit {
				return false, fmt.Sprintf("%s: %d permits up to it, limit %d, kept up to revision %d (%s)", key, sum, limit, keep, describeQueue(kvs))
			}
		case ruleNoWriterBefore:
			for _, kv := range kvs[:i] {
				if !strings.HasPrefix(string(kv.Key), pfx+"read/") {
					return false, fmt.Sprintf("%s has an older writer %s (%s)", key, kv.Key, describeQueue(kvs))
				}
			}
		}
	}
	return true, ""
}

// limitOf returns the limit a permit's key value says it was made with.
func limitOf(value []byte) int {
	var n int
	fmt.Sscanf(string(value), "limit=%d", &n)
	return n
}

// limitRecord reads the limit record of the Semaphore with prefix pfx, as
// written ("limit=N keep=G"): its limit and kept revision, and true; else
// limit, 0 and false.
func (w *world) limitRecord(pfx string, limit int) (int, int64, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	resp, err := w.root.Get(ctx, queue.LimitKey(strings.TrimSuffix(pfx, "/")))
	if err != nil {
		w.t.Fatalf("judge: read the limit record: %v", err)
	}
	if len(resp.Kvs) == 0 {
		return limit, 0, false
	}
	var n int
	var keep int64
	if _, err := fmt.Sscanf(string(resp.Kvs[0].Value), "limit=%d keep=%d", &n, &keep); err != nil {
		w.t.Fatalf("judge: the limit record %q: %v", resp.Kvs[0].Value, err)
	}
	return n, keep, true
}

func describeQueue(kvs []*mvccpb.KeyValue) string {
	if len(kvs) == 0 {
		return "the queue is empty"
	}
	parts := make([]string, len(kvs))
	for i, kv := range kvs {
		parts[i] = fmt.Sprintf("%s@%d", kv.Key, kv.CreateRevision)
	}
	return "queue: " + strings.Join(parts, " ")
}

// keysAt returns the keys of the lock names whose create revision is tok.
func (w *world) keysAt(tok int64, names []string) []string {
	var keys []string
	for _, name := range names {
		for _, kv := range w.queue(name + "/") {
			if kv.CreateRevision == tok {
				keys = append(keys, string(kv.Key))
			}
		}
	}
	return keys
}

// keysUnder returns the keys of the lock names.
func (w *world) keysUnder(names []string) []string {
	var keys []string
	for _, name := range names {
		for _, kv := range w.queue(name + "/") {
			keys = append(keys, string(kv.Key))
		}
	}
	return keys
}

// waitIdle waits until no goroutine has a call under way: every call
// returns within its bound.
func (w *world) waitIdle() {
	deadline := time.Now().Add(testTimeout)
	for {
		busy := 0
		for _, a := range w.actors {
			if a.busy.Load() {
				busy++
			}
		}
		if busy == 0 {
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("%d calls still under way %v after the faults were healed", busy, testTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// strayBound is how long after the faults are healed etcd may still keep
// what it should not: a delete retried with backoff (at most 1 s apart), a
// lease expiring after its client was closed (the TTL).
const strayBound = 2*modelTTL + 2*time.Second

// checkpoint heals every fault, waits for the calls under way, and checks
// that etcd holds what the goroutines hold; final, after they released all.
func (w *world) checkpoint(final bool) {
	w.log.add("checkpoint (final: %v)", final)
	w.heal()
	w.waitIdle()
	if final {
		for _, a := range w.actors {
			a.wait(modelOp{name: "release all", f: (*goroutine).releaseAll})
		}
	}
	for _, a := range w.actors {
		a.mu.Lock()
		holds := []struct {
			what string
			h    modelHold
			rl   rule
		}{
			{"Mutex", a.mutex, rule{kind: ruleFirst, prefix: w.mutexName() + "/"}},
			{"MultiMutex", a.multi, rule{kind: ruleFirst}},
			{"RWMutex write", a.write, rule{kind: ruleFirst, prefix: w.rwName() + "/"}},
			{"RWMutex read", a.read, rule{kind: ruleNoWriterBefore, prefix: w.rwName() + "/"}},
		}
		if a.nested > 0 && a.write.n == 0 {
			holds[2].h.n = a.nested
		}
		for _, p := range a.permits {
			holds = append(holds, struct {
				what string
				h    modelHold
				rl   rule
			}{"Permit", modelHold{n: 1, keys: []string{p.Key()}, token: p.Token(), done: p.Done()}, rule{kind: ruleAmongFirst, prefix: w.semName() + "/"}})
		}
		a.mu.Unlock()
		for _, x := range holds {
			if x.h.n > 0 && !isClosed(x.h.done) {
				w.judgeHold(a, x.what+" (held at a checkpoint)", x.h, x.rl)
			}
		}
	}
	var why string
	ctx, cancel := context.WithTimeout(context.Background(), strayBound)
	defer cancel()
	if err := waitUntil(ctx, func() bool {
		why = w.strayKeys()
		return why == ""
	}); err != nil || why != "" {
		w.t.Errorf("checkpoint: %v after the faults were healed: %s", strayBound, why)
	}
	if final && !w.t.Failed() {
		w.parentFree()
	}
}

// strayKeys returns what etcd keeps that it should not: a key of a lock
// that no goroutine holds, or more than one fence on a lease; "" if none.
func (w *world) strayKeys() string {
	held := map[string]bool{}
	for _, a := range w.actors {
		for _, k := range a.heldKeys() {
			held[k] = true
		}
	}
	for _, kv := range w.queue(w.prefix + "/") {
		if !held[string(kv.Key)] {
			return fmt.Sprintf("key %s@%d (lease %x) is no goroutine's hold", kv.Key, kv.CreateRevision, kv.Lease)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	for _, ms := range w.sessions {
		lease := ms.session().Lease()
		resp, err := w.root.TimeToLive(ctx, lease, clientv3.WithAttachedKeys())
		if err != nil {
			continue
		}
		fences := 0
		for _, k := range resp.Keys {
			if !strings.HasPrefix(string(k), w.prefix+"/") {
				fences++
			}
		}
		if fences > maxBookkeeping {
			return fmt.Sprintf("lease %x keeps %d keys besides its locks' (%q)", lease, fences, resp.Keys)
		}
	}
	return ""
}

// parentFree checks that once all is released nothing is left under the
// sequence's prefix, and etcd's concurrency.Mutex takes the prefix's name.
func (w *world) parentFree() {
	if keys := w.queue(w.prefix + "/"); len(keys) > 0 {
		w.t.Errorf("after all was released: %s", describeQueue(keys))
		return
	}
	s, err := concurrency.NewSession(w.root, concurrency.WithTTL(5))
	if err != nil {
		w.t.Fatalf("upstream session: %v", err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	up := concurrency.NewMutex(s, w.prefix)
	if err := up.TryLock(ctx); err != nil {
		w.t.Errorf("concurrency.Mutex(%q).TryLock after all was released: got %v, want nil", w.prefix, err)
		return
	}
	_ = up.Unlock(ctx)
}
