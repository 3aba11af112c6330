package etcdlock

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Do runs f holding the lock (package doc, For jobs). It returns the lock's
// error if f did not run; else f's; else ErrLockLost if the hold was lost (or
// about to be) under f; else the release's; ErrStalled if the watchdog acted.
func (m *Mutex) Do(ctx context.Context, f func(ctx context.Context) error) error {
	o := m.do(ctx, waitForever, f)
	switch {
	case o.stalled:
		return ErrStalled
	case o.err != nil:
		return o.err
	case o.lost:
		return ErrLockLost
	}
	return o.release
}

// A doing is how a Do went.
type doing struct {
	ran     bool  // f ran: err is f's, not the lock's
	busy    bool  // the wait ran out: f did not run
	err     error // the lock's error, or f's
	lost    bool  // the hold was lost, or about to be, while f ran
	stalled bool  // f reported no progress within the watchdog's period
	closed  bool  // and did not return within another: the Session was closed
	release error // the release's error
}

// do takes the lock, waiting as acquire's wait says, runs f and releases
// the lock, as Do does.
func (m *Mutex) do(ctx context.Context, wait time.Duration, f func(ctx context.Context) error) (o doing) {
	if f == nil {
		return doing{err: fmt.Errorf("%w: nil function", ErrInvalidArgument)}
	}
	if ok, err := m.acquire(ctx, wait); !ok {
		return doing{err: err, busy: err == nil}
	}
	st := m.state(false)
	fctx, sc := st.openScope(ctx)
	held, _ := m.Held()
	fctx = context.WithValue(fctx, heldKey{}, held)
	var term *leaseTerm // the lease of the hold
	if held.h != nil {
		term = held.h.t.term
	}
	var dog *watchdog
	if period := m.s.watchdog; period > 0 {
		dog = newWatchdog(period)
		fctx = context.WithValue(fctx, watchdogKey{}, dog)
	}
	fctx, cancel := context.WithCancel(fctx)
	loss := m.Done()

	// The watcher cancels f's context on a loss, and is gone before the
	// release, so that the release's own closing of Done is not a loss.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var lost bool // read once the watcher is done
	wg.Go(func() {
		select {
		case <-loss:
			lost = true
			cancel()
		case <-stop:
		}
	})
	if dog != nil {
		wg.Go(func() { dog.run(stop, cancel, func() { _ = m.s.Close() }) })
	}

	defer func() {
		close(stop)
		wg.Wait()
		cancel()
		st.closeScope(sc)
		o.lost = lost || term != nil && term.Expired()
		o.stalled = dog != nil && dog.stalled.Load()
		o.closed = dog != nil && dog.closed.Load()
		o.release = m.UnlockContext(context.WithoutCancel(ctx))
	}()
	return doing{ran: true, err: f(fctx)}
}

type heldKey struct{}

// HoldFrom returns the hold of ctx's innermost Do or Lead scope (maybe ended).
func HoldFrom(ctx context.Context) (Hold, bool) {
	h, ok := ctx.Value(heldKey{}).(Hold)
	return h, ok
}
