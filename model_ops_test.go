package etcdlock_test

// The goroutines of the model-based test (model_test.go): each runs the
// operations it is given, one at a time, on the handles of its Session, and
// keeps the model of what it holds: a count per kind of hold, and the hold
// itself (its keys, token and loss signal) as the library reported it.

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/etcdlock/etcdlock"
)

// A modelHold is one hold of a goroutine, as the model counts it.
type modelHold struct {
	n     int             // holds taken and not yet ended; 0: none
	keys  []string        // its keys in etcd
	token int64           // its fencing token
	done  <-chan struct{} // its loss signal
}

// An actor is one goroutine of a Session in the model-based test.
type goroutine struct {
	w    *world
	ms   *modelSession
	i    int
	cmds chan modelOp
	quit chan struct{}
	busy atomic.Bool

	mu       sync.Mutex // guards what follows: the driver and the judge read it
	opNames  []string   // the lock names of the operation under way
	mutex    modelHold
	multi    modelHold
	write    modelHold
	read     modelHold // a reader's hold, with a key of its own
	nested   int       // reads taken by the writer: part of its write hold
	permits  []*etcdlock.Permit
	released []*etcdlock.Permit // released already: a second release is ErrNotHeld
}

// A modelOp is one operation given to a goroutine.
type modelOp struct {
	name  string
	names []string // the lock names it touches
	f     func(a *goroutine)
}

func newGoroutine(w *world, ms *modelSession, i int) *goroutine {
	a := &goroutine{w: w, ms: ms, i: i, cmds: make(chan modelOp), quit: make(chan struct{})}
	go a.loop()
	return a
}

func (a *goroutine) loop() {
	defer close(a.quit)
	for op := range a.cmds {
		op.f(a)
		a.mu.Lock()
		a.opNames = nil
		a.mu.Unlock()
		a.busy.Store(false)
	}
}

// run starts op on the goroutine, which must be idle, and returns a channel
// closed when it is done.
func (a *goroutine) run(op modelOp) <-chan struct{} {
	done := make(chan struct{})
	a.busy.Store(true)
	a.mu.Lock()
	a.opNames = op.names
	a.mu.Unlock()
	f := op.f
	op.f = func(a *goroutine) {
		defer close(done)
		f(a)
	}
	a.cmds <- op
	return done
}

// stop ends the goroutine once its operation is done.
func (a *goroutine) stop() {
	close(a.cmds)
	<-a.quit
}

// wait runs op and waits for it.
func (a *goroutine) wait(op modelOp) { <-a.run(op) }

// forget drops the holds of a Session that was replaced.
func (a *goroutine) forget() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.mutex, a.multi, a.write, a.read, a.nested = modelHold{}, modelHold{}, modelHold{}, modelHold{}, 0
	a.permits, a.released = nil, nil
}

// heldKeys returns the keys of every hold of the goroutine.
func (a *goroutine) heldKeys() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var keys []string
	for _, h := range []*modelHold{&a.mutex, &a.multi, &a.write, &a.read} {
		if h.n > 0 || h == &a.write && a.nested > 0 {
			keys = append(keys, h.keys...)
		}
	}
	for _, p := range a.permits {
		keys = append(keys, p.Key())
	}
	return keys
}

// holdsNames reports whether the goroutine holds, or is operating on, any
// of names.
func (a *goroutine) active(names []string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	var mine []string
	mine = append(mine, a.opNames...)
	if a.mutex.n > 0 {
		mine = append(mine, a.w.mutexName())
	}
	if a.multi.n > 0 {
		mine = append(mine, a.w.multiNames()...)
	}
	if a.write.n > 0 || a.nested > 0 || a.read.n > 0 {
		mine = append(mine, a.w.rwName())
	}
	if len(a.permits) > 0 {
		mine = append(mine, a.w.semName())
	}
	for _, n := range names {
		if slices.Contains(mine, n) {
			return true
		}
	}
	return false
}

// othersActive reports whether a goroutine other than a holds, or is
// operating on, any of names.
func (a *goroutine) othersActive(names []string) bool {
	for _, o := range a.w.actors {
		if o != a && o.active(names) {
			return true
		}
	}
	return false
}

// opContext returns a context for one call: it ends within 100 to 600 ms.
func callContext(rng *rand.Rand) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), time.Duration(100+rng.IntN(500))*time.Millisecond)
}

