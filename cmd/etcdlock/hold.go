package main

import (
	"context"
	"errors"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
)

// lockMode is how a run holds its lock: alone, shared, or counted.
type lockMode int

const (
	// exclusive, the default, holds the Mutex of NAME, which excludes
	// etcdctl lock and concurrency.Mutex, then the write lock of its
	// RWMutex, which excludes --shared runs.
	exclusive lockMode = iota
	// shared (--shared) holds the read lock of NAME's RWMutex.
	shared
	// counted (--limit N) holds a permit of NAME's Semaphore of N.
	counted
)

// runLock is what one run holds of its lock. Its holds are taken and
// released by one goroutine, as Mutex and RWMutex require.
type runLock struct {
	mode  lockMode
	s     *etcdlock.Session
	names []string // NAME, or the names of --lock
	m     mutexLock
	rws   []*etcdlock.RWMutex // one per name
	sem   *etcdlock.Semaphore

	mHeld, rHeld bool
	wHeld        []bool // one per name
	permit       *etcdlock.Permit
}

// A mutexLock is what an exclusive run takes first: the Mutex of NAME, or the
// MultiMutex of the names of --lock.
type mutexLock interface {
	LockContext(ctx context.Context) error
	TryLockFor(ctx context.Context, wait time.Duration) (bool, error)
	UnlockContext(ctx context.Context) error
	Token() int64
	Done() <-chan struct{}
}

func newRunLock(s *etcdlock.Session, names []string, mode lockMode, limit int) *runLock {
	l := &runLock{mode: mode, s: s, names: names, wHeld: make([]bool, len(names))}
	for _, name := range names {
		l.rws = append(l.rws, etcdlock.NewRWMutex(s, name))
	}
	switch {
	case mode == counted:
		l.sem = etcdlock.NewSemaphore(s, names[0], limit)
	case len(names) > 1:
		l.m = etcdlock.NewMultiMutex(s, names...)
	default:
		l.m = etcdlock.NewMutex(s, names[0])
	}
	return l
}

// A step is one acquisition of a run's lock: the lock call that waits as
// long as ctx lasts, the try that waits at most wait, and who holds what
// the step waits for, among the entries of Inspect of each of names.
type step struct {
	names   []string
	lock    func(ctx context.Context) error
	try     func(ctx context.Context, wait time.Duration) (bool, error)
	blocker func(entries []etcdlock.QueueEntry, ours clientv3.LeaseID) (etcdlock.QueueEntry, bool)
}

// steps returns the acquisitions of the run's lock, in the order they are
// taken: always the Mutex (or the MultiMutex of every name) before the
// RWMutexes, so that runs cannot deadlock: a run that waits for a write
// lock has every name's Mutex, and waits only for --shared runs, which hold
// one read lock and wait for nothing.
func (l *runLock) steps() []step {
	switch l.mode {
	case shared:
		rw := l.rws[0]
		return []step{{
			names: l.names,
			lock: func(ctx context.Context) error {
				err := rw.RLockContext(ctx)
				l.rHeld = err == nil
				return err
			},
			try: func(ctx context.Context, wait time.Duration) (bool, error) {
				ok, err := rw.TryRLockFor(ctx, wait)
				l.rHeld = ok
				return ok, err
			},
			blocker: kindHolder(etcdlock.KindWrite),
		}}
	case counted:
		return []step{{
			names: l.names,
			lock: func(ctx context.Context) error {
				p, err := l.sem.Acquire(ctx)
				l.permit = p
				return err
			},
			try: func(ctx context.Context, wait time.Duration) (bool, error) {
				p, err := l.sem.TryAcquire(ctx, wait)
				if errors.Is(err, etcdlock.ErrNoPermit) {
					return false, nil
				}
				l.permit = p
				return p != nil, err
			},
			blocker: kindHolder(etcdlock.KindSemaphore),
		}}
	}
	steps := []step{{
		names: l.names,
		lock: func(ctx context.Context) error {
			err := l.m.LockContext(ctx)
			l.mHeld = err == nil
			return err
		},
		try: func(ctx context.Context, wait time.Duration) (bool, error) {
			ok, err := l.m.TryLockFor(ctx, wait)
			l.mHeld = ok
			return ok, err
		},
		blocker: mutexHolder,
	}}
	for i, rw := range l.rws {
		steps = append(steps, step{
			names: l.names[i : i+1],
			lock: func(ctx context.Context) error {
				err := rw.LockContext(ctx)
				l.wHeld[i] = err == nil
				return err
			},
			try: func(ctx context.Context, wait time.Duration) (bool, error) {
				ok, err := rw.TryLockFor(ctx, wait)
				l.wHeld[i] = ok
				return ok, err
			},
			blocker: kindHolder(etcdlock.KindRead, etcdlock.KindWrite),
		})
	}
	return steps
}

