package etcdlock

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Lock-delay (WithLockDelay): an acquisition that follows a crash waits
// before it returns, so that the holder that crashed, or was cut off, has
// time to see its loss.

// lockDelayReadTimeout bounds each read that tells a crash from an unlock.
const lockDelayReadTimeout = time.Second

// lockDelay waits the Session's lock-delay, once t holds with the hold h,
// where t waited for a key that went with its lease. The hold is made
// first: its cap counts from it, and its loss signal is watched during the
// delay. It returns ctx's error if ctx ends first, and ErrLockLost, wrapped,
// if the hold is lost first (its key deleted, its lease gone or silent, its
// cap reached).
func (t *ticket) lockDelay(ctx context.Context, h *keyHold) error {
	d := t.s.lockDelay
	if d <= 0 || !t.Contended() || !t.followsCrash(ctx) {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-h.lost():
		return fmt.Errorf("%w: during its lock-delay", ErrLockLost)
	}
}

// followsCrash reports whether a key ahead of t's in its queues when t's was
// put has a lease etcd no longer has; true also where it cannot tell.
func (t *ticket) followsCrash(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, lockDelayReadTimeout)
	defer cancel()
	// The queues as our key found them: a read at its revision.
	var kvs []*mvccpb.KeyValue
	names := queueNames(t.kind, t.lock, t.Keys())
	for _, name := range names {
		resp, err := t.s.client.Get(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithRev(t.Rev()))
		if err != nil {
			return true
		}
		kvs = append(kvs, resp.Kvs...)
	}
	asked := map[clientv3.LeaseID]bool{t.term.id: true}
	for _, kv := range kvs {
		lease := clientv3.LeaseID(kv.Lease)
		if kv.CreateRevision >= t.Rev() || asked[lease] || !inQueues(names, kv.Key) {
			continue
		}
		asked[lease] = true
		if lease == clientv3.NoLease {
			continue // a key without a lease goes only by a delete
		}
		ttl, err := t.s.client.TimeToLive(ctx, lease)
		if err != nil || ttl.TTL == -1 {
			return true // gone (rpctypes.ErrLeaseNotFound, or TTL -1), or cannot tell
		}
	}
	return false
}
