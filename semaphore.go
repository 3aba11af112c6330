package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/etcdlock/etcdlock/internal/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A Semaphore lets at most limit holders of its name hold a permit at once.
// A release wakes one waiter, and a free permit is never left idle while
// someone waits (docs/design.md §4). Each Acquire is one more permit (not
// reentrant), with its own token: a resource must accept any current
// holder's token.
type Semaphore struct {
	s     *Session
	name  string
	limit int
	rule  *queue.Rule
}

// NewSemaphore returns a handle on the semaphore called name with at most
// limit holders, as NewMutex does. Every holder of a name must use one limit
// (ErrLimitMismatch).
func NewSemaphore(s *Session, name string, limit int) *Semaphore {
	pfx := name + "/"
	sem := &Semaphore{s: s, name: name, limit: limit}
	sem.rule = queue.Semaphore(pfx, limit, func(value []byte) error {
		if got, ok := limitOf(value); !ok || got != limit {
			return fmt.Errorf("%w: a holder of %q has %s, this Semaphore %d", ErrLimitMismatch, name, describeLimit(value), limit)
		}
		return nil
	})
	return sem
}

// Name returns the semaphore's name, as given to NewSemaphore.
func (sem *Semaphore) Name() string {
	if sem == nil {
		return ""
	}
	return sem.name
}

// Limit returns the most holders the semaphore allows at once.
func (sem *Semaphore) Limit() int {
	if sem == nil {
		return 0
	}
	return sem.limit
}

// Acquire waits for a permit, as Mutex.LockContext waits for a lock.
func (sem *Semaphore) Acquire(ctx context.Context) (*Permit, error) {
	return sem.acquire(ctx, waitForever)
}

// TryAcquire waits at most wait for a permit, as Mutex.TryLockFor does, and
// returns ErrNoPermit where that returns (false, nil).
func (sem *Semaphore) TryAcquire(ctx context.Context, wait time.Duration) (*Permit, error) {
	return sem.acquire(ctx, max(wait, tryOnly))
}

func (sem *Semaphore) acquire(ctx context.Context, wait time.Duration) (*Permit, error) {
	if err := sem.check(ctx); err != nil {
		return nil, err
	}
	tm, err := sem.s.begin(ctx, wait)
	if err != nil {
		return nil, err
	}
	t := sem.s.newTicket(tm, sem.name, KindSemaphore, sem.rule, sem.s.uniqueKey(tm, sem.name+"/"), semaphoreValue(sem.limit, sem.s.identity))
	h, err := sem.s.acquire(ctx, claim{t: t, wait: wait})
	if errors.Is(err, errBusy) {
		return nil, ErrNoPermit
	}
	if err != nil {
		return nil, err
	}
	return &Permit{sem: sem, h: h}, nil
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
}

// Release gives the permit back, as the last unlock of a Mutex does;
// ErrNotHeld if it was released already, or is nil.
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

// IsOwner returns a comparison for a clientv3 Txn that is true only while the
// permit is held.
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
