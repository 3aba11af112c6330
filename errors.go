package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/etcdlock/etcdlock/internal/queue"
)

var (
	// ErrNotHeld is returned by the unlock methods of Mutex and RWMutex when
	// the calling goroutine (or the Do scope of its context) holds no hold
	// of that kind, and by Permit.Release for a nil or already released
	// Permit. Nothing is changed, in this process or in etcd.
	ErrNotHeld = errors.New("etcdlock: unlock of a lock not held by this goroutine")

	// ErrSessionExpired is returned by every lock call once the Session's
	// lease is gone: revoked, expired, closed, its client closed, or its
	// WithContext context cancelled. Without WithRenewal no lock can be
	// taken with that Session again; make a new one. WithRenewal it means
	// "the lease this call used, or would use, is gone": the Session goes on
	// with a new lease, and a later call takes the lock on it; it ends only
	// at Close, at the end of its WithContext context, or when its client is
	// closed.
	ErrSessionExpired = errors.New("etcdlock: session expired")

	// ErrInvalidName is returned by every context method of a Mutex,
	// RWMutex or Semaphore made with the empty name, and by Lead and Inspect
	// given one. Nothing is written to etcd.
	ErrInvalidName = errors.New("etcdlock: invalid lock name")

	// ErrInvalidArgument is returned, wrapped with the detail, for a nil
	// client, nil session, nil context, nil option, nil Observer or Logger,
	// nil function (Do, Lead), a TTL or lease ID that is not positive, a negative hand-off
	// count, a Semaphore limit below 1, or WithLease or WithContext given to
	// Lead. Nothing is written to etcd.
	ErrInvalidArgument = errors.New("etcdlock: invalid argument")

	// ErrLockLost is returned by UnlockContext when the last hold ends but the
	// lock's key was already gone from etcd (deleted by someone else, or its
	// lease expired) while the Session itself is still alive: the critical
	// section may not have been exclusive. The hold is ended all the same.
	//
	// It is also returned by the lock methods to a goroutine that locks
	// again a lock whose hold it still has but that is known lost (its Done
	// closed, or its lease is gone): the call changes nothing, and the
	// goroutine ends the dead hold with its unlocks before it can lock again.
	ErrLockLost = errors.New("etcdlock: lock lost")

	// ErrWouldDeadlock is returned by RWMutex.LockContext and TryLockFor to
	// a goroutine that holds a read lock of the same RWMutex: the write lock
	// would wait for that read lock forever. It is returned by the context
	// methods of a MultiMutex to a goroutine that holds one of its names
	// another way (a Mutex, a Do scope, another MultiMutex), and by a
	// Mutex's to a goroutine that holds its name through a MultiMutex: it
	// would hold one lock while it waits for another. Nothing is changed.
	ErrWouldDeadlock = errors.New("etcdlock: lock asked by a goroutine that holds what it would wait for")

	// ErrNoPermit is returned by Semaphore.TryAcquire when no permit came
	// free within the wait. No key is left behind.
	ErrNoPermit = errors.New("etcdlock: no permit free")

	// ErrLimitMismatch is returned by Semaphore.Acquire and TryAcquire when
	// another holder or waiter of the name uses a different limit (or the
	// name's keys are not a Semaphore's). No key is left behind.
	ErrLimitMismatch = errors.New("etcdlock: semaphore limit mismatch")

	// ErrNoLeader is returned, wrapped with the lock's name, by LeaderOf
	// when nobody holds the Mutex queue of the name: no Lead leads it, and
	// no Mutex, concurrency.Mutex or etcdctl lock holds it.
	ErrNoLeader = errors.New("etcdlock: no leader")
)

// validate returns the error that makes a call on the lock name impossible,
// if any: no Session (hasSession false), no context, or no name.
func validate(hasSession bool, name string, ctx context.Context) error {
	switch {
	case !hasSession:
		return fmt.Errorf("%w: nil Session", ErrInvalidArgument)
	case ctx == nil:
		return fmt.Errorf("%w: nil context", ErrInvalidArgument)
	case name == "":
		return ErrInvalidName
	}
	return nil
}

// Errors that never leave the package.
var (
	// errMalformed: a reply of etcd without the shape its request asks
	// for, as seen under network faults. An error, never a panic.
	errMalformed = queue.ErrMalformed
	// errBusy: a try found the lock taken.
	errBusy = queue.ErrBusy
	// errCleaning: a call found its lock's turn in this process waiting for
	// the delete of an earlier key of this process, retried in the
	// background: etcd may still have that key, or not; nobody else holds.
	errCleaning = errors.New("etcdlock: an earlier key of this process may still be in etcd: its delete is being retried")
	// errRelockLost: a re-lock of a hold known lost.
	errRelockLost = fmt.Errorf("%w: the calling goroutine still has the lost hold: unlock it before locking again", ErrLockLost)
)

// An opError is the error of one operation on one lock. Its message has one
// "etcdlock:" prefix however deep the cause; errors.Is and errors.As see the
// cause.
type opError struct {
	op, name string
	err      error
}

// errorf wraps err as the error of op on the lock name.
func errorf(op, name string, err error) error {
	return &opError{op: op, name: name, err: err}
}

func (e *opError) Error() string {
	return fmt.Sprintf("etcdlock: %s %q: %s", e.op, e.name, strings.TrimPrefix(e.err.Error(), "etcdlock: "))
}

func (e *opError) Unwrap() error { return e.err }
