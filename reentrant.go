package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/petermattis/goid"
)

// A Session's records of what this process holds or awaits, one per lock
// name, live in its records map, which only the record files read or write
// (this one, group.go and rwstate.go): a
// *lockState under a mutexName, an *rwState under an rwMutexName. A record
// is removed once idle (under its own mutex, and only if it is still the
// one in the map), and goes with its Session.
type (
	mutexName   string
	rwMutexName string
)

// lockState is what this process knows of one Mutex name on one Session. All
// Mutex handles of that name and Session share it, so that they are one lock:
// one holder goroutine with a hold count and its Do scopes (its holder), and
// a FIFO queue of the local goroutines waiting for their turn (its turn).
// Only the goroutine whose turn it is takes part in etcd's queue, so N
// goroutines cost etcd one key, not N. A MultiMutex's holds (group.go) are
// kept in the same records.
//
// These files are the only ones that read or write a lockState's fields. A
// record lives in its Session's records while anything uses it; once idle it is
// retired and removed, and handles that still point to it fetch a new one.
type lockState struct {
	s    *Session
	name string

	retired atomic.Bool // removed from the Session: fetch the live record; set under mu

	mu sync.Mutex // guards turnState and holderState
	turnState
	holderState
}

// holderState is who holds a Mutex name in this process, and how many times.
type holderState struct {
	owner  int64    // goroutine id of the holder; 0 when not held
	scopes []*scope // the holder's open Do scopes: their goroutines hold too
	holds  int      // how many holds there are, the scopes' included
	hold   *keyHold // the current hold: its token and loss signal; nil when not held
	// group is the MultiMutex (its names, joined) whose hold this is; ""
	// for a Mutex's. A group's holds are counted in each of its records.
	group string
}

// An entry is how an acquisition starts in this process.
type entry int

const (
	reentered     entry = iota // the goroutine held the lock: one more hold
	gotTurn                    // the turn was free: it is the goroutine's now
	queued                     // the goroutine waits for the turn
	turnBusy                   // a try: the turn is taken
	wouldDeadlock              // the goroutine holds the lock another way (Mutex, MultiMutex)
	holdLost                   // the goroutine holds the lock, but its hold is known lost: nothing changed
	turnCleaning               // a try: the turn waits for the delete of an earlier key of this process
)

// mutexState returns the live record of the Mutex name of s, creating it if
// create is set; nil if there is none, which means that nothing in this
// process holds or awaits the lock.
func mutexState(s *Session, name string, create bool) *lockState {
	if v, ok := s.records.Load(mutexName(name)); ok || !create {
		st, _ := v.(*lockState)
		return st
	}
	v, _ := s.records.LoadOrStore(mutexName(name), &lockState{s: s, name: name})
	return v.(*lockState)
}

// enter starts an acquisition by the calling goroutine, with ctx: a re-lock
// if it holds the lock (or ctx carries the holder's scope), unless that hold
// is known lost, else the turn if it is free, else a place in the local
// queue (none for a try). It returns false if the record was retired
// meanwhile: fetch the live one and enter again.
func (st *lockState) enter(ctx context.Context, try bool) (entry, *waiter, bool) {
	gid := goid.Get()
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.retired.Load() {
		return 0, nil, false
	}
	if st.owner != 0 && st.owner == gid {
		switch {
		case st.group != "":
			return wouldDeadlock, nil, true
		case st.hold.knownLost():
			return holdLost, nil, true
		}
		st.holds++
		return reentered, nil, true
	}
	if sc := st.scopeOf(ctx); sc != nil {
		if st.hold.knownLost() {
			return holdLost, nil, true
		}
		st.holds++
		sc.holds++
		return reentered, nil, true
	}
	how, w := st.takeTurn(try, false)
	return how, w, true
}

// grant makes the calling goroutine, which has the turn, the holder of h.
func (st *lockState) grant(h *keyHold) {
	gid := goid.Get()
	st.mu.Lock()
	defer st.mu.Unlock()
	st.owner, st.holds, st.hold = gid, 1, h
}

// A departure is what ending one hold left to do.
type departure int

const (
	notHolder   departure = iota // the goroutine held nothing: ErrNotHeld
	stillHeld                    // holds remain
	handedOn                     // the last hold went to a local waiter, key and all
	mustRelease                  // the last hold ended: delete the key, then pass the turn
)

