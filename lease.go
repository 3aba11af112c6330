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
)

// revokeTimeout bounds a revoke, so that Close returns within 5 s even when
// etcd is unreachable.
const revokeTimeout = 2 * time.Second

// A leaseTerm is one lease of a Session, from its grant (or adoption) to its
// loss or revoke: the lease, and the clock of its keep-alive. Every key is put
// with the lease of one term, and every hold, ticket and loss signal belongs
// to the term of its key. A Session has one term, or, WithRenewal, one after
// another.
type leaseTerm struct {
	client *clientv3.Client
	id     clientv3.LeaseID
	ttl    time.Duration
	conn   *queue.Conn // the queue's view of the client and this lease

	// renewed is a moment no later than etcd's last renewal of the lease
	// (Unix ns): when the grant, or the last keep-alive that etcd
	// acknowledged, was sent. etcd renews a lease when the request reaches
	// it, which may be well before its reply comes back: the lease lives at
	// least until renewed + ttl, and counting from the reply would believe
	// in more lease than there is.
	renewed atomic.Int64

	life context.Context    // ends with the term
	end  context.CancelFunc // ends the term
	// next is closed once the Session has a term after this one, or has
	// ended (WithRenewal only).
	next chan struct{}

	loss lossWatch // watches the holds of the term whose loss signal was asked for
}

// grant grants a new lease, or checks that the adopted one exists, and
// returns its ID, its TTL in seconds, and a moment no later than etcd's last
// renewal of it.
func grant(ctx context.Context, client *clientv3.Client, ttl time.Duration, adopt clientv3.LeaseID) (id clientv3.LeaseID, secs int64, renewed time.Time, err error) {
	sent := time.Now()
	if adopt == clientv3.NoLease {
		resp, err := client.Grant(ctx, int64((ttl+time.Second-1)/time.Second))
		if err != nil {
			return 0, 0, time.Time{}, fmt.Errorf("etcdlock: grant lease: %w", err)
		}
		return resp.ID, resp.TTL, sent, nil
	}
	resp, err := client.TimeToLive(ctx, adopt)
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound) || err == nil && resp.TTL <= 0:
		return 0, 0, time.Time{}, fmt.Errorf("%w: lease %x not found", ErrSessionExpired, adopt)
	case err != nil:
		return 0, 0, time.Time{}, fmt.Errorf("etcdlock: look up lease %x: %w", adopt, err)
	}
	// The lease had resp.TTL seconds left (rounded down) when the request
	// was sent, at the least.
	return adopt, resp.GrantedTTL, sent.Add(time.Duration(resp.TTL-resp.GrantedTTL) * time.Second), nil
}

// newTerm returns the term of the lease id, whose TTL is secs and which etcd
// renewed no earlier than renewed. The term ends when ctx (the Session's
// WithContext context) ends, or when it is ended; its keep-alive
// (Session.keepAlive) is the Session's to run.
func newTerm(client *clientv3.Client, ctx context.Context, id clientv3.LeaseID, secs int64, renewed time.Time) *leaseTerm {
	tm := &leaseTerm{client: client, id: id, ttl: time.Duration(secs) * time.Second, next: make(chan struct{})}
	tm.life, tm.end = context.WithCancel(ctx)
	tm.conn = &queue.Conn{KV: client, Watcher: client, Lease: tm, TTL: tm.ttl, FenceKey: fenceKey(id)}
	tm.renewed.Store(renewed.UnixNano())
	return tm
}

// fencePrefix begins the key of each lease's fence (queue.Conn.FenceKey). It
// has no "/": no lock's prefix holds it, so no lock, ours, etcd's
// concurrency.Mutex or etcdctl lock, counts it as a holder.
const fencePrefix = "etcdlock.fence."

// fenceKey returns the fence key of the lease id: one key, put with the
// lease only after a put's reply was lost, and gone with it.
func fenceKey(id clientv3.LeaseID) string { return fmt.Sprintf("%s%x", fencePrefix, id) }

// renewedAt moves the clock to sent, the sending of a keep-alive that etcd
// acknowledged, unless a later one moved it already.
func (tm *leaseTerm) renewedAt(sent time.Time) {
	n := sent.UnixNano()
	for old := tm.renewed.Load(); n > old && !tm.renewed.CompareAndSwap(old, n); old = tm.renewed.Load() {
		// Another keep-alive moved it meanwhile: look again.
	}
}

// ID returns the term's lease.
func (tm *leaseTerm) ID() clientv3.LeaseID { return tm.id }

// Expired reports whether the term has ended: its lease was revoked or
// expired, no keep-alive was acknowledged for a whole TTL, the client was
// closed, or the Session ended.
func (tm *leaseTerm) Expired() bool { return tm.life.Err() != nil }

// Gone ends the term once etcd has said that its lease no longer exists,
// without waiting for the next keep-alive to find out.
func (tm *leaseTerm) Gone() { tm.end() }

// ctx returns a context cancelled when the term ends.
func (tm *leaseTerm) ctx() context.Context { return tm.life }

// keepAliveEvery is the period of the term's keep-alives: a fourth of the
// TTL, so that a keep-alive whose reply takes up to five twelfths of the
// TTL still comes back before the early warning (two thirds of the TTL
// after the last renewal sent).
func (tm *leaseTerm) keepAliveEvery() time.Duration { return tm.ttl / 4 }

// untilSilent returns how long until two thirds of the TTL have passed
// since etcd's last renewal of the lease that we know of: the point where
// the lease may expire soon.
func (tm *leaseTerm) untilSilent() time.Duration {
	last := time.Unix(0, tm.renewed.Load())
	return time.Until(last.Add(tm.ttl - tm.ttl/3))
}

// untilDead returns how long until a whole TTL has passed since etcd's last
// renewal of the lease that we know of: from then on the lease may be gone.
func (tm *leaseTerm) untilDead() time.Duration {
	return time.Until(time.Unix(0, tm.renewed.Load()).Add(tm.ttl))
}

// keepAlive renews the lease once, waiting at most two thirds of the TTL
// for etcd's reply (a later one would credit a renewal older than the
// early warning): on success it moves the clock to when the request was
// sent; "lease not found" ends the term. It returns the round trip, and the
// margin the lease had left, by the clock before the reply, when the reply
// came or the wait ended.
func (tm *leaseTerm) keepAlive(ctx context.Context) (rtt, margin time.Duration, err error) {
	before := time.Unix(0, tm.renewed.Load())
	sent := time.Now()
	rctx, cancel := context.WithTimeout(ctx, tm.ttl-tm.ttl/3)
	_, err = tm.client.KeepAliveOnce(rctx, tm.id)
	cancel()
	now := time.Now()
	switch {
	case err == nil:
		tm.renewedAt(sent)
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		tm.Gone()
	}
	return now.Sub(sent), before.Add(tm.ttl).Sub(now), err
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

// lossTTL and lossClient give the loss watch (losswatch.go) the term's TTL
// and client.
func (tm *leaseTerm) lossTTL() time.Duration       { return tm.ttl }
func (tm *leaseTerm) lossClient() *clientv3.Client { return tm.client }

// leaseGone asks etcd, within lossReadTimeout, whether the term's lease is
// gone (revoked or expired).
func (tm *leaseTerm) leaseGone() bool {
	ctx, cancel := context.WithTimeout(tm.ctx(), lossReadTimeout)
	defer cancel()
	resp, err := tm.client.TimeToLive(ctx, tm.id)
	return (err == nil && resp.TTL == -1) || errors.Is(err, rpctypes.ErrLeaseNotFound)
}
