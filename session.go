package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/etcdlock/etcdlock/internal/queue"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

const (
	// DefaultTTL is the lease TTL of a Session made without WithTTL.
	DefaultTTL = 60 * time.Second

	// setupTimeout bounds NewSession's RPCs when its context has no earlier deadline.
	setupTimeout = 5 * time.Second
	// revokeTimeout bounds the revoke in Close, so Close returns within 5 s
	// even when etcd is unreachable.
	revokeTimeout = 2 * time.Second
)

// A Session is one etcd lease, kept alive in the background, shared by every
// Mutex, RWMutex and Semaphore made with it. When the process dies the lease expires and etcd
// deletes every key attached to it, so a crashed holder never blocks others
// for longer than the TTL.
//
// A Session is safe for use by many goroutines. Close it when done; a Session
// that is not closed keeps its lease alive until its client is closed.
type Session struct {
	client      *clientv3.Client
	cs          *concurrency.Session
	conn        *queue.Conn // the queue's view of the client and the lease
	ttl         time.Duration
	maxHandoffs int    // WithLocalHandoff
	identity    string // WithIdentity: the value of every key we put

	// lastAck is when the last keep-alive acknowledgement arrived (Unix ns).
	lastAck atomic.Int64

	seq     atomic.Int64 // makes the keys of RWMutex and Semaphore holds unique
	records sync.Map     // what this process holds or awaits, a record per lock name (reentrant.go's alone)
	// bgMu guards closing and bg.Go, and nothing else: goBackground is
	// called with a hold's mutex held, which may be taken under a record's.
	bgMu    sync.Mutex
	closing bool           // no new background work once set
	bg      sync.WaitGroup // background goroutines: keep-alive reader, cleanups, hold monitors

	events *dispatch // to the observers (WithObserver, WithLogger); nil: none

	ctx        context.Context // WithContext's; Background without
	stopRevoke func() bool     // stops the WithContext revoke, if any
	revoked    chan struct{}   // closed when the WithContext revoke has finished
	revokeErr  error           // the WithContext revoke's result, once revoked is closed
	closeOnce  sync.Once
	closeErr   error
}

// A SessionOption configures NewSession.
type SessionOption interface {
	apply(*sessionOptions)
}

type sessionOptions struct {
	ttl       time.Duration
	lease     clientv3.LeaseID
	ctx       context.Context
	handoffs  int
	identity  string
	observers []Observer
	err       error
}

type sessionOptionFunc func(*sessionOptions)

func (f sessionOptionFunc) apply(o *sessionOptions) { f(o) }

func (o *sessionOptions) invalid(format string, args ...any) {
	if o.err == nil {
		o.err = fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
	}
}

// WithTTL sets the lease TTL, rounded up to whole seconds. The default is
// DefaultTTL (60 s). etcd may raise a TTL below its minimum (1.5 × the
// election timeout). A ttl <= 0 makes NewSession return ErrInvalidArgument.
//
// The TTL bounds how long the lock stays taken after this process dies or is
// cut off, and how long a holder keeps believing it holds a lock it has lost.
func WithTTL(ttl time.Duration) SessionOption {
	return sessionOptionFunc(func(o *sessionOptions) {
		if ttl <= 0 {
			o.invalid("TTL must be positive, got %v", ttl)
			return
		}
		o.ttl = ttl
	})
}

// WithLease makes the Session adopt an existing lease instead of granting a
// new one, for example to take back, after a restart, a lock whose key is
// still attached to that lease. NewSession fails with ErrSessionExpired if
// the lease no longer exists. Two live Sessions on one lease are one holder
// to etcd: do not share a lease between processes.
func WithLease(id clientv3.LeaseID) SessionOption {
	return sessionOptionFunc(func(o *sessionOptions) {
		if id <= 0 {
			o.invalid("lease ID must be positive, got %d", id)
			return
		}
		o.lease = id
	})
}

// WithContext ties the Session to ctx: NewSession's RPCs use it, and
// cancelling it ends the Session as Close does, revoking the lease (on a
// detached, bounded context) so that its locks are released at once. The
// default is a Session that lives until Close or until its lease is lost.
func WithContext(ctx context.Context) SessionOption {
	return sessionOptionFunc(func(o *sessionOptions) {
		if ctx == nil {
			o.invalid("nil context")
			return
		}
		o.ctx = ctx
	})
}

