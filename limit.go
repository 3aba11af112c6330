package etcdlock

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/etcdlock/etcdlock/internal/queue"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A limit that changes: a Semaphore's limit in force is its name's limit
// record, once one is written, whatever limit its holders were made with
// (internal/queue/limit.go).

// maxLimitKeys is the most keys (holders, and the first waiter) a SetLimit
// guards in its Txn: etcd's default --max-txn-ops is 128.
const maxLimitKeys = 120

// SetLimit records limit for every Semaphore called name, whatever its own,
// from the revision written: a raise admits at once; above a lowered limit
// holders keep their permits and acquisitions wait. A lowering waits, within
// ctx, for a moment the holders do not change (docs/design.md §4). The record
// has no lease; deleting it restores the holders' own limit. A holder of a
// version before v1.1, or whose role may not read the record, counts with
// its own limit. Bad input, or a lowering over more than 120 keys:
// ErrInvalidName or ErrInvalidArgument, wrapped; no record and mixed keys:
// ErrLimitMismatch, wrapped; a refusal: permission denied, wrapped with the
// grants it needs; else etcd's or ctx's error, wrapped, the record written
// or not (ReadLimit tells).
func SetLimit(ctx context.Context, client *clientv3.Client, name string, limit int) error {
	if err := validateClient(ctx, client, name); err != nil {
		return err
	}
	if limit < 1 {
		return errorf("set limit", name, fmt.Errorf("%w: a Semaphore's limit must be at least 1, got %d", ErrInvalidArgument, limit))
	}
	for tries := 1; ; tries++ {
		done, err := trySetLimit(ctx, client, name, limit)
		switch {
		case err != nil:
			return errorf("set limit", name, err)
		case done:
			return nil
		}
		// The queue changed between the read and the write: read again,
		// after a pause of a few milliseconds at random, so that two
		// calls do not keep colliding, but short, as a queue that
		// churns is quiet mostly for a moment.
		select {
		case <-time.After(time.Duration(rand.Int64N(int64(min(tries, 10)) * int64(time.Millisecond)))):
		case <-ctx.Done():
			return errorf("set limit", name, ctx.Err())
		}
	}
}

// trySetLimit reads the queue of name and writes its limit record, keeping
// its holders, unless what the write depends on changed since the read:
// false then. The same Txn touches the first waiters' keys (queue.Touch), so
// that the waiters near the head, which count their turn from the queue's
// events, read the new record before any later event.
//
// A raise (a limit at least the one in force) depends only on the record:
// with the same keep, a larger limit takes no hold away (a key holds when
// the permits up to it fit, each counted at most the limit, and a weight
// above the old limit can hold only alone), so a key admitted between the
// read and the write holds after it too. A lowering depends on the holders
// read: the record keeps them, so no key may have been admitted since,
// which the Txn guards by no key put under the prefix since the read and
// each holder's and the first waiter's key still there.
//
// With no record (or a malformed one), the limit in force is the one the
// keys were made with, and a raise depends on that too: the Txn guards it
// by the oldest key read still being there. While it is, every key queued
// after it was made with its limit (a Semaphore made with another refuses
// an older key of this one while no record says the limit, and holds
// nothing), so the keys that hold at the write's revision are those of
// the limit read, and the raise keeps them. Once it has left, the queue
// may hold keys of any limit, and the write waits for a new read.
func trySetLimit(ctx context.Context, client *clientv3.Client, name string, limit int) (bool, error) {
	pfx, key := name+"/", queue.LimitKey(name)
	kvs, rec, rev, err := readKeys(ctx, client, name, true)
	if err != nil {
		return false, err
	}
	members := permitsOf(pfx, kvs)
	var recRev int64
	current, recorded := queue.Limit{}, false
	if rec != nil {
		// A malformed record is replaced, as if there were none.
		recRev = rec.ModRevision
		if current, recorded = queue.ParseLimit(rec.Value); !recorded {
			rec = nil
		}
	}
	if !recorded {
		if current.N, err = oneLimit(name, members); err != nil {
			return false, err
		}
	}
	holds := queue.Holders(members, rec)
	keep := min(current.Keep, recRev)
	for i, h := range holds {
		if !h {
			break
		}
		keep = max(keep, members[i].CreateRevision)
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", recRev)}
	if current.N == 0 || limit < current.N {
		// A lowering, or a limit not known (no record, no permit).
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(pfx), "<", rev+1).WithPrefix())
		for i, h := range holds {
			cmps = append(cmps, ownerCmp(string(members[i].Key), members[i].CreateRevision))
			if !h {
				break
			}
		}
		if len(cmps) > maxLimitKeys+2 {
			return false, fmt.Errorf("%w: cannot lower the limit of %q while %d keys hold or wait first: more than one Txn can guard; lower it when fewer hold", ErrInvalidArgument, name, len(cmps)-2)
		}
	} else if !recorded {
		// A first record's raise: the limit in force is the keys' own
		// only while the oldest key read is queued.
		cmps = append(cmps, ownerCmp(string(members[0].Key), members[0].CreateRevision))
	}
	ops := []clientv3.Op{clientv3.OpPut(key, queue.Limit{N: limit, Keep: keep}.Value())}
	touched := 0
	for i, h := range holds {
		if h {
			continue
		}
		if touched++; touched > queue.NearHead {
			break
		}
		ops = append(ops, queue.Touch(string(members[i].Key), members[i].CreateRevision))
	}
	txn, err := client.Txn(ctx).If(cmps...).Then(ops...).Commit()
	switch {
	case err != nil:
		return false, needs(err, "write on "+key+" and on "+pfx)
	case txn == nil:
		return false, errMalformed
	}
	return txn.Succeeded, nil
}

