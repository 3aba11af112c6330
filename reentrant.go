package etcdlock

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/petermattis/goid"
)

// A Session's records of what this process holds or awaits, one per lock
// name, live in its records map, which only the record files read or write
// (this one, turn.go, scope.go, group.go and rwstate.go): a
// *lockState under a mutexName, an *rwState under an rwMutexName. A record
// is removed once idle (under its own mutex, and only if it is still the
// one in the map), and goes with its Session.
type (
	mutexName   string
	rwMutexName string
)

// lockState is what this process knows of one Mutex name on one Session. All
// Mutex handles of that name and Session share it, so that they are one lock:
// one holder goroutine with a hold count (its holder, in this file), and a
// FIFO queue of the local goroutines waiting for their turn (its turn,
// turn.go). Only the goroutine whose turn it is takes part in etcd's queue,
// so N goroutines cost etcd one key, not N. Do scopes (scope.go) and a
// MultiMutex's holds (group.go) are kept in the same record.
//
// These files are the only ones that read or write a lockState's fields. A
// record lives in its Session's records while anything uses it; once idle it is
// retired and removed, and handles that still point to it fetch a new one.
type lockState struct {
	s    *Session
	name string

	retired atomic.Bool // removed from the Session: fetch the live record; set under mu

	mu sync.Mutex // guards turn and holder
	turn
	holder
}

// holder is who holds a Mutex name in this process, and how many times.
type holder struct {
	owner  int64    // goroutine id of the holder; 0 when not held
	scopes []*scope // the holder's open Do scopes: their goroutines hold too
	holds  int      // how many holds there are, the scopes' included
	hold   *hold    // the current hold: its token and loss signal; nil when not held
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
func (st *lockState) grant(h *hold) {
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
func (st *lockState) leave(ctx context.Context) (departure, *hold) {
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
func (st *lockState) mine() *hold {
	gid := goid.Get()
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.owner != gid || st.group != "" {
		return nil
	}
	return st.hold
}

// current returns the process's current hold, nil if none.
func (st *lockState) current() *hold {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.hold
}
