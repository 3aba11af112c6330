// Package once keeps the records of run slots done, for Mutex.DoOnce and
// etcdlock run --once-per: where a record lives, how it is read, and how it
// is put, fenced by a hold.
package once

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Prefix begins every record's key. Like the fence keys
// ("etcdlock.fence."), a record's key has no "/": no lock's prefix
// ("NAME/") holds it, so no queue, ours, etcd's concurrency.Mutex's or
// etcdctl lock's, counts it as a member.
const Prefix = "etcdlock.done."

// escape writes the bytes that would make a key ambiguous, or put it under
// a lock's prefix, as %XX: "%", "/" and the separator "@".
var escape = strings.NewReplacer("%", "%25", "/", "%2F", "@", "%40")

// Key returns the key of the record of slot on the lock name:
// etcdlock.done.<name>@<slot>, "%", "/" and "@" written %XX in both, so that
// two (name, slot) pairs never share a key.
func Key(name, slot string) string {
	return Prefix + escape.Replace(name) + "@" + escape.Replace(slot)
}

// ErrNotOwner: the hold that was to fence the record had ended; nothing is
// recorded.
var ErrNotOwner = errors.New("etcdlock: the hold ended before the slot was recorded done")

// Done reports whether key holds a record.
func Done(ctx context.Context, kv clientv3.KV, key string) (bool, error) {
	resp, err := kv.Get(ctx, key, clientv3.WithCountOnly())
	if err != nil {
		return false, fmt.Errorf("etcdlock: read the record %q: %w", key, err)
	}
	return resp.Count > 0, nil
}

// RecordTimeout bounds the record of a slot once its work is done, and the
// CLI's reads of a record: the record is written even if the caller's
// context ended meanwhile, since the work is done and an unrecorded slot
// runs again.
const RecordTimeout = 5 * time.Second

// retryPause is the pause before a put whose reply was lost is sent again.
const retryPause = 100 * time.Millisecond

// Record puts value at key with a lease of its own, of retention rounded
// up to whole seconds, in a Txn guarded by owner (a hold's IsOwner): the
// record outlives the hold and its Session, and goes when its lease
// expires. It returns nil once etcd said the put was applied; ErrNotOwner
// if the hold had ended and no put of this call was applied, its lease then
// revoked; etcd's refusal, the lease revoked, unless an earlier put of the
// call lost its reply (then nil if that put stands, the key on our lease,
// and the lease left to expire if the key cannot be read); else etcd's
// error (or, the hold ended, a read that failed), the record then in etcd
// or not, its lease left to expire.
//
// A put whose reply was lost is sent again until ctx ends: under the same
// guard, with the same value and lease, it is the same write, so a first
// put applied without its reply makes no second record.
func Record(ctx context.Context, c *clientv3.Client, key, value string, owner clientv3.Cmp, retention time.Duration) error {
	lease, err := c.Grant(ctx, int64((retention+time.Second-1)/time.Second))
	if err != nil {
		return fmt.Errorf("etcdlock: grant the lease of the record %q: %w", key, err)
	}
	put := clientv3.OpPut(key, value, clientv3.WithLease(lease.ID))
	unsure := false // an earlier put's outcome is not known: it may stand
	for {
		resp, err := c.Txn(ctx).If(owner).Then(put).Commit()
		switch {
		case err == nil && resp.Succeeded:
			return nil
		case err == nil:
			return notOwner(ctx, c, key, lease.ID)
		case !transient(err) && unsure:
			// Refused, after a put whose reply was lost: that one may
			// have been applied, and the record is then ours.
			return refusedAfter(ctx, c, key, lease.ID, err)
		case !transient(err):
			// Refused (permission denied, say): not applied, nor will it
			// be; the lease would stand for the retention with no key.
			revoke(ctx, c, lease.ID)
			return fmt.Errorf("etcdlock: record %q: %w", key, err)
		case ctx.Err() != nil:
			return fmt.Errorf("etcdlock: record %q: %w", key, err)
		}
		unsure = true
		select {
		case <-ctx.Done():
			return fmt.Errorf("etcdlock: record %q: %w", key, err)
		case <-time.After(retryPause):
		}
	}
}

// refusedAfter is Record's answer when etcd refused a put sent again after
// one whose reply was lost: nil if that one was applied (the key is on our
// lease); else refused, the lease revoked; or, the key not readable,
// refused with the lease left to expire, as the record may stand.
func refusedAfter(ctx context.Context, c *clientv3.Client, key string, lease clientv3.LeaseID, refused error) error {
	resp, err := c.Get(ctx, key)
	switch {
	case err != nil:
		return fmt.Errorf("etcdlock: record %q: %w (an earlier put may stand: %v)", key, refused, err)
	case len(resp.Kvs) == 1 && clientv3.LeaseID(resp.Kvs[0].Lease) == lease:
		return nil
	}
	revoke(ctx, c, lease)
	return fmt.Errorf("etcdlock: record %q: %w", key, refused)
}

// notOwner is Record's answer when a put found the hold ended. An earlier
// put of the call, whose reply was lost, may have been applied while the
// hold lasted: then the record is ours, and stands.
func notOwner(ctx context.Context, c *clientv3.Client, key string, lease clientv3.LeaseID) error {
	resp, err := c.Get(ctx, key)
	if err != nil {
		// Unknown: not ErrNotOwner, as an earlier put may stand.
		return fmt.Errorf("etcdlock: the hold ended before the record %q was known to be put, and it could not be read: %w", key, err)
	}
	if len(resp.Kvs) == 1 && clientv3.LeaseID(resp.Kvs[0].Lease) == lease {
		return nil
	}
	// No put of ours can apply from now on: the guard fails for good.
	revoke(ctx, c, lease)
	return ErrNotOwner
}

// revokeTimeout bounds the revoke of a record's lease that holds no key.
const revokeTimeout = 2 * time.Second

// revoke revokes lease, on a context detached from ctx (which may have
// ended) and bounded: where it fails, the lease expires with the retention.
func revoke(ctx context.Context, c *clientv3.Client, lease clientv3.LeaseID) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), revokeTimeout)
	defer cancel()
	_, _ = c.Revoke(rctx, lease)
}

// transient reports whether err may be a lost reply or a passing failure,
// worth sending the same put again.
func transient(err error) bool {
	if errors.Is(err, rpctypes.ErrPermissionDenied) || errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return false
	}
	code := status.Code(err)
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		code = ee.Code()
	}
	switch code {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Aborted:
		return true
	}
	return false
}
