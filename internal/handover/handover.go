// Package handover keeps the two records of a Lead's lock besides its
// queue: the hand-over record, which names the candidate the last leader
// handed over to, and the term count. Where they live, how a new holder
// reads them and starts its term or steps aside, and how a leader hands
// over, each in Txns guarded by the hold; it knows only KV and leases.
package handover

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/etcdlock/etcdlock/internal/queue"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Prefixes of the records' keys. Like the fence keys ("etcdlock.fence.")
// and the slots' records ("etcdlock.done."), a record's key has no "/": no
// lock's prefix ("NAME/") holds it, so no queue, ours, etcd's
// concurrency.Mutex's or etcdctl lock's, counts it as a member.
const (
	RecordPrefix = "etcdlock.handover."
	TermPrefix   = "etcdlock.term."
)

// CountTTL is the TTL of the lease Claim grants the term count. The leader
// keeps the lease alive while its term lasts, every third of its TTL, so
// the count ends between 2/3 of CountTTL and CountTTL after the last term
// of its name ended.
const CountTTL = 15 * time.Minute

// RecordKey returns the key of the hand-over record of the lock name:
// etcdlock.handover.<name>. It lives on the lease of the candidate it
// names, and goes with it.
func RecordKey(name string) string { return RecordPrefix + queue.RecordName(name) }

// TermKey returns the key of the term count of the lock name:
// etcdlock.term.<name>, on a lease of its own (CountTTL). Its Version is
// the count: etcd counts the puts since the key's creation, and the key
// goes with its lease.
func TermKey(name string) string { return TermPrefix + queue.RecordName(name) }

// A Candidate is a key in a lock's queue, as one hold of it: the key and
// its create revision. A Mutex key's name repeats when its lease queues
// again; the revision tells the holds apart.
type Candidate struct {
	Key   string
	Token int64
}

// value is how a record names c: "<token> <key>".
func (c Candidate) value() string { return strconv.FormatInt(c.Token, 10) + " " + c.Key }

// parse reads a record's value; false for one that names no key.
func parse(v []byte) (Candidate, bool) {
	tok, key, ok := strings.Cut(string(v), " ")
	n, err := strconv.ParseInt(tok, 10, 64)
	if !ok || err != nil || n <= 0 || key == "" {
		return Candidate{}, false
	}
	return Candidate{key, n}, true
}

// there is true while c's key exists as that hold.
func (c Candidate) there() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(c.Key), "=", c.Token)
}

// A Verdict is what a new holder of a Lead's lock is to do.
type Verdict int

const (
	// Lead: the term is counted; run f.
	Lead Verdict = iota + 1
	// StepAside: the record names another candidate, still queued: give
	// way (release) without running f.
	StepAside
	// Lost: the holder's key is gone.
	Lost
)

// A Claimed is what Claim found.
type Claimed struct {
	Verdict Verdict
	Term    int64            // Lead: the term's count
	Lease   clientv3.LeaseID // Lead: the count's lease, for the leader to keep alive
	To      Candidate        // StepAside: the candidate the record names
}