// leave ends one hold of the calling goroutine, with ctx. When it ends the
// last one, the loss signal closes and, unless the hold is handed to a local
// waiter (WithLocalHandoff), it returns the ended hold, whose key the caller
// must delete before it passes the turn on. While a Do scope is open, its
// last hold is Do's to end.
func (st *lockState) leave(ctx context.Context) (departure, *keyHold) {
	gid := goid.Get()
	st.mu.Lock()
	defer st.mu.Unlock()
	switch {
	case st.retired.Load() || st.owner == 0 || st.group != "":
		return notHolder, nil
	case st.owner == gid && (len(st.scopes) == 0 || st.ownHolds() > 1):
		// While a scope is open, the owner's last hold is Do's.
	case st.owner != gid:
		sc := st.scopeOf(ctx)
		if sc == nil || sc.holds == 0 {
			return notHolder, nil
		}
		sc.holds--
	default:
		return notHolder, nil
	}
	st.holds--
	if st.holds > 0 {
		return stillHeld, nil
	}
	h := st.hold
	st.owner, st.hold = 0, nil
	h.end()
	if st.handOff(h) {
		h.reportEnd() // before the next goroutine can report its acquisition
		return handedOn, nil
	}
	return mustRelease, h
}

// holdCount returns the calling goroutine's own holds (not those taken
// through a Do scope by other goroutines).
func (st *lockState) holdCount() int {
	gid := goid.Get()
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.owner != gid || st.group != "" {
		return 0
	}
	return st.ownHolds()
}

// mine returns the calling goroutine's hold, nil if it holds none (a
// goroutine that holds through a Do scope asks HoldFrom).
func (st *lockState) mine() *keyHold {
	gid := goid.Get()
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.owner != gid || st.group != "" {
		return nil
	}
	return st.hold
}

// current returns the process's current hold, nil if none.
func (st *lockState) current() *keyHold {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.hold
}

// A scope is the hold of one Do while its f runs: any goroutine whose
// context carries the scope holds the lock with the goroutine that called
// Do. It ends when f returns, and with it the holds taken through it; a
// context kept after that grants nothing.
type scope struct {
	holds int // holds taken through the scope by other goroutines; guarded by the record's mu
}

// scopeKey is the context key of a lock's scope: the lock's record, which
// cannot be retired while a scope is open (its lock is held). One pointer:
// looking it up allocates nothing.
type scopeKey struct{ st *lockState }

// scopeOf returns the open scope ctx carries for the lock, nil if none. st.mu
// must be held.
// reenters reports whether an acquisition by the calling goroutine with ctx
// would re-enter a hold of the lock, as enter decides: the goroutine owns
// it, or ctx is in the scope of a Do's f.
func (st *lockState) reenters(ctx context.Context) bool {
	gid := goid.Get()
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.owner != 0 && st.owner == gid || st.scopeOf(ctx) != nil
}

func (st *lockState) scopeOf(ctx context.Context) *scope {
	if len(st.scopes) == 0 {
		return nil
	}
	sc, _ := ctx.Value(scopeKey{st}).(*scope)
	if sc == nil || !slices.Contains(st.scopes, sc) {
		return nil
	}
	return sc
}

// ownHolds returns the holds of the owner goroutine itself. st.mu must be
// held.
func (st *lockState) ownHolds() int {
	n := st.holds
	for _, sc := range st.scopes {
		n -= sc.holds
	}
	return n
}

// openScope opens a scope for the calling goroutine's hold and returns a
// context, derived from ctx, that carries it.
func (st *lockState) openScope(ctx context.Context) (context.Context, *scope) {
	sc := &scope{}
	st.mu.Lock()
	st.scopes = append(st.scopes, sc)
	st.mu.Unlock()
	return context.WithValue(ctx, scopeKey{st}, sc), sc
}

// closeScope ends sc, and the holds its goroutines still have.
func (st *lockState) closeScope(sc *scope) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.scopes = slices.DeleteFunc(st.scopes, func(o *scope) bool { return o == sc })
	st.holds -= sc.holds
	sc.holds = 0
}

// The local turn of a Mutex name: which goroutine of this process may use
// etcd for the lock, the FIFO queue of the others, and the hand-off of a
// hold between them (WithLocalHandoff).

// turnState is the right to use etcd for a Mutex name in this process: one
// goroutine at a time has it, the others wait in FIFO order. Guarded by its
// record's mu.
type turnState struct {
	busy     bool      // the turn is taken: by the holder, an acquirer, or a cleanup
	cleaning error     // the turn waits for a delete retried in the background: why it was not confirmed; nil otherwise
	queue    []*waiter // local goroutines waiting for the turn, oldest first
	handoffs int       // local hand-offs in a row since the key was put
}

