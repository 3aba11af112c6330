package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/etcdlock/etcdlock/internal/queue"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

var (
	// ErrNotHeld: an unlock with nothing of its kind held (by the goroutine or its
	// Do scope), a nil or released Permit, a Release of a key gone or remade.
	// Nothing changes.
	ErrNotHeld = errors.New("etcdlock: unlock of a lock not held by this goroutine")

	// ErrSessionExpired: the Session's lease (WithRenewal: the call's) is gone:
	// revoked, expired, closed, its client or WithContext context ended.
	ErrSessionExpired = errors.New("etcdlock: session expired")

	// ErrInvalidName is returned for the empty name; nothing is written.
	ErrInvalidName = errors.New("etcdlock: invalid lock name")

	// ErrInvalidArgument, wrapped with the detail: a nil argument, no MultiMutex
	// names, a value out of range, WithLease or WithContext given to Lead.
	// Nothing is written.
	ErrInvalidArgument = errors.New("etcdlock: invalid argument")

	// ErrLockLost: the key was gone at the unlock (the section may not have been
	// exclusive), or lost under Do's f, or at CheckFence; to a re-lock of a hold
	// known lost, changing nothing.
	ErrLockLost = errors.New("etcdlock: lock lost")

	// ErrWouldDeadlock, changing nothing: the goroutine holds what it would wait
	// for (the read lock of the RWMutex it would write; a MultiMutex's name held
	// another way, or the reverse).
	ErrWouldDeadlock = errors.New("etcdlock: lock asked by a goroutine that holds what it would wait for")

	// ErrNoPermit is returned by Semaphore.TryAcquire when its wait ran out.
	ErrNoPermit = errors.New("etcdlock: no permit free")

	// ErrLimitMismatch: a holder or waiter of the name has another limit (or is
	// no Semaphore), and none is recorded.
	ErrLimitMismatch = errors.New("etcdlock: semaphore limit mismatch")

	// ErrStalled: f reported no progress within the WithWatchdog period.
	ErrStalled = errors.New("etcdlock: no progress reported within the watchdog period")

	// ErrNoLeader is returned, wrapped, by LeaderOf when nobody leads.
	ErrNoLeader = errors.New("etcdlock: no leader")

	// ErrInvalidFence, wrapped with what is wrong: text or a Fence that names no
	// hold of a lock; nothing is read or written.
	ErrInvalidFence = errors.New("etcdlock: invalid fence")
)

// validate returns the error that makes a call on the lock name impossible,
// if any: no session (hasSession false), no context, or no name.
func validate(hasSession bool, name string, ctx context.Context) error {
	switch {
	case !hasSession:
		return fmt.Errorf("%w: nil session", ErrInvalidArgument)
	case ctx == nil:
		return fmt.Errorf("%w: nil context", ErrInvalidArgument)
	case name == "":
		return ErrInvalidName
	}
	return nil
}

// validateClient is validate for a call on a client: a nil context or
// client is ErrInvalidArgument, wrapped; the empty name ErrInvalidName.
func validateClient(ctx context.Context, client *clientv3.Client, name string) error {
	if client == nil && ctx != nil {
		return fmt.Errorf("%w: nil client", ErrInvalidArgument)
	}
	return validate(true, name, ctx)
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

// needs returns err, where it is etcd's "permission denied", with what the
// call needs of the role (such as "read on etcdlock.limit.jobs"); any other
// error as it is. errors.Is still sees etcd's error.
func needs(err error, what string) error {
	if !errors.Is(err, rpctypes.ErrPermissionDenied) {
		return err
	}
	return fmt.Errorf("%w: the role needs %s", err, what)
}