// WithLocalHandoff lets a lock pass straight from one goroutine of this
// process to the next one waiting for it, without going through etcd, at
// most n times in a row. The default, 0, is no hand-off: every last unlock
// deletes the key and every first lock puts one. n < 0 makes NewSession
// return ErrInvalidArgument.
//
// A hand-off keeps the etcd key, and so the fencing token: Token and IsOwner
// describe the process's hold, which goes on, and a resource fenced on
// tokens cannot tell the goroutines apart (this process still runs them one
// at a time). After n hand-offs in a row the next last unlock releases the
// key, so waiters in other processes are not starved: they get the lock
// after at most n+1 local holds.
func WithLocalHandoff(n int) SessionOption {
	return sessionOptionFunc(func(o *sessionOptions) {
		if n < 0 {
			o.invalid("hand-off count must not be negative, got %d", n)
			return
		}
		o.handoffs = n
	})
}

// WithIdentity sets the value of every key the Session puts in etcd: who
// holds or waits, for Inspect, etcdlock holders and anyone reading the keys
// with etcdctl. The default is "", as concurrency.Mutex and etcdctl lock
// write. Use something that names the process (host, pid, job); it is
// stored in clear, so put no secret in it.
func WithIdentity(id string) SessionOption {
	return sessionOptionFunc(func(o *sessionOptions) { o.identity = id })
}

// NewSession grants a lease on client (or adopts one, WithLease) and keeps
// it alive in the background. It returns an error, and leaves no lease
// behind, if client is nil, an option is invalid, or etcd does not answer
// within 5 s (or the WithContext context's deadline, if earlier).
func NewSession(client *clientv3.Client, opts ...SessionOption) (*Session, error) {
	return newSession(context.Background(), client, opts...)
}

// newSession is NewSession whose setup RPCs also end when setup ends,
// without tying the Session's life to it.
func newSession(setup context.Context, client *clientv3.Client, opts ...SessionOption) (*Session, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil client", ErrInvalidArgument)
	}
	o := options(opts)
	if o.err != nil {
		return nil, o.err
	}
	if o.ctx == nil {
		o.ctx = context.Background()
	}
	if err := o.ctx.Err(); err != nil {
		return nil, err
	}

	ctx, cancel := context.WithTimeout(o.ctx, setupTimeout)
	defer cancel()
	defer context.AfterFunc(setup, cancel)()
	id, ttl, granted, err := lease(ctx, client, o)
	if err != nil {
		return nil, err
	}
	s, err := keepAlive(client, id, ttl, o)
	if err != nil {
		if granted {
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(o.ctx), revokeTimeout)
			defer rcancel()
			_, _ = client.Revoke(rctx, id)
		}
		return nil, fmt.Errorf("etcdlock: keep lease alive: %w", err)
	}
	return s, nil
}

// options applies opts to the defaults. The context is nil unless
// WithContext set one.
func options(opts []SessionOption) sessionOptions {
	o := sessionOptions{ttl: DefaultTTL}
	for _, opt := range opts {
		if opt == nil {
			o.invalid("nil SessionOption")
			continue
		}
		opt.apply(&o)
	}
	return o
}

// keepAlive starts keeping the lease id alive and returns the Session that
// owns it.
func keepAlive(client *clientv3.Client, id clientv3.LeaseID, ttl int64, o sessionOptions) (*Session, error) {
	cs, err := concurrency.NewSession(client,
		concurrency.WithLease(id), concurrency.WithTTL(int(ttl)), concurrency.WithContext(o.ctx))
	if err != nil {
		return nil, err
	}
	// A second keep-alive channel on the same lease: it costs no extra RPC
	// and tells us when each acknowledgement arrives, which
	// concurrency.Session keeps to itself.
	acks, err := client.KeepAlive(cs.Ctx(), id)
	if err == nil {
		err = o.ctx.Err()
	}
	if err != nil {
		cs.Orphan()
		return nil, err
	}
	s := &Session{
		client:      client,
		cs:          cs,
		ttl:         time.Duration(ttl) * time.Second,
		maxHandoffs: o.handoffs,
		ctx:         o.ctx,
		identity:    o.identity,
		events:      newDispatch(o.observers, id),
		revoked:     make(chan struct{}),
	}
	s.conn = &queue.Conn{KV: client, Watcher: client, Lease: sessionLease{s}, TTL: s.ttl}
	s.lastAck.Store(time.Now().UnixNano())
	// Keys from an earlier process with the same lease (WithLease) were
	// numbered from an earlier time: no key of ours can be one of theirs.
	s.seq.Store(time.Now().UnixNano())
	s.bg.Go(func() {
		for range acks {
			s.lastAck.Store(time.Now().UnixNano())
		}
	})
	if s.events != nil {
		s.bg.Go(s.probeKeepAlive)
	}
	if o.ctx.Done() != nil {
		// The function may run before AfterFunc returns (o.ctx may end at
		// any time), so it must not read stopRevoke, which is Close's.
		s.stopRevoke = context.AfterFunc(o.ctx, func() {
			s.cs.Orphan()
			s.revokeErr = s.revoke(context.WithoutCancel(o.ctx))
			close(s.revoked)
			// Then as Close: wait for the background work, and deliver the
			// events left to the observers. Close takes this revoke's result.
			s.end(func() error { return s.revokeErr })
		})
	}
	return s, nil
}

