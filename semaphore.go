package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/etcdlock/etcdlock/internal/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A Semaphore lets its name's holders hold at most limit permits at once,
// first come first served (a large acquisition is not overtaken), no permit
// idle while a waiter it admits waits (docs/design.md §4). Each acquisition is
// a Permit, not reentrant, with its own token. The limit is the one SetLimit
// recorded, else every holder's own (ErrLimitMismatch if they differ).
type Semaphore struct {
	s         *Session
	name      string
	limit     int
	rules     sync.Map     // weight → *queue.Rule: a try's read-first state, kept per weight
	ruleCount atomic.Int32 // rules kept, about maxRules at most
}

// NewSemaphore returns a handle on the semaphore called name, of limit
// permits while no limit is recorded (SetLimit; every holder then uses one
// limit, or gets ErrLimitMismatch), as NewMutex does. Under a role that may
// not read the record, it counts with limit whatever is recorded.
func NewSemaphore(s *Session, name string, limit int) *Semaphore {
	return &Semaphore{s: s, name: name, limit: limit}
}

// maxRules is how many weights a Semaphore keeps a rule for; another
// weight's acquisition gets a rule of its own, and its try reads no state
// of an earlier one.
const maxRules = 16

// rule returns the rule of an acquisition of weight permits.
func (sem *Semaphore) rule(weight int) *queue.Rule {
	if r, ok := sem.rules.Load(weight); ok {
		return r.(*queue.Rule)
	}
	name, limit := sem.name, sem.limit
	r := queue.Semaphore(name, limit, weight, func(value []byte) error {
		return fmt.Errorf("%w: a holder of %q has %s, this Semaphore %d", ErrLimitMismatch, name, describeLimit(value), limit)
	})
	if sem.ruleCount.Load() >= maxRules {
		return r
	}
	actual, loaded := sem.rules.LoadOrStore(weight, r)
	if !loaded {
		sem.ruleCount.Add(1) // racing first stores may pass maxRules by a few
	}
	return actual.(*queue.Rule)
}

// Name returns the semaphore's name, as given to NewSemaphore.
func (sem *Semaphore) Name() string {
	if sem == nil {
		return ""
	}
	return sem.name
}

// Limit returns the limit sem was made with (ReadLimit: the one in force).
func (sem *Semaphore) Limit() int {
	if sem == nil {
		return 0
	}
	return sem.limit
}

// Acquire waits for a permit, as Mutex.LockContext waits for a lock.
func (sem *Semaphore) Acquire(ctx context.Context) (*Permit, error) {
	return sem.acquire(ctx, 1, waitForever)
}

// TryAcquire is Acquire waiting at most wait: ErrNoPermit for (false, nil).
func (sem *Semaphore) TryAcquire(ctx context.Context, wait time.Duration) (*Permit, error) {
	return sem.acquire(ctx, 1, max(wait, tryOnly))
}

// AcquireN waits for n permits in one key, all or none, in turn (as x/sync's
// semaphore: those behind wait even where they fit); n above the limit in
// force holds alone. n < 1 is ErrInvalidArgument.
func (sem *Semaphore) AcquireN(ctx context.Context, n int) (*Permit, error) {
	return sem.acquire(ctx, n, waitForever)
}

// TryAcquireN is AcquireN waiting at most wait, as TryAcquire.
func (sem *Semaphore) TryAcquireN(ctx context.Context, n int, wait time.Duration) (*Permit, error) {
	return sem.acquire(ctx, n, max(wait, tryOnly))
}

func (sem *Semaphore) acquire(ctx context.Context, n int, wait time.Duration) (*Permit, error) {
	if err := sem.check(ctx); err != nil {
		return nil, err
	}
	if n < 1 {
		return nil, fmt.Errorf("%w: a Semaphore acquisition takes at least 1 permit, got %d", ErrInvalidArgument, n)
	}
	tm, err := sem.s.begin(ctx, wait)
	if err != nil {
		return nil, err
	}
	t := sem.s.newTicket(tm, sem.name, KindSemaphore, sem.rule(n), sem.s.uniqueKey(tm, sem.name+"/"), queue.SemaphoreValue(sem.limit, n, sem.s.identity))
	h, err := sem.s.acquire(ctx, claim{t: t, wait: wait})
	if errors.Is(err, errBusy) {
		return nil, ErrNoPermit
	}
	if err != nil {
		return nil, err
	}
	return &Permit{sem: sem, h: h, n: n}, nil
}

func (sem *Semaphore) check(ctx context.Context) error {
	if sem == nil {
		return validate(false, "", ctx)
	}
	if err := validate(sem.s != nil, sem.name, ctx); err != nil {
		return err
	}
	if sem.limit < 1 {
		return fmt.Errorf("%w: Semaphore limit must be at least 1, got %d", ErrInvalidArgument, sem.limit)
	}
	return nil
}

// A Permit is one hold of a Semaphore, from Acquire to Release.
type Permit struct {
	sem *Semaphore
	h   *keyHold // its end is the release: kept there, once
	n   int      // how many permits it holds
}

// Weight returns p's permits, 1 or AcquireN's n, even once released (nil: 0).
func (p *Permit) Weight() int {
	if p == nil {
		return 0
	}
	return p.n
}

// Release gives p back, as the last unlock; ErrNotHeld if nil or released.
func (p *Permit) Release(ctx context.Context) error {
	if p == nil {
		return ErrNotHeld
	}
	if ctx == nil {
		return fmt.Errorf("%w: nil context", ErrInvalidArgument)
	}
	if !p.h.end() {
		return ErrNotHeld
	}
	return p.h.unlock(ctx, nil)
}

// Key returns the permit's key, "" once released.
func (p *Permit) Key() string {
	if p.Token() == 0 {
		return ""
	}
	return p.h.t.Key()
}

// Token returns the permit's fencing token, 0 once released.
func (p *Permit) Token() int64 {
	if p == nil {
		return 0
	}
	if p.h.over() {
		return 0
	}
	return p.h.token()
}

// IsOwner returns a Txn comparison true only while the permit is held.
func (p *Permit) IsOwner() clientv3.Cmp {
	if p == nil {
		return ownerCmp("", 0)
	}
	return ownerCmp(p.h.t.Key(), p.Token())
}

// Done returns the permit's loss signal, as Mutex.Done does.
func (p *Permit) Done() <-chan struct{} {
	if p == nil {
		return closedDone
	}
	return p.h.lost()
}
