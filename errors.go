package etcdlock

import "errors"

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