// lease grants a new lease, or checks that the adopted one exists, and
// returns its ID and TTL in seconds.
func lease(ctx context.Context, client *clientv3.Client, o sessionOptions) (id clientv3.LeaseID, ttl int64, granted bool, err error) {
	if o.lease == clientv3.NoLease {
		secs := int64((o.ttl + time.Second - 1) / time.Second)
		resp, err := client.Grant(ctx, secs)
		if err != nil {
			return 0, 0, false, fmt.Errorf("etcdlock: grant lease: %w", err)
		}
		return resp.ID, resp.TTL, true, nil
	}
	resp, err := client.TimeToLive(ctx, o.lease)
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound) || err == nil && resp.TTL <= 0:
		return 0, 0, false, fmt.Errorf("%w: lease %x not found", ErrSessionExpired, o.lease)
	case err != nil:
		return 0, 0, false, fmt.Errorf("etcdlock: look up lease %x: %w", o.lease, err)
	}
	return o.lease, resp.GrantedTTL, false, nil
}

// Close ends the Session: it stops the keep-alive, revokes the lease (which
// deletes the keys of every lock held or awaited with this Session) and
// waits for the Session's background work to stop. It returns within 5 s
// even when etcd is unreachable, plus the time its observers take over the
// events still queued (Close delivers them, then SessionClosed); the lease
// then expires on its own within the TTL. Close returns nil if the lease
// was already gone. It is safe to call more than once, from any goroutine;
// later calls return the first call's result. When the WithContext context
// was cancelled first, that cancel has already revoked the lease, and Close
// returns its result without asking etcd again.
//
// An Observer may call Close from inside Observe (to shut the Session down
// on a lost hold, say), also while another Close is under way. That call
// returns within 5 s too: it does not wait for the delivery of the events
// still queued, which goes on once Observe returns and ends with
// SessionClosed.
//
// After Close, every lock call on the Session returns ErrSessionExpired.
func (s *Session) Close() error {
	s.end(func() error {
		if s.stopRevoke != nil && !s.stopRevoke() {
			// The WithContext revoke has started: one revoke is enough.
			<-s.revoked
			return s.revokeErr
		}
		return s.revoke(context.Background())
	})
	return s.closeErr
}

// end ends the Session once, with revoke as the revoke of its lease, and
// waits for its background work; then it waits for the delivery of the
// events left to the observers, unless an Observer called it.
func (s *Session) end(revoke func() error) {
	s.closeOnce.Do(func() {
		s.bgMu.Lock()
		s.closing = true
		s.bgMu.Unlock()
		s.cs.Orphan()
		s.closeErr = revoke()
		s.bg.Wait()
	})
	s.events.close()
}

func (s *Session) revoke(ctx context.Context) error {
	if err := s.client.Ctx().Err(); err != nil {
		// A closed client sends nothing: the lease expires on its own.
		return fmt.Errorf("etcdlock: revoke lease %x: client closed: %w", s.cs.Lease(), err)
	}
	ctx, cancel := context.WithTimeout(ctx, revokeTimeout)
	defer cancel()
	_, err := s.client.Revoke(ctx, s.cs.Lease())
	if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("etcdlock: revoke lease %x: %w", s.cs.Lease(), err)
	}
	return nil
}