// Claim is a new holder's read of the records, and its start of a term,
// for the holder me of the lock name. It returns Lead with the term's
// count and the count's lease, once a Txn guarded by me's key (and by the
// count's Version, so that a put sent again, or applied late, never counts
// twice) has put the count and deleted a record that named me or named a
// key gone; StepAside with the candidate the record names, while that
// candidate's key is there; Lost when me's key is gone. The count is put
// on the lease it has, or, where there is none, on a lease Claim grants
// (CountTTL), revoked again if the Txn did not use it. A term whose put
// was applied without its reply is found by the next Claim with the same
// claim id (the count's value names the hold and the claim: the caller's
// id, the same for each try of one claim, another for each claim, as one
// hold can begin several terms, its key passed between goroutines of a
// process), which returns it, not a new one. A record that names no key
// behind me's (a Mutex queue's holder has none ahead) is deleted, as one
// that names a key gone: a key of another queue under the name can never
// make every holder give way. On an error the records may have been
// written or not; etcd's refusal keeps its identity.
func Claim(ctx context.Context, kv clientv3.KV, leases clientv3.Lease, name string, me Candidate, claim string) (Claimed, error) {
	rec, term := RecordKey(name), TermKey(name)
	mine := me.value() + " " + claim // the count's value: this claim's, not only this hold's
	for {
		resp, err := kv.Txn(ctx).If(me.there()).Then(clientv3.OpGet(rec), clientv3.OpGet(term)).Commit()
		switch {
		case err != nil:
			return Claimed{}, fmt.Errorf("etcdlock: read the records of %q: %w", name, err)
		case resp == nil:
			return Claimed{}, queue.ErrMalformed
		case !resp.Succeeded:
			return Claimed{Verdict: Lost}, nil
		case len(resp.Responses) != 2:
			return Claimed{}, queue.ErrMalformed
		}
		r, c := first(resp.Responses[0]), first(resp.Responses[1])
		if c != nil && string(c.Value) == mine {
			return Claimed{Verdict: Lead, Term: c.Version, Lease: clientv3.LeaseID(c.Lease)}, nil // our put, its reply lost
		}
		var version int64
		var lease clientv3.LeaseID
		if c != nil {
			version, lease = c.Version, clientv3.LeaseID(c.Lease)
		}
		cmps := []clientv3.Cmp{me.there(), clientv3.Compare(clientv3.Version(term), "=", version)}
		var ops []clientv3.Op
		if r == nil {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(rec), "=", 0))
		} else {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(rec), "=", r.ModRevision))
			ops = append(ops, clientv3.OpDelete(rec))
			// A record that names a key ahead of ours names none of this
			// queue (we hold): it is deleted, as one naming a key gone.
			if to, ok := parse(r.Value); ok && to.Token > me.Token {
				aside, err := kv.Txn(ctx).If(me.there(), cmps[2], to.there()).Commit()
				switch {
				case err != nil:
					return Claimed{}, fmt.Errorf("etcdlock: read the candidate %q handed over to: %w", to.Key, err)
				case aside == nil:
					return Claimed{}, queue.ErrMalformed
				case aside.Succeeded:
					return Claimed{Verdict: StepAside, To: to}, nil
				}
				// The candidate is gone (or the record, or our key:
				// the next Txn fails, and the read tells).
				cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(to.Key), "!=", to.Token))
			}
		}
		granted := lease == clientv3.NoLease
		if granted {
			g, err := leases.Grant(ctx, int64(CountTTL/time.Second))
			if err != nil {
				return Claimed{}, fmt.Errorf("etcdlock: grant the lease of the term count of %q: %w", name, err)
			}
			lease = g.ID
		}
		ops = append(ops, clientv3.OpPut(term, mine, clientv3.WithLease(lease)), clientv3.OpGet(term))
		w, err := kv.Txn(ctx).If(cmps...).Then(ops...).Commit()
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			continue // the count's lease ended, and the count with it: read again
		case err != nil:
			// Applied or not: a granted lease may hold the count.
			return Claimed{}, fmt.Errorf("etcdlock: count the term of %q: %w", name, err)
		case w == nil || w.Succeeded && len(w.Responses) != len(ops):
			return Claimed{}, queue.ErrMalformed
		case !w.Succeeded:
			if granted {
				_, _ = leases.Revoke(ctx, lease) // unused; else it ends with its TTL
			}
			continue // something changed since the read: read again
		}
		got := first(w.Responses[len(w.Responses)-1])
		if got == nil {
			return Claimed{}, queue.ErrMalformed
		}
		return Claimed{Verdict: Lead, Term: got.Version, Lease: lease}, nil
	}
}

// first returns the first key of a Txn's range response, or nil.
func first(r *pb.ResponseOp) *mvccpb.KeyValue {
	rr := r.GetResponseRange()
	if rr == nil || len(rr.Kvs) == 0 {
		return nil
	}
	return rr.Kvs[0]
}

// Give hands the lock name over from its holder me to the candidate to,
// queued with lease: in one Txn guarded by me's key and by to's, it puts
// the record naming to, on to's lease, so that the record goes with to's
// lease. It returns true once etcd applied it; false, having written
// nothing, when me's or to's key was gone or to's lease had ended; else
// etcd's error, the record put or not. Sent again, it is the same write.
func Give(ctx context.Context, kv clientv3.KV, name string, me, to Candidate, lease clientv3.LeaseID) (bool, error) {
	resp, err := kv.Txn(ctx).If(me.there(), to.there()).
		Then(clientv3.OpPut(RecordKey(name), to.value(), clientv3.WithLease(lease))).Commit()
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("etcdlock: hand %q over to %q: %w", name, to.Key, err)
	case resp == nil:
		return false, queue.ErrMalformed
	}
	return resp.Succeeded, nil
}
