package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/etcdlock/etcdlock/internal/queue"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// revokeTimeout bounds a revoke, so that Close returns within 5 s even when
// etcd is unreachable.
const revokeTimeout = 2 * time.Second

// A leaseTerm is one lease of a Session, from its grant (or adoption) to its
// loss or revoke: the lease, its keep-alive, and when the last keep-alive
// acknowledgement came. Every key is put with the lease of one term, and
// every hold, ticket and loss signal belongs to the term of its key. A
// Session has one term, or, WithRenewal, one after another.
type leaseTerm struct {
	client *clientv3.Client
	id     clientv3.LeaseID
	ttl    time.Duration
	cs     *concurrency.Session
	conn   *queue.Conn // the queue's view of the client and this lease

	// lastAck is when the last keep-alive acknowledgement arrived (Unix ns).
	lastAck atomic.Int64
	// next is closed once the Session has a term after this one, or has
	// ended (WithRenewal only).
	next chan struct{}
}

// grant grants a new lease, or checks that the adopted one exists, and
// returns its ID and TTL in seconds.
func grant(ctx context.Context, client *clientv3.Client, ttl time.Duration, adopt clientv3.LeaseID) (id clientv3.LeaseID, secs int64, granted bool, err error) {
	if adopt == clientv3.NoLease {
		resp, err := client.Grant(ctx, int64((ttl+time.Second-1)/time.Second))
		if err != nil {
			return 0, 0, false, fmt.Errorf("etcdlock: grant lease: %w", err)
		}
		return resp.ID, resp.TTL, true, nil
	}
	resp, err := client.TimeToLive(ctx, adopt)
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound) || err == nil && resp.TTL <= 0:
		return 0, 0, false, fmt.Errorf("%w: lease %x not found", ErrSessionExpired, adopt)
	case err != nil:
		return 0, 0, false, fmt.Errorf("etcdlock: look up lease %x: %w", adopt, err)
	}
	return adopt, resp.GrantedTTL, false, nil
}

// newTerm starts keeping the lease id alive until ctx (the Session's
// WithContext context) ends or the term is ended. It returns the channel of
// the keep-alive's acknowledgements, which the Session reads (acked) once
// the term is its own.
func newTerm(client *clientv3.Client, ctx context.Context, id clientv3.LeaseID, secs int64) (*leaseTerm, <-chan *clientv3.LeaseKeepAliveResponse, error) {
	cs, err := concurrency.NewSession(client,
		concurrency.WithLease(id), concurrency.WithTTL(int(secs)), concurrency.WithContext(ctx))
	if err != nil {
		return nil, nil, err
	}
	// A second keep-alive channel on the same lease: it costs no extra RPC
	// and tells us when each acknowledgement arrives, which
	// concurrency.Session keeps to itself.
	acks, err := client.KeepAlive(cs.Ctx(), id)
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		cs.Orphan()
		return nil, nil, err
	}
	tm := &leaseTerm{client: client, id: id, ttl: time.Duration(secs) * time.Second, cs: cs, next: make(chan struct{})}
	tm.conn = &queue.Conn{KV: client, Watcher: client, Lease: tm, TTL: tm.ttl, Fence: fenceKey(id)}
	tm.lastAck.Store(time.Now().UnixNano())
	return tm, acks, nil
}

// fencePrefix begins the key of each lease's fence (queue.Conn.Fence). It
// has no "/": no lock's prefix holds it, so no lock, ours, etcd's
// concurrency.Mutex or etcdctl lock, counts it as a holder.
const fencePrefix = "etcdlock.fence."

// fenceKey returns the fence key of the lease id: one key, put with the
// lease only after a put's reply was lost, and gone with it.
func fenceKey(id clientv3.LeaseID) string { return fmt.Sprintf("%s%x", fencePrefix, id) }

// acked records a keep-alive acknowledgement, now.
func (tm *leaseTerm) acked() { tm.lastAck.Store(time.Now().UnixNano()) }

// ID returns the term's lease.
func (tm *leaseTerm) ID() clientv3.LeaseID { return tm.id }

// Expired reports whether the term has ended: its lease was revoked or
// expired, keep-alives went unacknowledged for a whole TTL, or the Session
// ended. The term's context is cancelled as Done closes, on either side of it.
func (tm *leaseTerm) Expired() bool {
	select {
	case <-tm.cs.Done():
		return true
	default:
		return tm.cs.Ctx().Err() != nil
	}
}

// Gone ends the term once etcd has said that its lease no longer exists,
// without waiting for the next keep-alive to find out.
func (tm *leaseTerm) Gone() { tm.cs.Orphan() }

// ctx returns a context cancelled when the term ends.
func (tm *leaseTerm) ctx() context.Context { return tm.cs.Ctx() }

// untilSilent returns how long until keep-alives have gone unacknowledged
// for two thirds of the TTL: the point where the lease may expire soon.
func (tm *leaseTerm) untilSilent() time.Duration {
	last := time.Unix(0, tm.lastAck.Load())
	return time.Until(last.Add(tm.ttl - tm.ttl/3))
}

// revoke revokes the term's lease, which deletes its keys, on ctx bounded
// by revokeTimeout. A lease already gone is no error.
func (tm *leaseTerm) revoke(ctx context.Context) error {
	client := tm.client
	if err := client.Ctx().Err(); err != nil {
		// A closed client sends nothing: the lease expires on its own.
		return fmt.Errorf("etcdlock: revoke lease %x: client closed: %w", tm.id, err)
	}
	ctx, cancel := context.WithTimeout(ctx, revokeTimeout)
	defer cancel()
	_, err := client.Revoke(ctx, tm.id)
	if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("etcdlock: revoke lease %x: %w", tm.id, err)
	}
	return nil
}