// Done returns a channel that is closed when the Session ends: its lease was
// revoked or expired, keep-alives stopped being acknowledged for a whole TTL,
// Close was called, or the WithContext context was cancelled. A revoke by
// anyone is seen within about TTL/3 + 1 s, at the next keep-alive.
//
// Done is no early warning: when it closes because etcd went quiet, the
// server may already have expired the lease. Mutex.Done warns earlier.
func (s *Session) Done() <-chan struct{} { return s.cs.Done() }

// Lease returns the ID of the Session's lease. Every lock key taken with the
// Session is attached to it.
func (s *Session) Lease() clientv3.LeaseID { return s.cs.Lease() }

// Client returns the client the Session was made with.
func (s *Session) Client() *clientv3.Client { return s.client }

// TTL returns the lease TTL that etcd granted, in whole seconds.
func (s *Session) TTL() time.Duration { return s.ttl }

// expired reports whether the Session has ended. The Session's context is
// cancelled as Done closes, on either side of it.
func (s *Session) expired() bool {
	select {
	case <-s.cs.Done():
		return true
	default:
		return s.cs.Ctx().Err() != nil
	}
}

// closedByUser reports whether the Session was ended by Close or by its
// WithContext context, rather than by etcd.
func (s *Session) closedByUser() bool {
	s.bgMu.Lock()
	defer s.bgMu.Unlock()
	return s.closing || s.ctx.Err() != nil
}

// opContext returns ctx, also cancelled when the Session ends and, for
// wait > 0, after wait.
func (s *Session) opContext(ctx context.Context, wait time.Duration) (context.Context, context.CancelFunc) {
	var cancel context.CancelFunc
	if wait > 0 {
		ctx, cancel = context.WithTimeout(ctx, wait)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	stop := context.AfterFunc(s.cs.Ctx(), cancel)
	return ctx, func() { stop(); cancel() }
}

// leaseGone ends the Session once etcd has said that its lease no longer
// exists: Done closes, and every lock call returns ErrSessionExpired, without
// waiting for the next keep-alive to find out.
func (s *Session) leaseGone() { s.cs.Orphan() }

// untilSilent returns how long until keep-alives have gone unacknowledged
// for two thirds of the TTL: the point where the lease may expire soon.
func (s *Session) untilSilent() time.Duration {
	last := time.Unix(0, s.lastAck.Load())
	return time.Until(last.Add(s.ttl - s.ttl/3))
}

// probeKeepAlive measures the keep-alive for the observers: every TTL/3 it
// renews the lease once more itself, and reports the round trip and the
// margin the lease had left, counted from the last acknowledgement on the
// Session's keep-alive stream. It does not move that clock: Done and the
// end of the Session both count from the stream's acknowledgements, so an
// observed Session warns as early as one that is not.
func (s *Session) probeKeepAlive() {
	ctx := s.cs.Ctx()
	interval := s.ttl / 3
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		last := time.Unix(0, s.lastAck.Load())
		start := time.Now()
		rctx, cancel := context.WithTimeout(ctx, interval)
		_, err := s.client.KeepAliveOnce(rctx, s.Lease())
		cancel()
		if ctx.Err() != nil {
			return
		}
		now := time.Now()
		e := Event{Kind: KeptAlive, Time: now, RTT: now.Sub(start), Margin: last.Add(s.ttl).Sub(now), TTL: s.ttl, Err: err}
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			s.leaseGone()
		}
		s.events.emit(e)
	}
}

// uniqueKey returns a new key under pfx for one hold of this Session:
// <lease ID in hex>-<number>.
func (s *Session) uniqueKey(pfx string) string {
	return fmt.Sprintf("%s%x-%x", pfx, s.Lease(), s.seq.Add(1))
}

// goBackground runs f in a goroutine that Close waits for, unless the
// Session is closing, where it reports false and runs nothing: the revoke
// that Close makes does f's cleaning anyway. f must return soon after the
// Session's context, s.cs.Ctx(), is done.
func (s *Session) goBackground(f func()) bool {
	s.bgMu.Lock()
	defer s.bgMu.Unlock()
	if s.closing {
		return false
	}
	s.bg.Go(f)
	return true
}

// sessionLease is the Session's lease as the queue needs it.
type sessionLease struct{ s *Session }

func (l sessionLease) ID() clientv3.LeaseID { return l.s.Lease() }
func (l sessionLease) Expired() bool        { return l.s.expired() }
func (l sessionLease) Gone()                { l.s.leaseGone() }
