package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/etcdlock/etcdlock"
)

// demoTogether bounds how long a holder waits for the others it should
// share the lock with (readers, a semaphore's holders) before it leaves.
const demoTogether = 3 * time.Second

// occupancy counts who is inside a lock, as the workers report it, and
// records every moment the lock's promise was broken.
type occupancy struct {
	mu       sync.Mutex
	readers  int // readers, or a semaphore's holders
	writers  int
	most     int // the most readers inside at once
	holds    int // holds entered
	broken   []string
	changed  chan struct{} // closed and replaced on every enter and leave
	released int           // a semaphore's permits released
}

func newOccupancy() *occupancy { return &occupancy{changed: make(chan struct{})} }

// enter records one more holder inside; a writer must be alone, a reader
// must be with no writer, and no more than limit readers (0: no limit).
func (o *occupancy) enter(who string, write bool, limit int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.holds++
	if write {
		o.writers++
	} else {
		o.readers++
		o.most = max(o.most, o.readers)
	}
	switch {
	case o.writers > 1 || o.writers == 1 && o.readers > 0:
		o.broken = append(o.broken, fmt.Sprintf("%s entered with %d writers and %d readers inside", who, o.writers, o.readers))
	case limit > 0 && o.readers > limit:
		o.broken = append(o.broken, fmt.Sprintf("%s entered with %d holders inside, limit %d", who, o.readers, limit))
	}
	o.notify()
}

func (o *occupancy) leave(write bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if write {
		o.writers--
	} else {
		o.readers--
		o.released++
	}
	o.notify()
}

func (o *occupancy) notify() {
	close(o.changed)
	o.changed = make(chan struct{})
}

// waitFor waits until cond, read under o's lock, holds, for at most
// demoTogether, and reports whether it did.
func (o *occupancy) waitFor(ctx context.Context, cond func() bool) bool {
	deadline := time.NewTimer(demoTogether)
	defer deadline.Stop()
	for {
		o.mu.Lock()
		ok, ch := cond(), o.changed
		o.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ch:
		case <-deadline.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// readWrite is phase 4: readers share the read-write lock, writers have it
// alone.
func (d *demo) readWrite(ctx context.Context) {
	name := d.base + "/rw"
	writers := d.workers[:2]
	d.phase("4. read-write lock: all %d workers read at once; then %s and %s write while the others read, %d rounds each",
		len(d.workers), writers[0].id, writers[1].id, d.rounds)
	occ := newOccupancy()

	// Everyone reads at once: each stays until all are inside.
	all := len(d.workers)
	together := true
	var wg sync.WaitGroup
	for _, w := range d.workers {
		wg.Go(func() {
			rw := etcdlock.NewRWMutex(w.s, name)
			if err := rw.RLockContext(ctx); err != nil {
				d.fail(w.id, err)
				return
			}
			occ.enter(w.id, false, 0)
			d.event(w.id, rw.Token(), "RLock: reading")
			ok := occ.waitFor(ctx, func() bool { return occ.most == all })
			occ.leave(false)
			if !ok {
				d.mu.Lock()
				together = false
				d.mu.Unlock()
			}
			d.event(w.id, 0, "RUnlock (all %d readers were inside together: %v)", all, ok)
			if err := rw.RUnlockContext(ctx); err != nil {
				d.fail(w.id, err)
			}
		})
	}
	wg.Wait()
	occ.mu.Lock()
	most := occ.most
	occ.mu.Unlock()
	d.mu.Lock()
	ok := together
	d.mu.Unlock()
	d.check(most >= 2 && ok, "read-write: readers overlap: %d readers held the read lock at once (want all %d)", most, all)

	// Writers and readers mixed: a writer is always alone.
	for i, w := range d.workers {
		write := i < len(writers)
		wg.Go(func() {
			rw := etcdlock.NewRWMutex(w.s, name)
			lock, unlock, what := rw.RLockContext, rw.RUnlockContext, "RLock: reading"
			if write {
				lock, unlock, what = rw.LockContext, rw.UnlockContext, "Lock: writing, alone"
			}
			for range d.rounds {
				if err := lock(ctx); err != nil {
					d.fail(w.id, err)
					return
				}
				occ.enter(w.id, write, 0)
				d.event(w.id, rw.Token(), "%s", what)
				time.Sleep(demoSleep)
				occ.leave(write)
				if err := unlock(ctx); err != nil {
					d.fail(w.id, err)
					return
				}
			}
		})
	}
	wg.Wait()
	occ.mu.Lock()
	broken, holds := occ.broken, occ.holds
	occ.mu.Unlock()
	writes := len(writers) * d.rounds
	d.check(len(broken) == 0 && holds == all+len(d.workers)*d.rounds,
		"read-write: writers exclude: no writer shared the lock in %d write and %d read holds (%d overlaps%s)",
		writes, holds-writes, len(broken), firstOf(broken))
}

// firstOf returns ": " and the first of s, or "".
func firstOf(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return ": " + s[0]
}