// pick chooses a random operation for the goroutine, more often an unlock
// when it holds something.
func (a *goroutine) pick(rng *rand.Rand) modelOp {
	w := a.w
	m, rw, sem, multi := []string{w.mutexName()}, []string{w.rwName()}, []string{w.semName()}, w.multiNames()
	a.mu.Lock()
	holds := a.mutex.n > 0 || a.multi.n > 0 || a.write.n > 0 || a.read.n > 0 || a.nested > 0 || len(a.permits) > 0
	a.mu.Unlock()
	if holds && rng.IntN(3) == 0 {
		unlocks := []modelOp{
			{"Mutex.UnlockContext", m, (*goroutine).mutexUnlock},
			{"MultiMutex.UnlockContext", multi, (*goroutine).multiUnlock},
			{"RWMutex.UnlockContext", rw, func(a *goroutine) { a.rwUnlock(true) }},
			{"RWMutex.RUnlockContext", rw, func(a *goroutine) { a.rwUnlock(false) }},
			{"Permit.Release", sem, (*goroutine).release},
		}
		return unlocks[rng.IntN(len(unlocks))]
	}
	seed := rng.Uint64()
	r := rand.New(rand.NewPCG(seed, seed>>1))
	ops := []modelOp{
		{"Mutex.LockContext", m, func(a *goroutine) { a.mutexLock(r, -1) }},
		{"Mutex.TryLockFor(0)", m, func(a *goroutine) { a.mutexLock(r, 0) }},
		{"Mutex.TryLockFor(150ms)", m, func(a *goroutine) { a.mutexLock(r, 150*time.Millisecond) }},
		{"Mutex.UnlockContext", m, (*goroutine).mutexUnlock},
		{"Mutex.Do", m, func(a *goroutine) { a.mutexDo(r) }},
		{"MultiMutex.LockContext", multi, func(a *goroutine) { a.multiLock(r, -1) }},
		{"MultiMutex.TryLockFor(0)", multi, func(a *goroutine) { a.multiLock(r, 0) }},
		{"MultiMutex.UnlockContext", multi, (*goroutine).multiUnlock},
		{"RWMutex.LockContext", rw, func(a *goroutine) { a.rwLock(r, true, -1) }},
		{"RWMutex.TryLockFor(0)", rw, func(a *goroutine) { a.rwLock(r, true, 0) }},
		{"RWMutex.RLockContext", rw, func(a *goroutine) { a.rwLock(r, false, -1) }},
		{"RWMutex.TryRLockFor(0)", rw, func(a *goroutine) { a.rwLock(r, false, 0) }},
		{"RWMutex.UnlockContext", rw, func(a *goroutine) { a.rwUnlock(true) }},
		{"RWMutex.RUnlockContext", rw, func(a *goroutine) { a.rwUnlock(false) }},
		{"Semaphore.Acquire", sem, func(a *goroutine) { a.acquire(r, -1) }},
		{"Semaphore.TryAcquire(0)", sem, func(a *goroutine) { a.acquire(r, 0) }},
		{"Semaphore.TryAcquire(150ms)", sem, func(a *goroutine) { a.acquire(r, 150*time.Millisecond) }},
		{"Semaphore.AcquireN(2)", sem, func(a *goroutine) { a.acquireN(r, -1, 2) }},
		{"Semaphore.TryAcquireN(2, 0)", sem, func(a *goroutine) { a.acquireN(r, 0, 2) }},
		{"Permit.Release", sem, (*goroutine).release},
		{"SetLimit", sem, func(a *goroutine) { a.setLimit(r) }},
	}
	return ops[rng.IntN(len(ops))]
}

// try calls a try with wait, or, with wait < 0, lock.
func tryOrLock(ctx context.Context, wait time.Duration, lock func(context.Context) error, tryFor func(context.Context, time.Duration) (bool, error)) (bool, error) {
	if wait < 0 {
		err := lock(ctx)
		return err == nil, err
	}
	return tryFor(ctx, wait)
}

