package etcdlock

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

const (
	// setupTimeout bounds NewSession's RPCs when its context has no earlier deadline.
	setupTimeout = 5 * time.Second
)

// A Session is one etcd lease, kept alive for its locks: etcd deletes their
// keys within the TTL of the process's death. Close it when done.
type Session struct {
	client      *clientv3.Client
	ask         time.Duration // the TTL a renewal asks for: the first lease's, as etcd granted it
	maxHandoffs int           // WithLocalHandoff
	maxHold     time.Duration // WithMaxHold: 0, no cap
	watchdog    time.Duration // WithWatchdog: 0, none
	lockDelay   time.Duration // WithLockDelay: 0, none
	identity    string        // WithIdentity: the value of every key we put
	renews      bool          // WithRenewal: a new lease after each loss

	// term is the lease in use (lease.go): the one lease of the Session, or
	// WithRenewal, the latest; replaced only under bgMu, by renew.
	term atomic.Pointer[leaseTerm]

	seq     atomic.Int64 // makes the keys of RWMutex and Semaphore holds unique
	records sync.Map     // what this process holds or awaits, a record per lock name (reentrant.go's alone)
	// bgMu guards closing, bg.Go and the replacing of term, and nothing
	// else: goBackground is called with a hold's mutex held, which may be
	// taken under a record's.
	bgMu    sync.Mutex
	closing bool           // no new background work, and no new term, once set
	bg      sync.WaitGroup // background goroutines: keep-alive readers, renewal, retries, loss watches

	retries retryQueue // the deletes etcd did not confirm, retried by one goroutine

	events *dispatch // to the observers (WithObserver, WithLogger); nil: none

	// life ends when the Session does: at Close, at the end of the
	// WithContext context, and without WithRenewal when its lease is lost.
	life    context.Context
	endLife context.CancelFunc

	ctx        context.Context // WithContext's; Background without
	stopRevoke func() bool     // stops the WithContext revoke, if any
	revoked    chan struct{}   // closed when the WithContext revoke has finished
	revokeErr  error           // the WithContext revoke's result, once revoked is closed
	closeOnce  sync.Once
	closeErr   error
}

// NewSession grants a lease (or adopts one) and keeps it alive; an error,
// leaving no lease, if etcd does not answer within 5 s (or ctx's deadline).
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
	id, secs, renewed, err := grant(ctx, client, o.ttl, o.lease)
	if err != nil {
		return nil, err
	}
	s := &Session{
		client:      client,
		maxHandoffs: o.handoffs,
		maxHold:     o.maxHold,
		watchdog:    o.watchdog,
		lockDelay:   o.lockDelay,
		identity:    o.identity,
		renews:      o.renew,
		ctx:         o.ctx,
		revoked:     make(chan struct{}),
	}
	tm := newTerm(client, o.ctx, id, secs, renewed)
	s.ask = tm.ttl
	s.events = newDispatch(o.observers, id)
	s.life, s.endLife = context.WithCancel(context.Background())
	s.term.Store(tm)
	// Keys from an earlier process with the same lease (WithLease) were
	// numbered from an earlier time: no key of ours can be one of theirs.
	s.seq.Store(time.Now().UnixNano())
	s.startTerm(tm)
	if o.renew {
		s.bg.Go(s.renew)
	} else {
		context.AfterFunc(tm.ctx(), s.endLife)
	}
	if o.ctx.Done() != nil {
		// The function may run before AfterFunc returns (o.ctx may end at
		// any time), so it must not read stopRevoke, which is Close's.
		s.stopRevoke = context.AfterFunc(o.ctx, func() {
			s.revokeErr = s.stop().revoke(context.WithoutCancel(o.ctx))
			close(s.revoked)
			// Then as Close: wait for the background work, and deliver the
			// events left to the observers. Close takes this revoke's result.
			s.end(func(*leaseTerm) error { return s.revokeErr })
		})
	}
	return s, nil
}

