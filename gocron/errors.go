package etcdlockgocron

import "errors"

var (
	// ErrBusy is returned, wrapped with the job's name, by Locker.Lock when
	// another replica (or another run in this process) holds the job's lock:
	// gocron then skips the run.
	ErrBusy = errors.New("etcdlockgocron: job locked by another run")

	// ErrNotLeader is returned by Elector.IsLeader while this replica does
	// not lead, wrapped with the reason once the Elector has stopped
	// campaigning.
	ErrNotLeader = errors.New("etcdlockgocron: not the leader")

	// ErrInvalidArgument is returned, wrapped with the detail, for a nil
	// Session or context, an empty prefix, name or job name, or a negative
	// WithMinHold; nothing is written.
	ErrInvalidArgument = errors.New("etcdlockgocron: invalid argument")
)