// mutexCall begins a call of the goroutine on the Mutex: its handle, the
// call's context, what the judge knows before the call, and whether the
// goroutine holds the name another way (a MultiMutex).
func (a *goroutine) mutexCall(r *rand.Rand, what string) (*etcdlock.Mutex, context.Context, context.CancelFunc, modelCall, bool) {
	m := etcdlock.NewMutex(a.ms.session(), a.w.mutexName())
	ctx, cancel := callContext(r)
	a.mu.Lock()
	prior := a.mutex
	wouldDeadlock := a.multi.n > 0
	a.mu.Unlock()
	return m, ctx, cancel, a.begin(what, []string{a.w.mutexName()}, prior), wouldDeadlock
}

func (a *goroutine) mutexLock(r *rand.Rand, wait time.Duration) {
	m, ctx, cancel, c, wouldDeadlock := a.mutexCall(r, "Mutex")
	defer cancel()
	held, err := tryOrLock(ctx, wait, m.LockContext, m.TryLockFor)
	if held {
		h, ok := m.Held()
		if !ok {
			a.w.t.Errorf("g%d: Mutex acquired, but Held says nothing is held", a.i)
			return
		}
		a.gained(&a.mutex, c, modelHold{keys: []string{h.Key}, token: h.Token, done: h.Done()}, rule{kind: ruleFirst, prefix: a.w.mutexName() + "/"})
		return
	}
	a.refused(c, err, wouldDeadlock)
}

func (a *goroutine) mutexUnlock() {
	err := etcdlock.NewMutex(a.ms.session(), a.w.mutexName()).UnlockContext(context.Background())
	a.unlocked("Mutex", &a.mutex, err)
}

// mutexDo runs Do with an f that judges its hold, and locks again through
// its scope from another goroutine.
func (a *goroutine) mutexDo(r *rand.Rand) {
	m, ctx, cancel, c, wouldDeadlock := a.mutexCall(r, "Mutex.Do")
	defer cancel()
	ran := false
	err := m.Do(ctx, func(fctx context.Context) error {
		ran = true
		h, ok := etcdlock.HoldFrom(fctx)
		if !ok {
			a.w.t.Errorf("g%d: Do's f: HoldFrom says nothing is held", a.i)
			return nil
		}
		hold := modelHold{n: 1, keys: []string{h.Key}, token: h.Token, done: h.Done()}
		a.w.judgeHold(a, "Mutex.Do", hold, rule{kind: ruleFirst, prefix: a.w.mutexName() + "/"})
		if r.IntN(2) == 0 {
			// Another goroutine of the scope locks and unlocks, on a
			// context that carries the scope but not its cancel.
			sctx := context.WithoutCancel(fctx)
			done := make(chan error, 1)
			go func() {
				err := m.LockContext(sctx)
				if err == nil {
					err = m.UnlockContext(sctx)
				}
				done <- err
			}()
			if err := <-done; err != nil && !errors.Is(err, etcdlock.ErrLockLost) {
				a.w.t.Errorf("g%d: a lock through Do's scope: got %v, want nil or ErrLockLost", a.i, err)
			} else if errors.Is(err, etcdlock.ErrLockLost) {
				a.w.judgeLost(a, "a lock through Do's scope", h.Done())
			}
		}
		time.Sleep(time.Duration(r.IntN(50)) * time.Millisecond)
		return nil
	})
	a.w.log.add("g%d: Mutex.Do: %v (f ran: %v)", a.i, err, ran)
	if !ran {
		a.refused(c, err, wouldDeadlock)
	}
}

func (a *goroutine) multiLock(r *rand.Rand, wait time.Duration) {
	mm := etcdlock.NewMultiMutex(a.ms.session(), a.w.multiNames()...)
	ctx, cancel := callContext(r)
	defer cancel()
	a.mu.Lock()
	prior := a.multi
	wouldDeadlock := a.mutex.n > 0
	a.mu.Unlock()
	c := a.begin("MultiMutex", a.w.multiNames(), prior)
	held, err := tryOrLock(ctx, wait, mm.LockContext, mm.TryLockFor)
	if held {
		tok := mm.Token()
		keys := a.w.keysAt(tok, a.w.multiNames())
		a.gained(&a.multi, c, modelHold{keys: keys, token: tok, done: mm.Done()}, rule{kind: ruleFirst})
		return
	}
	a.refused(c, err, wouldDeadlock)
}