// Close revokes the lease, deleting its locks' keys, within 5 s even if etcd
// is unreachable (then the lease expires), plus the observers' time on queued
// events. It, and later calls, return the revoke's error (nil if none).
func (s *Session) Close() error {
	s.end(func(tm *leaseTerm) error {
		if s.stopRevoke != nil && !s.stopRevoke() {
			// The WithContext revoke has started: one revoke is enough.
			<-s.revoked
			return s.revokeErr
		}
		return tm.revoke(context.Background())
	})
	return s.closeErr
}

// end ends the Session once, with revoke as the revoke of the lease in
// use, and waits for its background work; then it waits for the delivery
// of the events left to the observers, unless an Observer called it.
func (s *Session) end(revoke func(*leaseTerm) error) {
	s.closeOnce.Do(func() {
		s.closeErr = revoke(s.stop())
		s.bg.Wait()
	})
	s.events.close()
}

// stop marks the Session as ending: no new background work and no new
// lease from now on. It ends the Session's life and the lease in use, and
// returns that lease's term, for its revoke.
func (s *Session) stop() *leaseTerm {
	s.bgMu.Lock()
	s.closing = true
	tm := s.term.Load()
	s.bgMu.Unlock()
	s.endLife()
	tm.end()
	return tm
}

// Done returns a channel closed when the Session ends: Close, WithContext's
// end, its client closed; without WithRenewal, its lease revoked (seen within
// TTL/4 + a round trip), expired or silent a TTL (holds' Done: sooner).
func (s *Session) Done() <-chan struct{} {
	if s.renews {
		return s.life.Done()
	}
	return s.term.Load().ctx().Done()
}

// Lease returns new keys' lease (WithRenewal: the lost one till the next).
func (s *Session) Lease() clientv3.LeaseID { return s.term.Load().id }

// Client returns the client the Session was made with.
func (s *Session) Client() *clientv3.Client { return s.client }

// TTL returns the TTL that etcd granted the lease in use.
func (s *Session) TTL() time.Duration { return s.term.Load().ttl }

// ended reports whether the Session has ended: no lock can be taken with
// it any more.
func (s *Session) ended() bool {
	if s.renews {
		return s.life.Err() != nil
	}
	return s.term.Load().Expired()
}

// closedByUser reports whether the Session was ended by Close or by its
// WithContext context, rather than by etcd.
func (s *Session) closedByUser() bool {
	s.bgMu.Lock()
	defer s.bgMu.Unlock()
	return s.closing || s.ctx.Err() != nil
}

// opContext returns ctx, also cancelled when the term tm ends.
func opContext(ctx context.Context, tm *leaseTerm) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(tm.ctx(), cancel)
	return ctx, func() { stop(); cancel() }
}

// goBackground runs f in a goroutine that Close waits for, unless the
// Session is closing, where it reports false and runs nothing: the revoke
// that Close makes does f's cleaning anyway. f must return soon after the
// context of the term it works for (leaseTerm.ctx) is done.
func (s *Session) goBackground(f func()) bool {
	s.bgMu.Lock()
	defer s.bgMu.Unlock()
	if s.closing {
		return false
	}
	s.bg.Go(f)
	return true
}

// startTerm runs the keep-alive of the term tm, once it is the Session's.
func (s *Session) startTerm(tm *leaseTerm) { s.bg.Go(func() { s.keepAlive(tm) }) }

