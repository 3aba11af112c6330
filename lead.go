package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/etcdlock/etcdlock/internal/handover"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Lead runs f as Mutex.Do does (package doc, For jobs) whenever this process
// leads name's Mutex queue (LeaderOf), until ctx ends, campaigning again
// after a pause: two processes' f never run while both their keys are the
// oldest. It returns ctx.Err(), f's error (not a loss), ErrStalled (see
// WithWatchdog), or a request etcd refused (permission denied), at once;
// other failures are retried. It closes its Session (opts, WithRenewal;
// WithLease, WithContext: ErrInvalidArgument) on every way out. f ends a term
// early with StepDown or HandOver; TermFrom counts the terms. Under a role
// without Lead's records (1.0.0's), f runs uncounted and no hand-over is
// honoured (docs/keys.md).
func Lead(ctx context.Context, client *clientv3.Client, name string, f func(ctx context.Context) error, opts ...SessionOption) error {
	switch {
	case ctx == nil:
		return fmt.Errorf("%w: nil context", ErrInvalidArgument)
	case client == nil:
		return fmt.Errorf("%w: nil client", ErrInvalidArgument)
	case f == nil:
		return fmt.Errorf("%w: nil function", ErrInvalidArgument)
	case name == "":
		return ErrInvalidName
	}
	o := options(opts)
	switch {
	case o.err != nil:
		return o.err
	case o.lease != clientv3.NoLease:
		return fmt.Errorf("%w: Lead does not take WithLease: it needs a new lease whenever the lease is gone, and a lease of the caller's is gone after one term", ErrInvalidArgument)
	case o.ctx != nil:
		return fmt.Errorf("%w: Lead does not take WithContext: the end of that context would revoke the lease while f still runs; end Lead's ctx instead", ErrInvalidArgument)
	}
	retry := newBackoff() // after a Session that could not be made
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		// Not WithContext(ctx): its cancel would revoke the lease, and so
		// release the lock, while f may still run.
		s, err := newSession(ctx, client, append(opts, WithRenewal())...)
		if err != nil {
			if ctx.Err() == nil {
				// No Session, so no dispatch: the observers hear it from
				// Lead's own goroutine, so that an endpoint that never
				// answers does not look like a backup never elected.
				e := Event{Kind: SessionFailed, Time: time.Now(), Lock: name, Primitive: KindMutex, Err: err}
				for _, ob := range o.observers {
					ob.Observe(e)
				}
			}
			if err := retry.wait(ctx); err != nil {
				return err
			}
			continue
		}
		defer func() { _ = s.Close() }()
		return s.lead(ctx, name, f)
	}
}

// Lead is the function Lead on s, which it does not close: ErrSessionExpired
// once s has ended (without WithRenewal, its lease gone); ErrInvalidArgument
// within a hold of name on s (the calling goroutine's, or a Do's f's).
func (s *Session) Lead(ctx context.Context, name string, f func(ctx context.Context) error) error {
	if err := validate(s != nil, name, ctx); err != nil {
		return err
	}
	if f == nil {
		return fmt.Errorf("%w: nil function", ErrInvalidArgument)
	}
	return s.lead(ctx, name, f)
}

// lead campaigns and leads on s until ctx ends, f fails, or s ends, pausing
// between campaigns: 50 ms, doubling to 1 s while terms keep ending within
// 1 s of their campaign; a term that ended with StepDown pauses as it says,
// and a candidate that steps aside for the one handed over to campaigns
// again at once.
func (s *Session) lead(ctx context.Context, name string, f func(ctx context.Context) error) error {
	m := NewMutex(s, name)
	if st := m.lookup(); st != nil && st.reenters(ctx) {
		// Its campaigns would be re-entries of a hold this goroutine, or
		// ctx's scope, has: terms without end, none of them a campaign.
		return fmt.Errorf("%w: Lead of %q within a hold of it (held by this goroutine, or in a Do's or a Lead's f): end that hold first", ErrInvalidArgument, name)
	}
	pace := newBackoff()  // between campaigns
	retry := newBackoff() // after a campaign that failed
	for {
		start := time.Now()
		t := leadTerm{s: s, name: name}
		o := m.do(ctx, waitForever, func(fctx context.Context) error { return t.run(fctx, f) })
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case !o.ran && (!s.lockable(o.err) || !retryable(o.err)):
			return o.err // refused by etcd: applied nowhere, nothing to wait for
		case t.claimErr != nil && !retryable(t.claimErr):
			return t.claimErr // refused by etcd: permission denied, say
		case !o.ran || t.claimErr != nil:
			// etcd unreachable, a malformed reply, or the lease lost
			// (WithRenewal: the next campaign waits for the next one):
			// campaign again soon.
			if err := retry.wait(ctx); err != nil {
				return err
			}
			continue
		case o.closed:
			return fmt.Errorf("%w: lead %q: f did not return within the period after its context was cancelled: the session was closed", ErrStalled, name)
		case o.err != nil && !o.lost && !o.stalled:
			return o.err
		case t.refused != nil:
			return t.refused // the hand-over's record, refused: the lock released
		}
		retry.reset()
		if t.aside {
			continue // behind the candidate handed over to, at once
		}
		// A term ended. A campaign and term longer than the longest pause
		// are no spin: the next pause is the first.
		if time.Since(start) > maxBackoff {
			pace.reset()
		}
		wait := pace.wait
		if t.end != nil && t.end.to == "" {
			wait = func(ctx context.Context) error { return sleep(ctx, t.end.pause) }
			pace.reset()
		}
		if err := wait(ctx); err != nil {
			return err
		}
		if s.ended() {
			return ErrSessionExpired
		}
	}
}

