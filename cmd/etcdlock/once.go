package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/once"
)

// onceFlags are --once-per and --retention.
type onceFlags struct {
	slot      string
	retention time.Duration
}

func (o *onceFlags) register(c *commandFlags) {
	c.StringVar(&o.slot, "once-per", "", "run COMMAND at most once for this `SLOT` (such as 2026-11-26T03:00) across every run of NAME: skip it (exit 76) if a run recorded the slot done; the slot is recorded only when COMMAND exits 0. Needs --retention")
	c.durationVar(&o.retention, "retention", 0, "25h or 8d", "how `long` etcd keeps --once-per's record of a done slot, from the record; the slot can run again after it")
}

// check returns the usage error of the flags for a run of names in mode,
// if any.
func (o *onceFlags) check(names []string, mode lockMode) error {
	switch {
	case o.slot == "" && o.retention != 0:
		return usagef("run", "--retention is for --once-per")
	case o.slot == "":
		return nil
	case o.retention <= 0:
		return usagef("run", "--once-per needs a positive --retention: how long the slot's record is kept, got %v", o.retention)
	case len(names) > 1 || mode != exclusive:
		return usagef("run", "--once-per is for one NAME held exclusively: not with several --lock, --shared or --limit")
	}
	return nil
}

// slotDone returns the error, exitDone, of --once-per's slot recorded done;
// nil if it is not, or without --once-per.
func (r *runner) slotDone(ctx context.Context) error {
	if r.opts.once.slot == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, once.RecordTimeout)
	defer cancel()
	done, err := once.Done(ctx, r.cli, once.Key(r.names[0], r.opts.once.slot))
	switch {
	case err != nil:
		return unavailable(r.cfg, err)
	case !done:
		return nil
	case r.opts.quiet:
		return withStatus(exitDone, nil)
	}
	return withStatus(exitDone, fmt.Errorf("slot %q of %q is done: %s did not run", r.opts.once.slot, r.name, r.command[0]))
}

// recordSlot records --once-per's slot done, fenced by the run's hold of
// NAME's Mutex, once COMMAND exited 0 with the lock held throughout. It
// returns the error to exit with: exitLost if the hold had ended, nothing
// recorded; exitUnavailable if etcd failed, the record then in etcd or not.
func (r *runner) recordSlot() error {
	held, _ := etcdlock.NewMutex(r.s, r.names[0]).Held()
	ctx, cancel := context.WithTimeout(context.Background(), once.RecordTimeout)
	defer cancel()
	err := once.Record(ctx, r.cli, once.Key(r.names[0], r.opts.once.slot), held.Fence().String(), held.IsOwner(), r.opts.once.retention)
	switch {
	case errors.Is(err, once.ErrNotOwner):
		return withStatus(exitLost, fmt.Errorf("lock %q was gone when %s exited 0: slot %q not recorded done", r.name, r.command[0], r.opts.once.slot))
	case err != nil:
		return unavailable(r.cfg, fmt.Errorf("%s exited 0, but slot %q may not be recorded done: %w", r.command[0], r.opts.once.slot, err))
	}
	return nil
}
