package fence

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/etcdlock/etcdlock"
)

// ErrStale is returned, wrapped with the tokens, for a fence whose token is
// lower than the highest accepted for its lock: its holder has lost the lock
// to a later one, and its write is refused.
var ErrStale = errors.New("fence: stale token")

// A Store keeps, per lock name, the highest fencing token it has accepted,
// and runs work under it.
type Store interface {
	// Do runs work if f's token is not lower than the highest accepted for
	// f's lock, after recording it as the highest; otherwise it returns an
	// error wrapping ErrStale and does not run work. While work runs, no
	// other Do of the same lock runs its work: a higher token that arrives
	// meanwhile waits for it, so that nothing is accepted out of token
	// order. Do returns work's error, or the Store's own. An invalid f is an
	// error wrapping etcdlock.ErrInvalidFence, and nothing is recorded.
	Do(ctx context.Context, f etcdlock.Fence, work func(ctx context.Context) error) error
}

// Memory is a Store in memory, for one process: its highest tokens go with
// it. It keeps one entry per lock name it has seen, for its life: behind a
// Handler with no Lock, which takes the name from the request, a client can
// make it grow; set Handler.Lock, or use SQLStore there. The zero Memory
// is ready to use; it must not be copied after first use.
type Memory struct {
	mu    sync.Mutex
	locks map[string]*memoryLock
}

// memoryLock is the highest token of one lock, and the turn of its work.
type memoryLock struct {
	turn    chan struct{} // a one-slot semaphore: held while work runs
	highest int64         // guarded by turn
}

// Do runs work as Store describes. Waiting for the work of another fence of
// the lock ends with ctx: Do then returns ctx.Err() and records nothing.
func (m *Memory) Do(ctx context.Context, f etcdlock.Fence, work func(ctx context.Context) error) error {
	if err := valid(ctx, f); err != nil {
		return err
	}
	if m == nil || work == nil {
		return fmt.Errorf("%w: nil Memory or work", etcdlock.ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	l := m.lock(f.Name)
	select {
	case l.turn <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-l.turn }()
	if f.Token < l.highest {
		return stale(f, l.highest)
	}
	// Admitted, whatever the work does: unlike SQLStore's transaction, the
	// work may have written part of its change before it failed, and an
	// older holder must not write over that.
	l.highest = f.Token
	return work(ctx)
}

// Highest returns the highest token accepted for the lock name, 0 if none
// (and for a nil Memory). It waits for the work of a Do of the lock that is
// running.
func (m *Memory) Highest(name string) int64 {
	if m == nil {
		return 0
	}
	l := m.lock(name)
	l.turn <- struct{}{}
	defer func() { <-l.turn }()
	return l.highest
}

// lock returns the record of the lock name, made on first use.
func (m *Memory) lock(name string) *memoryLock {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.locks == nil {
		m.locks = map[string]*memoryLock{}
	}
	l, ok := m.locks[name]
	if !ok {
		l = &memoryLock{turn: make(chan struct{}, 1)}
		m.locks[name] = l
	}
	return l
}

// valid returns the error that makes a check of f impossible: no context,
// or a Fence that names no hold.
func valid(ctx context.Context, f etcdlock.Fence) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", etcdlock.ErrInvalidArgument)
	}
	if _, err := f.MarshalText(); err != nil || f == (etcdlock.Fence{}) {
		if err == nil {
			err = fmt.Errorf("%w: the zero Fence names no hold", etcdlock.ErrInvalidFence)
		}
		return err
	}
	return nil
}

// stale returns the error of a fence below the highest token of its lock.
func stale(f etcdlock.Fence, highest int64) error {
	return fmt.Errorf("%w: lock %q: token %d, below %d", ErrStale, f.Name, f.Token, highest)
}