// StepDown returns the error that f returns to end its Lead term, release as
// a nil does, and campaign again after pause (0: no pause at all); with nobody
// queued, it leads again. Like filepath.SkipDir, it acts only as f's return.
// A negative pause is ErrInvalidArgument, wrapped.
func StepDown(pause time.Duration) error {
	if pause < 0 {
		return fmt.Errorf("%w: StepDown: pause %v, want >= 0", ErrInvalidArgument, pause)
	}
	return &termEnd{pause: pause}
}

// HandOver returns the error that f returns to end its Lead term and let
// candidate to (a queued key as Inspect lists it, or WithIdentity's oldest
// waiter; not its own) lead next, as long as its key lasts: Lead candidates
// ahead give way (SteppedAside), a Mutex takes its turn, two f never run at
// once. No such candidate, or no record put in 5 s: the term ends as a nil
// does; refused: Lead releases, returns the refusal. "": ErrInvalidArgument.
func HandOver(to string) error {
	if to == "" {
		return fmt.Errorf("%w: HandOver: no candidate named", ErrInvalidArgument)
	}
	return &termEnd{to: to}
}

// A termEnd is how f asks Lead to end its term: StepDown's or HandOver's.
type termEnd struct {
	pause time.Duration // StepDown's
	to    string        // HandOver's candidate
}

func (e *termEnd) Error() string {
	if e.to != "" {
		return fmt.Sprintf("etcdlock: hand over to %q (an f run by Lead returns this)", e.to)
	}
	return fmt.Sprintf("etcdlock: step down for %v (an f run by Lead returns this)", e.pause)
}

type termKey struct{}

// TermFrom returns the term count of the Lead scope of ctx (false outside
// one, or where etcd refuses Lead the count's key): 1, then one more for each
// Lead term of the name in any process, each once (client-go's
// LeaderTransitions, counting the first). A name led again within 10 minutes
// of its last term counts on; one without a leader for 15 minutes starts at 1.
func TermFrom(ctx context.Context) (int64, bool) {
	n, ok := ctx.Value(termKey{}).(int64)
	return n, ok
}

// claimTimeout bounds a new holder's reads and writes of the records, and
// handOverTimeout a leader's hand-over, each attempt bounded by
// recordCallTimeout.
const (
	claimTimeout      = 5 * time.Second
	handOverTimeout   = 5 * time.Second
	recordCallTimeout = 2 * time.Second
)

// A leadTerm is one hold of a Lead: how its term began and ended.
type leadTerm struct {
	s    *Session
	name string

	claimErr error    // the term could not begin: f did not run
	aside    bool     // the holder gave way to the candidate handed over to
	end      *termEnd // f ended the term with StepDown or HandOver
	refused  error    // etcd refused the hand-over's record: Lead returns it
}

// run begins the term of the hold in fctx (or steps aside), runs f, and
// hands over if f asks to.
func (t *leadTerm) run(fctx context.Context, f func(ctx context.Context) error) error {
	held, _ := HoldFrom(fctx)
	me := handover.Candidate{Key: held.Key, Token: held.Token}
	e := Event{Lock: t.name, Primitive: KindMutex, Lease: held.Lease, Key: held.Key, Token: held.Token}
	// The claim and the hand-over are Lead's calls, not f's: the
	// watchdog does not count them.
	var c handover.Claimed
	var err error
	exempt(fctx, func() { c, err = t.claim(fctx, me) })
	switch {
	case errors.Is(err, rpctypes.ErrPermissionDenied):
		// A role without Lead's records (1.0.0's: name/ and the fence
		// keys): lead as 1.0.0 did, uncounted, honouring no hand-over
		// (no Lead of this role can have put one).
		c, e.Err = handover.Claimed{Verdict: handover.Lead}, err
	case err != nil:
		t.claimErr = err
		return nil
	case c.Verdict == handover.Lost:
		t.claimErr = ErrLockLost
		return nil
	case c.Verdict == handover.StepAside:
		t.aside = true
		e.Kind, e.Target = SteppedAside, c.To.Key
		t.s.events.emit(e)
		return nil
	}
	e.Kind, e.Term = TermStarted, c.Term
	t.s.events.emit(e)
	// f's context ends when f returns, as Do's does: before a hand-over,
	// which may take a while.
	termCtx := fctx
	if c.Term > 0 {
		termCtx = context.WithValue(fctx, termKey{}, c.Term)
	}
	termCtx, endTerm := context.WithCancel(termCtx)
	defer t.keepCount(termCtx, c.Lease)() // stopped however f ends, panics too
	err = f(termCtx)
	endTerm()
	if !errors.As(err, &t.end) {
		return err
	}
	if t.end.to != "" {
		e.Kind, e.Term, e.Err = HandedOver, 0, nil
		exempt(fctx, func() { e.Target, e.Err = t.handOver(context.WithoutCancel(fctx), me, t.end.to) })
		if errors.Is(e.Err, rpctypes.ErrPermissionDenied) {
			t.refused = errorf("lead", t.name, fmt.Errorf("HandOver needs read and write on %s: %w", handover.RecordKey(t.name), e.Err))
		}
		t.s.events.emit(e)
	}
	return nil
}