// held reports whether the run holds any part of its lock.
func (l *runLock) held() bool {
	return l != nil && (l.mHeld || slices.Contains(l.wHeld, true) || l.rHeld || l.permit != nil)
}

// key and token are those COMMAND gets: the Mutex's for an exclusive run,
// which etcdctl lock's users know (of the first name, with --lock: the
// others' keys are their names with the same lease and token), else those
// of the read hold or permit.
func (l *runLock) key() string {
	switch l.mode {
	case shared:
		return l.rws[0].Key()
	case counted:
		return l.permit.Key()
	}
	return etcdlock.NewMutex(l.s, l.names[0]).Key()
}

func (l *runLock) token() int64 {
	switch l.mode {
	case shared:
		return l.rws[0].Token()
	case counted:
		return l.permit.Token()
	}
	return l.m.Token()
}

// fence is the fence COMMAND gets: of the key and token above, in the queue
// of the first name.
func (l *runLock) fence() etcdlock.Fence {
	return etcdlock.Fence{Name: l.names[0], Key: l.key(), Token: l.token()}
}

// done returns the channels that close when a hold of the run is lost or
// about to be: one, but for an exclusive run, which holds a write lock of
// each name besides.
func (l *runLock) done() []<-chan struct{} {
	switch l.mode {
	case shared:
		return []<-chan struct{}{l.rws[0].Done()}
	case counted:
		return []<-chan struct{}{l.permit.Done()}
	}
	chs := []<-chan struct{}{l.m.Done()}
	for _, rw := range l.rws {
		chs = append(chs, rw.Done())
	}
	return chs
}

// release releases whatever the run holds, the last taken first.
func (l *runLock) release(ctx context.Context) error {
	var errs []error
	for i, rw := range slices.Backward(l.rws) {
		if l.wHeld[i] {
			l.wHeld[i] = false
			errs = append(errs, rw.UnlockContext(ctx))
		}
	}
	if l.rHeld {
		l.rHeld = false
		errs = append(errs, l.rws[0].RUnlockContext(ctx))
	}
	if l.mHeld {
		l.mHeld = false
		errs = append(errs, l.m.UnlockContext(ctx))
	}
	if l.permit != nil {
		errs = append(errs, l.permit.Release(ctx))
		l.permit = nil
	}
	return errors.Join(errs...)
}

// mutexHolder returns the holder a Mutex of the lock waits for, among the
// entries Inspect read, and whether there is one other than the Session of
// lease ours (the lock is ours now).
func mutexHolder(entries []etcdlock.QueueEntry, ours clientv3.LeaseID) (etcdlock.QueueEntry, bool) {
	for _, e := range entries {
		// A Mutex waits for the holders of its queue, not an RWMutex's.
		if e.Holds && e.Kind != etcdlock.KindRead && e.Kind != etcdlock.KindWrite {
			if e.Lease == ours {
				break
			}
			return e, true
		}
	}
	return etcdlock.QueueEntry{}, false
}

// kindHolder returns a function that finds the oldest holder of one of
// kinds that is not of the lease ours.
func kindHolder(kinds ...etcdlock.Kind) func([]etcdlock.QueueEntry, clientv3.LeaseID) (etcdlock.QueueEntry, bool) {
	return func(entries []etcdlock.QueueEntry, ours clientv3.LeaseID) (etcdlock.QueueEntry, bool) {
		for _, e := range entries {
			for _, k := range kinds {
				if e.Holds && e.Kind == k && e.Lease != ours {
					return e, true
				}
			}
		}
		return etcdlock.QueueEntry{}, false
	}
}