func (a *goroutine) multiUnlock() {
	err := etcdlock.NewMultiMutex(a.ms.session(), a.w.multiNames()...).UnlockContext(context.Background())
	a.unlocked("MultiMutex", &a.multi, err)
}

func (a *goroutine) rwLock(r *rand.Rand, write bool, wait time.Duration) {
	rw := etcdlock.NewRWMutex(a.ms.session(), a.w.rwName())
	ctx, cancel := callContext(r)
	defer cancel()
	a.mu.Lock()
	var prior modelHold
	switch {
	case write:
		prior = a.write
		prior.n += a.nested // its reads keep the write hold
	case a.write.n > 0 || a.nested > 0:
		prior = a.write // a read by the writer is part of its write hold
		prior.n += a.nested
	default:
		prior = a.read
	}
	wouldDeadlock := write && a.read.n > 0
	a.mu.Unlock()
	what, lock, tryFor, rl := "RWMutex.RLock", rw.RLockContext, rw.TryRLockFor, rule{kind: ruleNoWriterBefore, prefix: a.w.rwName() + "/"}
	if write {
		what, lock, tryFor, rl = "RWMutex.Lock", rw.LockContext, rw.TryLockFor, rule{kind: ruleFirst, prefix: a.w.rwName() + "/"}
	}
	c := a.begin(what, []string{a.w.rwName()}, prior)
	held, err := tryOrLock(ctx, wait, lock, tryFor)
	if !held {
		a.refused(c, err, wouldDeadlock)
		return
	}
	h, ok := rw.Held()
	if !ok {
		a.w.t.Errorf("g%d: %s acquired, but Held says nothing is held", a.i, what)
		return
	}
	hold := modelHold{keys: []string{h.Key}, token: h.Token, done: h.Done()}
	switch {
	case write:
		a.gained(&a.write, c, hold, rl)
	case prior.n > 0 && (a.write.n > 0 || a.nested > 0):
		a.gained(&a.write, c, hold, rule{kind: ruleFirst, prefix: a.w.rwName() + "/"})
		a.mu.Lock()
		a.write.n-- // counted as a nested read, not a write
		a.nested++
		a.mu.Unlock()
	default:
		a.gained(&a.read, c, hold, rl)
	}
}

func (a *goroutine) rwUnlock(write bool) {
	rw := etcdlock.NewRWMutex(a.ms.session(), a.w.rwName())
	if write {
		a.mu.Lock()
		lastWrite := a.write.n == 1 && a.nested > 0 // the key stays for the nested reads
		a.mu.Unlock()
		err := rw.UnlockContext(context.Background())
		if lastWrite && err == nil {
			a.w.log.add("g%d: RWMutex.Unlock: <nil> (its reads keep the key)", a.i)
			a.mu.Lock()
			a.write.n = 0
			a.mu.Unlock()
			return
		}
		a.unlocked("RWMutex.Unlock", &a.write, err)
		return
	}
	a.mu.Lock()
	nested := a.nested > 0
	a.mu.Unlock()
	err := rw.RUnlockContext(context.Background())
	if !nested {
		a.unlocked("RWMutex.RUnlock", &a.read, err)
		return
	}
	a.w.log.add("g%d: RWMutex.RUnlock (nested in its write): %v", a.i, err)
	if errors.Is(err, etcdlock.ErrNotHeld) {
		a.w.t.Errorf("g%d: RWMutex.RUnlock of a read nested in a write: got ErrNotHeld", a.i)
	}
	a.mu.Lock()
	a.nested--
	if a.nested == 0 && a.write.n == 0 {
		a.write = modelHold{}
	}
	a.mu.Unlock()
}

func (a *goroutine) acquire(r *rand.Rand, wait time.Duration) { a.acquireN(r, wait, 1) }