// keepCount keeps the term count's lease alive while ctx lasts: now, and
// then every third of the TTL the lease was granted (5 min for the
// count's own, handover.CountTTL), so that the count lasts while a leader
// leads; the returned func stops it and waits. A keep-alive that fails is
// tried again after a second: a count whose lease ends starts again at 1.
func (t *leadTerm) keepCount(ctx context.Context, lease clientv3.LeaseID) (stop func()) {
	if lease == clientv3.NoLease {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		every := handover.CountTTL / 3
		for {
			kctx, kcancel := context.WithTimeout(ctx, recordCallTimeout)
			resp, err := t.s.Client().KeepAliveOnce(kctx, lease)
			kcancel()
			next := every
			switch {
			case errors.Is(err, rpctypes.ErrLeaseNotFound):
				return
			case err != nil:
				next = min(time.Second, every)
			case resp.TTL > 0:
				every = time.Duration(resp.TTL) * time.Second / 3
				next = every
			}
			if sleep(ctx, next) != nil {
				return
			}
		}
	}()
	return func() { cancel(); <-done }
}

// claim reads the records as the new holder me, and counts its term, or
// says to step aside; it tries again for claimTimeout while etcd fails.
func (t *leadTerm) claim(ctx context.Context, me handover.Candidate) (handover.Claimed, error) {
	ctx, cancel := context.WithTimeout(ctx, claimTimeout)
	defer cancel()
	id := strconv.FormatUint(rand.Uint64(), 36) // this claim's, for every try
	for {
		cctx, ccancel := context.WithTimeout(ctx, recordCallTimeout)
		c, err := handover.Claim(cctx, t.s.Client(), t.s.Client(), t.name, me, id)
		ccancel()
		switch {
		case err == nil:
			return c, nil
		case errors.Is(err, rpctypes.ErrPermissionDenied):
			return c, errorf("lead", t.name, fmt.Errorf("TermFrom's count and hand-overs need read and write on %s and %s; leading without them: %w",
				handover.TermKey(t.name), handover.RecordKey(t.name), err))
		case !retryable(err):
			return c, errorf("lead", t.name, err)
		}
		if serr := sleep(ctx, firstBackoff); serr != nil {
			return handover.Claimed{}, errorf("lead", t.name, errors.Join(serr, err))
		}
	}
}

// handOver puts the record that hands the lock over from me to the oldest
// waiter whose key or identity is to; it returns the key handed over to,
// or "" (and why, if etcd failed) when there was none, or the record could
// not be put.
func (t *leadTerm) handOver(ctx context.Context, me handover.Candidate, to string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, handOverTimeout)
	defer cancel()
	for {
		cctx, ccancel := context.WithTimeout(ctx, recordCallTimeout)
		key, err := t.giveOnce(cctx, me, to)
		ccancel()
		if err == nil || !retryable(err) {
			return key, err
		}
		if serr := sleep(ctx, firstBackoff); serr != nil {
			return "", errors.Join(serr, err)
		}
	}
}

// giveOnce is one read of the queue and one Txn of handOver.
func (t *leadTerm) giveOnce(ctx context.Context, me handover.Candidate, to string) (string, error) {
	entries, err := Inspect(ctx, t.s.Client(), t.name)
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		if e.Holds || e.Kind != KindMutex || e.Key == me.Key || (e.Key != to && e.Identity != to) {
			continue
		}
		ok, err := handover.Give(ctx, t.s.Client(), t.name, me, handover.Candidate{Key: e.Key, Token: e.Token}, e.Lease)
		if !ok {
			return "", err
		}
		return e.Key, nil
	}
	return "", nil
}

// retryable reports whether err, from etcd, may pass: not a refusal, nor
// bad input.
func retryable(err error) bool {
	switch {
	case errors.Is(err, rpctypes.ErrPermissionDenied), errors.Is(err, rpctypes.ErrAuthNotEnabled),
		errors.Is(err, rpctypes.ErrInvalidAuthToken), errors.Is(err, ErrInvalidArgument):
		return false
	}
	return true
}
