package etcdlock

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Breaking a stuck lock: an operator deletes a holder's key, fenced on its
// token, and the holder learns of it through its loss signal.

// Release deletes e's key (as Inspect lists it) from name's queue in one Txn,
// if its create revision is still e.Token: it breaks a hold, or takes out a
// waiter, of any kind; the next holds at once (a MultiMutex's other keys stay
// until its unlock or lease's end). It returns nil once deleted; ErrNotHeld,
// wrapped, if the key is gone or remade; ErrInvalidName or ErrInvalidArgument,
// wrapped, for bad input, nothing written; else etcd's error (applied or not).
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
