package queue

import "errors"

// The protocol's errors. The caller maps them to its own: none of them
// reaches a user as is.
var (
	// ErrMalformed: a reply of etcd without the shape its request asks
	// for.
	ErrMalformed = errors.New("etcdlock: malformed reply from etcd")
	// ErrKeyGone: our key vanished while we waited (deleted by someone, or
	// its lease revoked).
	ErrKeyGone = errors.New("etcdlock: lock key deleted while waiting")
	// ErrBusy: a try found the lock taken.
	ErrBusy = errors.New("etcdlock: held by another holder")
	// ErrForeignKeys: a group found some of its keys in their queues
	// already, not put together by one acquisition (another process with
	// this lease): it put nothing, and cannot adopt them.
	ErrForeignKeys = errors.New("etcdlock: keys of this lease already in some of the queues")
	// ErrWatchClosed: etcd's client closed a watch that we did not cancel.
	ErrWatchClosed = errors.New("etcdlock: watch closed")
)
