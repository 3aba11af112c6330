package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/etcdlock/etcdlock/internal/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A Semaphore lets at most limit holders of its name hold a permit at once,
// across processes, first come first served.
//
// Every permit is a key name/<lease ID in hex>-<number> with the Session's
// lease, whose value carries the limit. The holders are the limit oldest
// keys. A waiter that is next in line (the head) watches the name for
// releases; a waiter behind it watches only the key just before its own, and
// an admitted waiter that sees a key behind it puts its own key again, once,
// to tell that key it has moved up. So a release wakes one waiter, not all of
// them, and a free permit is never left idle while someone waits: the head
// is woken by any release, and each waiter becomes the head, or is admitted,
// only through its predecessor's admission or leaving, which it watches.
//
// Permits are not reentrant: each Acquire is one more permit, as with
// golang.org/x/sync/semaphore. Each Permit has its own fencing token; a
// resource guarded by a semaphore must accept any of the current holders'
// tokens, so tokens mean less here than for a Mutex.
//
// The zero Semaphore is not usable; make one with NewSemaphore. Its methods
// are safe for use by many goroutines.
type Semaphore struct {
	s     *Session
	name  string
	limit int
	rule  *queue.Rule
}

// NewSemaphore returns a handle on the semaphore called name with at most
// limit holders, taken with the lease of s. Every holder and waiter of a
// name must use the same limit (ErrLimitMismatch otherwise). NewSemaphore
// writes nothing and never fails: a nil Session, the empty name or a
// limit < 1 make every call return an error (ErrInvalidArgument,
// ErrInvalidName).
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

// Acquire waits for a permit and returns it, or fails when ctx ends
// (ctx.Err()), the Session ends (ErrSessionExpired), another holder uses a
// different limit (ErrLimitMismatch), or etcd fails; it then leaves no key
// of its own in etcd, where etcd is reachable, including when ctx ends after
// etcd applied the request.
func (sem *Semaphore) Acquire(ctx context.Context) (*Permit, error) {
	return sem.acquire(ctx, waitForever)
}

// TryAcquire waits at most wait for a permit (wait <= 0: only try) and
// returns it; ErrNoPermit when none came free in time while others held or
// waited ahead. The wait counts only the time spent waiting for others, not
// etcd's answers, which ctx bounds. A try that finds
// every permit taken writes nothing to etcd. Other failures are those of
// Acquire.
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
	h   *hold

	mu       sync.Mutex
	released bool
}

// Release gives the permit back: it deletes its key, fenced on the key's
// create revision, on a context detached from ctx and bounded by 3 s. It
// returns ErrNotHeld if the permit was released already (and for a nil
// Permit, so that defer p.Release(ctx) is safe), ErrLockLost or
// ErrSessionExpired if the key was already gone, and etcd's error if etcd
// did not confirm the delete; the delete is then retried in the background
// until it succeeds or its lease ends (whose revoke or expiry deletes the key). The permit is released in every
// case.
func (p *Permit) Release(ctx context.Context) error {
	if p == nil {
		return ErrNotHeld
	}
	if ctx == nil {
		return fmt.Errorf("%w: nil context", ErrInvalidArgument)
	}
	p.mu.Lock()
	if p.released {
		p.mu.Unlock()
		return ErrNotHeld
	}
	p.released = true
	p.mu.Unlock()
	p.h.end()
	return p.h.unlock(ctx, nil)
}

// Key returns the permit's etcd key, "" once released.
func (p *Permit) Key() string {
	if p.Token() == 0 {
		return ""
	}
	return p.h.t.Key()
}

// Token returns the permit's fencing token, the create revision of its key,
// and 0 once released.
func (p *Permit) Token() int64 {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.released {
		return 0
	}
	return p.h.token()
}

// IsOwner returns a comparison for a clientv3 Txn that is true only while
// the permit is held: it fails once the permit is released or lost.
func (p *Permit) IsOwner() clientv3.Cmp {
	if p == nil {
		return ownerCmp("", 0)
	}
	return ownerCmp(p.h.t.Key(), p.Token())
}

// Done returns a channel that is closed when the permit is released or
// lost, as Mutex.Done is for a hold.
func (p *Permit) Done() <-chan struct{} {
	if p == nil {
		return closedDone
	}
	return p.h.lost()
}
