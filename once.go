package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/etcdlock/etcdlock/internal/once"
)

// A OnceResult says how a DoOnce or TryDoOnce call went; 0, with an error,
// that f did not run. OnceRan with nil: the slot is recorded done; with f's
// error or ErrLockLost, not (a later call runs f); with ErrStalled, only if f
// returned nil; with etcd's, maybe. After OnceBusy the slot may be done.
type OnceResult int

const (
	OnceRan  OnceResult = iota + 1 // f ran
	OnceDone                       // f did not run: the slot was recorded done, before the lock or once held
	OnceBusy                       // f did not run: the lock was busy (TryDoOnce)
)

// String returns "ran", "skipped: done", "skipped: busy" or "did not run".
func (o OnceResult) String() string {
	switch o {
	case OnceRan:
		return "ran"
	case OnceDone:
		return "skipped: done"
	case OnceBusy:
		return "skipped: busy"
	}
	return "did not run"
}

// DoOnce runs f at most once per slot (a date, say) across the processes that
// name the lock and slot, as far as the lock excludes (fence: HoldFrom):
// OnceDone while etcd holds the slot's record; else f runs as in Do if the
// record is still missing once held, and if f returns nil the record is put,
// guarded by the hold, on a lease of retention (at least etcd's minimum TTL).
// No clock is read; a lost reply never runs f twice; a crash under f leaves
// the slot undone; bad input (ErrInvalidArgument), lock errors: nothing done.
func (m *Mutex) DoOnce(ctx context.Context, slot string, retention time.Duration, f func(ctx context.Context) error) (OnceResult, error) {
	return m.doOnce(ctx, slot, retention, waitForever, f)
}

// TryDoOnce is DoOnce waiting at most wait, for cron: (OnceBusy, nil) while
// another holds or waits the whole wait, nothing run or written.
func (m *Mutex) TryDoOnce(ctx context.Context, slot string, retention, wait time.Duration, f func(ctx context.Context) error) (OnceResult, error) {
	return m.doOnce(ctx, slot, retention, max(wait, tryOnly), f)
}

// doOnce is DoOnce and TryDoOnce, waiting for the lock as acquire's wait
// says.
func (m *Mutex) doOnce(ctx context.Context, slot string, retention, wait time.Duration, f func(ctx context.Context) error) (OnceResult, error) {
	if err := m.check(ctx); err != nil {
		return 0, err
	}
	switch {
	case slot == "":
		return 0, fmt.Errorf("%w: empty slot", ErrInvalidArgument)
	case retention <= 0:
		return 0, fmt.Errorf("%w: retention %v, want > 0", ErrInvalidArgument, retention)
	case f == nil:
		return 0, fmt.Errorf("%w: nil function", ErrInvalidArgument)
	}
	client := m.s.Client()
	key := once.Key(m.name, slot)
	if done, err := once.Done(ctx, client, key); err != nil || done {
		return doneOr(err)
	}
	var (
		result  OnceResult // how the call went, once the lock was held
		lockErr error      // an error of the lock's, not f's: f did not run
	)
	o := m.do(ctx, wait, func(fctx context.Context) error {
		// A run may have ended while we waited: the read, after the lock
		// was taken, sees its record.
		done, err := once.Done(fctx, client, key)
		if err != nil || done {
			result, lockErr = doneOr(err)
			return lockErr
		}
		result = OnceRan
		if err := f(fctx); err != nil {
			return err
		}
		held, _ := HoldFrom(fctx)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), once.RecordTimeout)
		defer cancel()
		err = once.Record(rctx, client, key, held.Fence().String(), held.IsOwner(), retention)
		if errors.Is(err, once.ErrNotOwner) {
			return fmt.Errorf("%w: slot %q not recorded done", ErrLockLost, slot)
		}
		return err
	})
	switch {
	case o.busy:
		return OnceBusy, nil
	case !o.ran:
		return 0, o.err
	case result != OnceRan:
		if lockErr != nil {
			return 0, lockErr
		}
		return result, o.release
	case o.stalled:
		return OnceRan, ErrStalled
	case o.err != nil:
		return OnceRan, o.err
	}
	// The record's Txn, guarded by the hold, succeeded: the hold lasted
	// from the lock to the record, whatever Done said meanwhile, and a loss
	// after it is no news to the caller.
	if errors.Is(o.release, ErrLockLost) {
		return OnceRan, nil
	}
	return OnceRan, o.release
}

// doneOr returns OnceDone if err is nil, else err, f not run.
func doneOr(err error) (OnceResult, error) {
	if err != nil {
		return 0, err
	}
	return OnceDone, nil
}
