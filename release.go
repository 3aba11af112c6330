package etcdlock

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Breaking a stuck lock: an operator deletes a holder's key, fenced on its
// token, and the holder learns of it through its loss signal.

// Release deletes the key of e, an entry that Inspect (or Follow) returned
// for the lock called name, if that key still exists with e.Token as its
// create revision: it breaks a hold, or takes a waiter out of the queue, of
// any kind (Mutex, reader, writer, permit, one of a MultiMutex's keys, Lead's,
// concurrency.Mutex's, etcdctl lock's). It is one Txn, fenced on the token:
// it never deletes a later hold of the same key.
//
// The holder's Done closes within about 100 ms (HoldLost, LossKeyDeleted,
// names the key and token); its IsOwner guard fails at once; its last unlock
// returns ErrLockLost; Do's and Lead's f see their context cancelled, and
// Lead campaigns again. The next in the queue holds at once. A holder that
// never looks at Done goes on as if it held: Release makes a lock safe only
// for a resource fenced on the token or guarded by IsOwner. Of a MultiMutex's
// hold, Release deletes the one key given: the holder's Done closes, and its
// other keys (same lease and token under its other names) stay, and block
// those names, until its unlock deletes them or its lease ends.
//
// It returns nil when it deleted the key; ErrNotHeld, wrapped, changing
// nothing, when the key is gone or was put again (a new token): the hold
// ended or was released already; ErrInvalidName for the empty name;
// ErrInvalidArgument, wrapped, writing nothing, for a nil context or client,
// a key that is not a key of name's queue, or a token that is not positive;
// else etcd's error, wrapped, where the delete may or may not have been
// applied (Inspect tells).
func Release(ctx context.Context, client *clientv3.Client, name string, e QueueEntry) error {
	if err := validateClient(ctx, client, name); err != nil {
		return err
	}
	switch {
	case e.Key == name+"/" || !inQueue(name+"/", []byte(e.Key)):
		return errorf("release", name, fmt.Errorf("%w: %q is not a key of the lock's queue", ErrInvalidArgument, e.Key))
	case e.Token <= 0:
		return errorf("release", name, fmt.Errorf("%w: token must be positive, got %d", ErrInvalidArgument, e.Token))
	}
	resp, err := client.Txn(ctx).If(ownerCmp(e.Key, e.Token)).Then(clientv3.OpDelete(e.Key)).Commit()
	switch {
	case err != nil:
		return errorf("release", name, err)
	case resp == nil:
		return errorf("release", name, errMalformed)
	case !resp.Succeeded:
		return errorf("release", name, goneError{e.Key, e.Token})
	}
	return nil
}

// A goneError says that the key a Release was for is gone; it is
// ErrNotHeld.
type goneError struct {
	key   string
	token int64
}

func (e goneError) Error() string {
	return fmt.Sprintf("no key %q with token %d: unlocked or released already", e.key, e.token)
}

func (e goneError) Is(target error) bool { return target == ErrNotHeld }
