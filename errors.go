package etcdlock

import (
	"errors"
	"fmt"
	"strings"
)

var (
	// ErrNotHeld is returned by UnlockContext when the calling goroutine holds
	// no hold on the Mutex. Nothing is changed, in this process or in etcd.
	ErrNotHeld = errors.New("etcdlock: unlock of a lock not held by this goroutine")

	// ErrSessionExpired is returned by every lock call once the Session's
	// lease is gone: revoked, expired, closed, or its WithContext context
	// cancelled. No lock can be taken with that Session again; make a new one.
	ErrSessionExpired = errors.New("etcdlock: session expired")

	// ErrInvalidName is returned by every context method of a Mutex made with
	// the empty name. Nothing is written to etcd.
	ErrInvalidName = errors.New("etcdlock: invalid lock name")

	// ErrInvalidArgument is returned, wrapped with the detail, for a nil
	// client, nil session, nil context, nil option or a TTL that is not
	// positive. Nothing is written to etcd.
	ErrInvalidArgument = errors.New("etcdlock: invalid argument")

	// ErrLockLost is returned by UnlockContext when the last hold ends but the
	// lock's key was already gone from etcd (deleted by someone else, or its
	// lease expired) while the Session itself is still alive: the critical
	// section may not have been exclusive. The hold is ended all the same.
	ErrLockLost = errors.New("etcdlock: lock lost before unlock")
)

// Errors that never leave the package.
var (
	// errMalformed: a reply of etcd without the shape its request asks
	// for, as seen under network faults. An error, never a panic.
	errMalformed = errors.New("etcdlock: malformed reply from etcd")
	// errKeyGone: our key vanished while we waited (deleted by someone, or
	// the lease was revoked).
	errKeyGone = errors.New("etcdlock: lock key deleted while waiting")
	// errBusy: a try found the lock taken.
	errBusy = errors.New("etcdlock: held by another holder")
	// errWatchClosed: etcd's client closed a watch that we did not cancel.
	errWatchClosed = errors.New("etcdlock: watch closed")
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