// A waiter is a goroutine in the local queue of a turn.
type waiter struct {
	ready   chan struct{} // closed when the turn is handed to this waiter
	granted bool          // the turn is this waiter's
	handed  *keyHold      // the hold itself came with the turn (a local hand-off)
	group   bool          // a MultiMutex waits: the turn, never a Mutex's hold
}

// takeTurn takes the turn if it is free, else a place in the local queue
// (none for a try); a group's waiter is never handed a Mutex's hold. st.mu
// must be held.
func (st *lockState) takeTurn(try, group bool) (entry, *waiter) {
	switch {
	case !st.busy:
		st.busy = true
		return gotTurn, nil
	case try && st.cleaning != nil:
		return turnCleaning, nil
	case try:
		return turnBusy, nil
	}
	w := &waiter{ready: make(chan struct{}), group: group}
	st.queue = append(st.queue, w)
	return queued, w
}

// await ends an entry that takes the turn: errBusy for a try that found it
// taken, errCleaning for one that found it waiting for a delete, the wait of
// a queued goroutine (and the hold, if one came with the turn), else
// nothing; waited says whether it waited.
func (st *lockState) await(ctx context.Context, how entry, w *waiter) (h *keyHold, waited bool, err error) {
	switch how {
	case turnBusy:
		return nil, true, errBusy
	case turnCleaning:
		return nil, true, st.cleaningErr()
	case queued:
		h, err := st.awaitTurn(ctx, w)
		return h, true, err
	}
	return nil, false, nil
}

// awaitTurn waits until w has the turn: the right to use etcd for this lock.
// If the hold itself came with it (WithLocalHandoff), it returns that hold,
// which counts as taken even if ctx ended at the same moment. It returns
// errBusy if ctx ends first (another goroutine held or waited ahead),
// leaving the queue as it was; or errCleaning if the turn was then waiting
// for the delete of an earlier key of this process: nobody else held or
// waited.
func (st *lockState) awaitTurn(ctx context.Context, w *waiter) (*keyHold, error) {
	select {
	case <-w.ready:
		return w.handed, nil
	case <-ctx.Done():
	}
	st.mu.Lock()
	switch {
	case w.handed != nil:
		st.mu.Unlock()
		return w.handed, nil
	case w.granted:
		// The turn arrived as ctx ended: hand it on.
		st.mu.Unlock()
		st.passTurn()
	default:
		st.queue = slices.DeleteFunc(st.queue, func(q *waiter) bool { return q == w })
		cleaning := st.cleaning != nil && len(st.queue) == 0 && st.owner == 0
		st.mu.Unlock()
		if cleaning {
			return nil, st.cleaningErr()
		}
	}
	return nil, errBusy
}

// retrying records that the turn waits for a delete retried in the
// background, which err left unconfirmed.
func (st *lockState) retrying(err error) {
	if err == nil {
		err = errors.New("not confirmed")
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.cleaning = err
}

// cleaningErr returns the error of a call that found the turn waiting for
// a delete: etcd may or may not still have the earlier key.
func (st *lockState) cleaningErr() error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.cleaning == nil {
		return errBusy // the delete ended meanwhile; the turn went on
	}
	return fmt.Errorf("%w: %v", errCleaning, st.cleaning)
}

// handOff passes the hold, with its etcd key and token, to the oldest local
// waiter, if WithLocalHandoff allows one more in a row and the hold is not
// known lost. It is called with st.mu held, after h.end.
func (st *lockState) handOff(h *keyHold) bool {
	if len(st.queue) == 0 || st.queue[0].group || st.handoffs >= st.s.maxHandoffs || h.knownLost() {
		st.handoffs = 0
		return false
	}
	st.handoffs++
	w := st.queue[0]
	st.queue = st.queue[1:]
	w.granted, w.handed = true, h.again()
	close(w.ready)
	return true
}

// passTurn hands the turn to the oldest local waiter, or frees it and
// retires the record if nothing else uses it.
func (st *lockState) passTurn() {
	st.mu.Lock()
	st.cleaning = nil
	if len(st.queue) > 0 {
		w := st.queue[0]
		st.queue = st.queue[1:]
		w.granted = true
		close(w.ready)
		st.mu.Unlock()
		return
	}
	st.busy = false
	st.mu.Unlock()

	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.busy && len(st.queue) == 0 && !st.retired.Load() && st.s.records.CompareAndDelete(mutexName(st.name), st) {
		st.retired.Store(true)
	}
}
