package etcdlock

import (
	"sync"

	"github.com/petermattis/goid"
)

// rwState is what this process knows of one RWMutex name on one Session: who
// holds it, per goroutine. Every hold of a goroutine has an etcd key of its
// own, readers' and writers' alike, so goroutines need no local turn: etcd's
// queue orders them, as it orders other processes. Only one write hold is
// alive at a time, but a goroutine whose write hold was lost keeps it until
// it unlocks, while another goroutine may take the lock anew.
type rwState struct {
	s    *Session
	name string

	mu      sync.Mutex
	retired bool
	writers map[int64]*rwHold // write holds, by goroutine
	readers map[int64]*rwHold // read holds, by goroutine
}

// An rwHold is one goroutine's hold of an RWMutex: the hold of its key, how
// many times the goroutine took it, and for a write hold, how many reads the
// goroutine took while writing (they need no key of their own: its write
// key excludes everyone already).
type rwHold struct {
	holds  int
	nested int
	h      *keyHold
}

// rwMutexState returns the live record of the RWMutex name of s, creating
// it if create is set; nil if there is none: nothing in this process holds
// the lock.
func rwMutexState(s *Session, name string, create bool) *rwState {
	if v, ok := s.records.Load(rwMutexName(name)); ok || !create {
		st, _ := v.(*rwState)
		return st
	}
	v, _ := s.records.LoadOrStore(rwMutexName(name), &rwState{s: s, name: name, writers: make(map[int64]*rwHold), readers: make(map[int64]*rwHold)})
	return v.(*rwState)
}

// enter starts an acquisition by the calling goroutine: it reports whether
// the goroutine took one more hold of a lock it holds already, which needs no
// key: a re-lock, or a read by the writer. A reader asking to write gets
// ErrWouldDeadlock: it would wait for itself; a goroutine whose hold is
// known lost, errRelockLost.
func (st *rwState) enter(write bool) (bool, error) {
	gid := goid.Get()
	st.mu.Lock()
	defer st.mu.Unlock()
	w, r := st.writers[gid], st.readers[gid]
	switch {
	case w != nil && w.h.knownLost(), r != nil && !write && r.h.knownLost():
		return false, errRelockLost
	case w != nil && write:
		w.holds++
	case w != nil:
		w.nested++
	case r != nil && write:
		return false, ErrWouldDeadlock
	case r != nil:
		r.holds++
	default:
		return false, nil
	}
	return true, nil
}

// grant records the hold that the calling goroutine took. It returns false
// if the record was retired meanwhile: grant on the live one.
func (st *rwState) grant(write bool, h *keyHold) bool {
	gid := goid.Get()
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.retired {
		return false
	}
	hold := &rwHold{holds: 1, h: h}
	if write {
		st.writers[gid] = hold
	} else {
		st.readers[gid] = hold
	}
	return true
}

// leave ends one hold of the calling goroutine (write or read). When the
// goroutine's last hold of a key ends, the loss signal closes, and it returns
// the hold whose key the caller must delete. A writer's key lasts until the
// writer's nested reads end too: it still excludes everyone meanwhile.
func (st *rwState) leave(write bool) (departure, *rwHold) {
	gid := goid.Get()
	st.mu.Lock()
	var ended *rwHold
	switch w, r := st.writers[gid], st.readers[gid]; {
	case w != nil && (write && w.holds > 0 || !write && w.nested > 0):
		if write {
			w.holds--
		} else {
			w.nested--
		}
		if w.holds == 0 && w.nested == 0 {
			ended = w
			delete(st.writers, gid)
		}
	case write || r == nil:
		st.mu.Unlock()
		return notHolder, nil
	default:
		r.holds--
		if r.holds == 0 {
			ended = r
			delete(st.readers, gid)
		}
	}
	idle := len(st.writers) == 0 && len(st.readers) == 0
	st.mu.Unlock()
	if ended == nil {
		return stillHeld, nil
	}
	ended.h.end()
	if idle {
		st.retire()
	}
	return mustRelease, ended
}

// retire removes the record from the Session if nothing holds it.
func (st *rwState) retire() {
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.writers) == 0 && len(st.readers) == 0 && !st.retired && st.s.records.CompareAndDelete(rwMutexName(st.name), st) {
		st.retired = true
	}
}

// mine returns the calling goroutine's hold: its write hold (its reads
// while writing are part of it), or else its read hold; nil if it holds
// nothing. Never another goroutine's: another reader's unlock does not end
// this one's hold.
func (st *rwState) mine() *rwHold {
	gid := goid.Get()
	st.mu.Lock()
	defer st.mu.Unlock()
	if w := st.writers[gid]; w != nil {
		return w
	}
	return st.readers[gid]
}

// holdCount returns the calling goroutine's holds: write holds and read
// holds together.
func (st *rwState) holdCount() int {
	gid := goid.Get()
	st.mu.Lock()
	defer st.mu.Unlock()
	n := 0
	if w := st.writers[gid]; w != nil {
		n += w.holds + w.nested
	}
	if r := st.readers[gid]; r != nil {
		n += r.holds
	}
	return n
}
