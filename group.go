package etcdlock

import (
	"context"

	"github.com/petermattis/goid"
)

// A MultiMutex uses the records of its names' Mutexes: it holds each name's
// turn while it acquires and holds, and records its hold in each, under its
// group (its names, sorted and joined). Its goroutine takes the turns in the
// order of the names, so two groups of one Session cannot wait for each
// other's turns in a cycle; and it waits in etcd only once it has them all,
// for keys older than its own, which never wait for a turn of this
// Session. A goroutine that holds one of the names otherwise (a Mutex, or
// another group) would hold one lock while it waits for another, which no
// order can save: ErrWouldDeadlock, before any turn is taken.

// groupEntry tells how the calling goroutine, with ctx, stands toward the
// records of the names of group: reentered (it holds the group: one more
// hold, in each record), holdLost (it holds the group, but the hold is known
// lost), wouldDeadlock (it holds one of the names another way), or gotTurn
// (it holds none: go take the turns).
func groupEntry(ctx context.Context, s *Session, names []string, group string) entry {
	gid := goid.Get()
	var mine []*lockState
	for _, name := range names {
		st := mutexState(s, name, false)
		if st == nil {
			continue
		}
		st.mu.Lock()
		switch {
		case st.owner == gid && st.group == group:
			mine = append(mine, st)
		case st.owner == gid || st.scopeOf(ctx) != nil:
			st.mu.Unlock()
			return wouldDeadlock
		}
		st.mu.Unlock()
	}
	switch len(mine) {
	case 0:
		return gotTurn
	case len(names):
	default:
		return wouldDeadlock
	}
	if mine[0].current().knownLost() {
		return holdLost
	}
	for _, st := range mine {
		st.mu.Lock()
		st.holds++
		st.mu.Unlock()
	}
	return reentered
}

// groupTurn takes the turn of the Mutex name of s for a group: at once if
// free, else by waiting for it in the local queue (a try: errBusy). It
// returns the record, and whether it waited.
func groupTurn(ctx context.Context, s *Session, name string, try bool) (*lockState, bool, error) {
	for {
		st := mutexState(s, name, true)
		st.mu.Lock()
		if st.retired.Load() {
			st.mu.Unlock()
			continue
		}
		how, w := st.takeTurn(try, true)
		st.mu.Unlock()
		_, waited, err := st.await(ctx, how, w)
		return st, waited, err
	}
}

// grantGroup makes the calling goroutine, which has the turn, the holder of
// the group's hold h.
func (st *lockState) grantGroup(group string, h *keyHold) {
	gid := goid.Get()
	st.mu.Lock()
	defer st.mu.Unlock()
	st.owner, st.holds, st.hold, st.group = gid, 1, h, group
}

// leaveGroup ends one hold of group by the calling goroutine. When it ends
// the last one, it returns the hold, whose keys the caller must delete
// before it passes the turn on.
func (st *lockState) leaveGroup(group string) (departure, *keyHold) {
	gid := goid.Get()
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.retired.Load() || st.owner != gid || st.group != group {
		return notHolder, nil
	}
	st.holds--
	if st.holds > 0 {
		return stillHeld, nil
	}
	h := st.hold
	st.owner, st.hold, st.group = 0, nil, ""
	return mustRelease, h
}

// groupHold returns the group's current hold in this process, nil if none;
// with mine, only the calling goroutine's.
func (st *lockState) groupHold(group string, mine bool) *keyHold {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.group != group || (mine && st.owner != goid.Get()) {
		return nil
	}
	return st.hold
}

// A groupKeeper is the turns a MultiMutex took, as a turnKeeper: they wait
// together for the delete of its keys.
type groupKeeper struct{ turns *[]*lockState }

func (g groupKeeper) retrying(err error) {
	for _, st := range *g.turns {
		st.retrying(err)
	}
}
