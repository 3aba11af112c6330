package etcdlock

import (
	"context"
	"sync/atomic"
	"time"
)

// The watchdog of Do and Lead (WithWatchdog): f reports progress; one that
// stops reporting gives up the lock.

// A watchdog watches one run of f.
type watchdog struct {
	period  time.Duration
	paused  atomic.Bool  // Lead's own calls run, not f: no period runs out
	last    atomic.Int64 // Unix ns of the last progress, or of f's start
	stalled atomic.Bool  // f's context was cancelled for want of progress
	closed  atomic.Bool  // and the Session closed, f not returning
}

type watchdogKey struct{}

// Progress tells the watchdog of the Do or Lead scope of ctx that f makes
// progress; elsewhere it does nothing. It never blocks nor talks to etcd.
func Progress(ctx context.Context) {
	if ctx == nil {
		return
	}
	if d, ok := ctx.Value(watchdogKey{}).(*watchdog); ok {
		d.last.Store(time.Now().UnixNano())
	}
}

func newWatchdog(period time.Duration) *watchdog {
	d := &watchdog{period: period}
	d.last.Store(time.Now().UnixNano())
	return d
}

// run watches f until stop is closed: after period without progress it
// cancels f's context (cancel), and after another period it closes the
// Session (end).
func (d *watchdog) run(stop <-chan struct{}, cancel func(), end func()) {
	timer := time.NewTimer(d.period)
	defer timer.Stop()
	for {
		select {
		case <-stop:
			return
		case <-timer.C:
		}
		if closed(stop) { // f returned as the period ran out: it was in time
			return
		}
		if d.paused.Load() {
			timer.Reset(d.period)
			continue
		}
		idle := time.Since(time.Unix(0, d.last.Load()))
		if idle < d.period {
			timer.Reset(d.period - idle)
			continue
		}
		d.stalled.Store(true)
		cancel()
		break
	}
	timer.Reset(d.period)
	for {
		select {
		case <-stop:
			return
		case <-timer.C:
		}
		if closed(stop) {
			return
		}
		if d.paused.Load() {
			// f returned; Lead's hand-over runs.
			timer.Reset(d.period)
			continue
		}
		d.closed.Store(true)
		end()
		return
	}
}

// exempt runs fn with the watchdog of ctx, if any, paused: Lead's own calls
// before and after f (its claim of a term, its hand-over) are not f's work,
// and a slow etcd must not make the watchdog cancel f or close the Session.
// The period starts again when fn returns.
func exempt(ctx context.Context, fn func()) {
	d, _ := ctx.Value(watchdogKey{}).(*watchdog)
	if d == nil {
		fn()
		return
	}
	d.paused.Store(true)
	defer func() {
		d.last.Store(time.Now().UnixNano())
		d.paused.Store(false)
	}()
	fn()
}

// closed reports whether ch is closed, without waiting.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