// keepAlive keeps the lease of the term tm alive until the term ends: every
// keepAliveEvery it renews the lease once (where etcd answers slowly, the
// renewals overlap), and reports each renewal to the observers, with its
// round trip and the margin the lease had left. It ends the term when a
// whole TTL has passed since the last renewal etcd acknowledged was sent,
// and when the client is closed: no renewal can come any more.
func (s *Session) keepAlive(tm *leaseTerm) {
	ctx := tm.ctx()
	var calls sync.WaitGroup
	defer calls.Wait()
	renew := func() {
		calls.Go(func() {
			rtt, margin, err := tm.keepAlive(ctx)
			if ctx.Err() == nil && s.events != nil {
				s.events.emit(Event{Kind: KeptAlive, Time: time.Now(), Lease: tm.id, RTT: rtt, Margin: margin, TTL: tm.ttl, Err: err})
			}
		})
	}
	if tm.untilSilent() < tm.ttl/2 {
		// An adopted lease (WithLease) may have little time left.
		renew()
	}
	tick := time.NewTicker(tm.keepAliveEvery())
	defer tick.Stop()
	dead := time.NewTimer(tm.untilDead())
	defer dead.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.client.Ctx().Done():
			tm.end()
			return
		case <-tick.C:
			renew()
		case <-dead.C:
			if d := tm.untilDead(); d > 0 {
				dead.Reset(d)
				continue
			}
			tm.end()
			return
		}
	}
}

// uniqueKey returns a new key under pfx for one hold on the lease of tm:
// <lease ID in hex>-<number>.
func (s *Session) uniqueKey(tm *leaseTerm, pfx string) string {
	return fmt.Sprintf("%s%x-%x", pfx, tm.id, s.seq.Add(1))
}

// retryTimeout bounds each background retry of a delete.
const retryTimeout = 2 * time.Second

// A retry is a delete that etcd did not confirm (of a key put with the
// lease of term), and what runs after it.
type retry struct {
	term *leaseTerm
	del  func(ctx context.Context) error
	then func()
}

// done runs what comes after the delete.
func (r retry) done() {
	if r.then != nil {
		r.then()
	}
}

// retryQueue is a Session's deletes to retry, and whether its goroutine
// runs.
type retryQueue struct {
	mu      sync.Mutex
	pending []retry
	running bool
}

// add queues r, and starts the goroutine that retries unless it runs. Where
// the Session is closing, the revoke of its lease does the deletes: r, and
// whatever else is queued, are done at once.
func (q *retryQueue) add(s *Session, r retry) {
	q.mu.Lock()
	q.pending = append(q.pending, r)
	start := !q.running
	q.running = true
	q.mu.Unlock()
	if start && !s.goBackground(func() { q.run(s) }) {
		for _, r := range q.stop() {
			r.done()
		}
	}
}

// stop takes every queued retry and marks the goroutine stopped.
func (q *retryQueue) stop() []retry {
	q.mu.Lock()
	defer q.mu.Unlock()
	todo := q.pending
	q.pending, q.running = nil, false
	return todo
}

// take returns the queued retries, or none once the queue is empty, which
// stops the goroutine.
func (q *retryQueue) take() []retry {
	q.mu.Lock()
	defer q.mu.Unlock()
	todo := q.pending
	q.pending = nil
	q.running = len(todo) > 0
	return todo
}

// put queues again the retries left of a round, before any added meanwhile.
func (q *retryQueue) put(left []retry) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.pending = append(left, q.pending...)
}

// run retries the queued deletes, in rounds, until none is left: a round
// tries each in turn, and stops at the first that fails (etcd is likely
// unreachable), which goes last in the next round. A delete whose lease
// ended, or whose Session did, is done without trying.
func (q *retryQueue) run(s *Session) {
	b := newBackoff()
	for todo := q.take(); len(todo) > 0; todo = q.take() {
		var left []retry
		for i, r := range todo {
			sctx := r.term.ctx()
			if sctx.Err() != nil || s.life.Err() != nil {
				r.done()
				continue
			}
			ctx, cancel := context.WithTimeout(sctx, retryTimeout)
			err := r.del(ctx)
			cancel()
			if err == nil {
				r.done()
				continue
			}
			left = append(append(left, todo[i+1:]...), r)
			break
		}
		if len(left) == 0 {
			b.reset()
			continue
		}
		q.put(left)
		_ = b.wait(s.life)
	}
}