// acquireN takes n permits of the Semaphore, judged by the weighted rule.
func (a *goroutine) acquireN(r *rand.Rand, wait time.Duration, n int) {
	sem := a.ms.semaphore(a.w.semName())
	ctx, cancel := callContext(r)
	defer cancel()
	_, _, recorded := a.w.limitRecord(a.w.semName()+"/", 0)
	c := a.begin("Semaphore", []string{a.w.semName()}, modelHold{})
	var p *etcdlock.Permit
	var err error
	if wait < 0 {
		p, err = sem.AcquireN(ctx, n)
	} else {
		p, err = sem.TryAcquireN(ctx, n, wait)
	}
	if err == nil {
		var h modelHold
		a.w.stats.permits.Add(1)
		a.gained(&h, c, modelHold{keys: []string{p.Key()}, token: p.Token(), done: p.Done()}, rule{kind: ruleAmongFirst, prefix: a.w.semName() + "/"})
		a.mu.Lock()
		a.permits = append(a.permits, p)
		a.mu.Unlock()
		return
	}
	switch {
	case errors.Is(err, etcdlock.ErrNoPermit):
		err = nil
	case errors.Is(err, etcdlock.ErrLimitMismatch) && recorded:
		// A record, once written, stays for the sequence: it says the
		// limit, whatever the keys were made with.
		a.w.t.Errorf("g%d: Semaphore(%d): got %v, though a limit record was written before the call", a.i, sem.Limit(), err)
	case errors.Is(err, etcdlock.ErrLimitMismatch):
		a.w.stats.mismatches.Add(1)
	}
	a.refused(c, err, false)
}

// setLimit records a limit of 1 to 3 for the Semaphore, through the
// goroutine's Session's client (faulted as its locks are). Its answer is
// judged by what follows: every permit held keeps holding (the checkpoints
// and each hold's judge read the record). The first one meets keys of
// Semaphores made with either of modelLimits, and no record: ErrLimitMismatch
// then when the queue has both (a key of the other limit is refused, and
// leaves, but may be there at the read), never once a record was written.
func (a *goroutine) setLimit(r *rand.Rand) {
	limit := 1 + r.IntN(3)
	ctx, cancel := callContext(r)
	defer cancel()
	_, _, recorded := a.w.limitRecord(a.w.semName()+"/", 0)
	err := etcdlock.SetLimit(ctx, a.ms.session().Client(), a.w.semName(), limit)
	a.w.log.add("g%d: SetLimit(%d): %v", a.i, limit, err)
	if err == nil {
		a.w.stats.limits.Add(1)
		if !recorded {
			a.w.stats.firstLimits.Add(1)
		}
	}
	if errors.Is(err, etcdlock.ErrInvalidArgument) || (errors.Is(err, etcdlock.ErrLimitMismatch) && recorded) {
		a.w.t.Errorf("g%d: SetLimit(%d): %v", a.i, limit, err)
	}
}

func (a *goroutine) release() {
	a.mu.Lock()
	var p *etcdlock.Permit
	held := len(a.permits) > 0
	switch {
	case held:
		p = a.permits[0]
		a.permits = a.permits[1:]
		a.released = append(a.released, p)
	case len(a.released) > 0:
		p = a.released[len(a.released)-1]
	}
	a.mu.Unlock()
	err := p.Release(context.Background())
	switch {
	case !held && !errors.Is(err, etcdlock.ErrNotHeld):
		a.w.t.Errorf("g%d: release of a released (or nil) Permit: got %v, want ErrNotHeld", a.i, err)
	case held && errors.Is(err, etcdlock.ErrNotHeld):
		a.w.t.Errorf("g%d: release of a held Permit: got ErrNotHeld", a.i)
	}
	a.w.log.add("g%d: Permit.Release: %v", a.i, err)
}

// releaseAll ends every hold of the goroutine.
func (a *goroutine) releaseAll() {
	a.mutexUnlockAll()
	for range 3 {
		a.mu.Lock()
		any := len(a.permits) > 0
		a.mu.Unlock()
		if any {
			a.release()
		}
	}
}

func (a *goroutine) mutexUnlockAll() {
	for _, u := range []struct {
		h *modelHold
		f func()
	}{
		{&a.mutex, a.mutexUnlock},
		{&a.multi, a.multiUnlock},
	} {
		for range 10 {
			a.mu.Lock()
			n := u.h.n
			a.mu.Unlock()
			if n == 0 {
				break
			}
			u.f()
		}
	}
	for range 10 {
		a.mu.Lock()
		nested, w, r := a.nested, a.write.n, a.read.n
		a.mu.Unlock()
		switch {
		case nested > 0:
			a.rwUnlock(false)
		case w > 0:
			a.rwUnlock(true)
		case r > 0:
			a.rwUnlock(false)
		default:
			return
		}
	}
}
