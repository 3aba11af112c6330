package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/etcdlock/etcdlock"
)

// demoLimit is the limit of the demo's semaphore: below the number of
// workers, so that some wait.
const demoLimit = 2

// semaphore is phase 5: every worker takes a permit d.rounds times; never
// more than demoLimit hold one at once.
func (d *demo) semaphore(ctx context.Context) {
	name := d.base + "/sem"
	total := len(d.workers) * d.rounds
	d.phase("5. semaphore, limit %d: %d workers × %d permits; each holder reads the queue in etcd (Inspect)", demoLimit, len(d.workers), d.rounds)
	occ := newOccupancy()
	var (
		mu       sync.Mutex
		inspects int      // reads of the queue by holders
		wrong    []string // reads where the holder's key was not among the limit oldest
		idle     int      // holders that waited in vain for the permits to fill
	)
	var wg sync.WaitGroup
	for _, w := range d.workers {
		wg.Go(func() {
			sem := etcdlock.NewSemaphore(w.s, name, demoLimit)
			for range d.rounds {
				p, err := sem.Acquire(ctx)
				if err != nil {
					d.fail(w.id, err)
					return
				}
				occ.enter(w.id, false, demoLimit)
				queue, ok := d.semaphoreQueue(ctx, name, p.Key())
				d.event(w.id, p.Token(), "Acquire: permit; etcd says %s", queue)
				mu.Lock()
				inspects++
				if !ok {
					wrong = append(wrong, fmt.Sprintf("%s: %s", w.id, queue))
				}
				mu.Unlock()
				// Stay until the permits are full, or as full as the permits
				// still wanted can make them: a free permit never stays idle
				// while someone waits.
				full := occ.waitFor(ctx, func() bool { return occ.readers >= min(demoLimit, total-occ.released) })
				if !full {
					mu.Lock()
					idle++
					mu.Unlock()
				}
				time.Sleep(demoSleep)
				occ.leave(false)
				if err := p.Release(ctx); err != nil {
					d.fail(w.id, err)
					return
				}
			}
		})
	}
	wg.Wait()

	occ.mu.Lock()
	broken, most, holds := occ.broken, occ.most, occ.holds
	occ.mu.Unlock()
	d.check(len(broken) == 0 && holds == total, "semaphore: never more than %d holders at once in %d permits (%d times more%s)", demoLimit, holds, len(broken), firstOf(broken))
	d.check(len(wrong) == 0 && inspects == total, "semaphore: in etcd, each holder's key was among the %d oldest (%d of %d reads%s)", demoLimit, inspects-len(wrong), inspects, firstOf(wrong))
	d.check(most == demoLimit && idle == 0, "semaphore: the limit was reached: %d holders at once (want %d), no permit left idle while a worker waited (%d times)", most, demoLimit, idle)
}

// semaphoreQueue reads the semaphore's queue with Inspect and describes it;
// ok reports whether key holds, as one of the limit oldest keys.
func (d *demo) semaphoreQueue(ctx context.Context, name, key string) (desc string, ok bool) {
	ctx, cancel := context.WithTimeout(ctx, demoOpTimeout)
	defer cancel()
	entries, err := etcdlock.Inspect(ctx, d.admin, name)
	if err != nil {
		d.fail("admin", err)
		return err.Error(), false
	}
	own := tokenOf(entries, key)
	older, mine, holds := 0, false, 0 // keys older than ours; ours holds; holders
	for _, e := range entries {
		if e.Holds {
			holds++
		}
		switch {
		case e.Key == key:
			mine = e.Holds && e.Kind == etcdlock.KindSemaphore
		case e.Token < own:
			older++
		}
	}
	holders, waiters := queueIdentities(entries)
	return fmt.Sprintf("holders %s; waiting %s", holders, waiters), mine && older < demoLimit && holds <= demoLimit
}

// tokenOf returns the token of key in entries, 0 if it is not there.
func tokenOf(entries []etcdlock.QueueEntry, key string) int64 {
	for _, e := range entries {
		if e.Key == key {
			return e.Token
		}
	}
	return 0
}
