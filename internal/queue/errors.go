package queue

import (
	"errors"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
)

// The protocol's errors. The caller maps them to its own: none of them
// reaches a user as is.
var (
	// ErrMalformed: a reply of etcd without the shape its request asks
	// for.
	ErrMalformed = errors.New("etcdlock: malformed reply from etcd")
	// ErrKeyGone: our key vanished while we waited (deleted by someone, or
	// its lease revoked).
	ErrKeyGone = errors.New("etcdlock: lock key deleted while waiting")
	// ErrBusy: a try found the lock taken, or a wait ended while other
	// keys held it.
	ErrBusy = errors.New("etcdlock: held by another holder")
	// ErrForeignKeys: a group found some of its keys in their queues
	// already, not put together by one acquisition (another process with
	// this lease): it put nothing, and cannot adopt them.
	ErrForeignKeys = errors.New("etcdlock: keys of this lease already in some of the queues")
	// ErrWatchClosed: etcd's client closed a watch that we did not cancel.
	ErrWatchClosed = errors.New("etcdlock: watch closed")
)

// refused reports whether err is etcd's refusal of a request: a reply from
// the server that it did not apply it (permission denied, a lease not
// found, no space, too many requests, a bad request). Any other error, a
// lost reply or a deadline during the call among them, leaves the request
// maybe applied, or maybe applied later.
func refused(err error) bool {
	var e rpctypes.EtcdError
	if !errors.As(err, &e) {
		return false
	}
	switch e.Code() {
	case codes.InvalidArgument, codes.OutOfRange, codes.NotFound, codes.AlreadyExists,
		codes.FailedPrecondition, codes.PermissionDenied, codes.Unauthenticated,
		codes.ResourceExhausted, codes.Unimplemented:
		return true
	}
	return false
}