// oneLimit returns the limit of name's permits, 0 if there is none, or
// ErrLimitMismatch, wrapped, if its keys are not all permits of one limit.
func oneLimit(name string, members []*mvccpb.KeyValue) (int, error) {
	first := 0
	for _, kv := range members {
		limit, _, _, ok := queue.ParseSemaphoreValue(kv.Value)
		switch {
		case !ok:
			return 0, fmt.Errorf("%w: %q has a key that is no permit's: %s", ErrLimitMismatch, name, kv.Key)
		case first == 0:
			first = limit
		case limit != first:
			return 0, fmt.Errorf("%w: holders of %q have limits %d and %d", ErrLimitMismatch, name, first, limit)
		}
	}
	return first, nil
}

// ReadLimit returns, in one read, the limit in force of the semaphore name:
// its record's (SetLimit), else its keys' (ErrLimitMismatch, wrapped, if they
// differ), else 0.
func ReadLimit(ctx context.Context, client *clientv3.Client, name string) (int, error) {
	if err := validateClient(ctx, client, name); err != nil {
		return 0, err
	}
	kvs, rec, _, err := readKeys(ctx, client, name, true)
	if err != nil {
		return 0, errorf("read limit", name, err)
	}
	if rec != nil {
		l, ok := queue.ParseLimit(rec.Value)
		if !ok {
			return 0, errorf("read limit", name, fmt.Errorf("%w: the limit record reads %q", errMalformed, rec.Value))
		}
		return l.N, nil
	}
	limit, err := oneLimit(name, permitsOf(name+"/", kvs))
	if err != nil {
		return 0, errorf("read limit", name, err)
	}
	return limit, nil
}

// permitsOf returns the keys of kvs in the queue with prefix pfx (not a
// nested lock's), oldest first.
func permitsOf(pfx string, kvs []*mvccpb.KeyValue) []*mvccpb.KeyValue {
	var members []*mvccpb.KeyValue
	for _, kv := range kvs {
		if queue.IsMember(pfx, kv.Key) {
			members = append(members, kv)
		}
	}
	slices.SortFunc(members, func(a, b *mvccpb.KeyValue) int { return cmp.Compare(a.CreateRevision, b.CreateRevision) })
	return members
}
