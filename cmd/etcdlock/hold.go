package main

import (
	"context"
	"errors"
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
	mode lockMode
	m    *etcdlock.Mutex
	rw   *etcdlock.RWMutex
	sem  *etcdlock.Semaphore

	mHeld, wHeld, rHeld bool
	permit              *etcdlock.Permit
}

func newRunLock(s *etcdlock.Session, name string, mode lockMode, limit int) *runLock {
	l := &runLock{mode: mode}
	switch mode {
	case exclusive:
		l.m, l.rw = etcdlock.NewMutex(s, name), etcdlock.NewRWMutex(s, name)
	case shared:
		l.rw = etcdlock.NewRWMutex(s, name)
	case counted:
		l.sem = etcdlock.NewSemaphore(s, name, limit)
	}
	return l
}

// A step is one acquisition of a run's lock: the lock call that waits as
// long as ctx lasts, the try that waits at most wait, and who holds what
// the step waits for, among the entries of Inspect.
type step struct {
	lock    func(ctx context.Context) error
	try     func(ctx context.Context, wait time.Duration) (bool, error)
	blocker func(entries []etcdlock.QueueEntry, ours clientv3.LeaseID) (etcdlock.QueueEntry, bool)
}

// steps returns the acquisitions of the run's lock, in the order they are
// taken: always the Mutex before the RWMutex, so that runs cannot deadlock.
func (l *runLock) steps() []step {
	switch l.mode {
	case shared:
		return []step{{
			lock: func(ctx context.Context) error {
				err := l.rw.RLockContext(ctx)
				l.rHeld = err == nil
				return err
			},
			try: func(ctx context.Context, wait time.Duration) (bool, error) {
				ok, err := l.rw.TryRLockFor(ctx, wait)
				l.rHeld = ok
				return ok, err
			},
			blocker: kindHolder(etcdlock.KindWrite),
		}}
	case counted:
		return []step{{
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
	return []step{{
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
	}, {
		lock: func(ctx context.Context) error {
			err := l.rw.LockContext(ctx)
			l.wHeld = err == nil
			return err
		},
		try: func(ctx context.Context, wait time.Duration) (bool, error) {
			ok, err := l.rw.TryLockFor(ctx, wait)
			l.wHeld = ok
			return ok, err
		},
		blocker: kindHolder(etcdlock.KindRead, etcdlock.KindWrite),
	}}
}

// held reports whether the run holds any part of its lock.
func (l *runLock) held() bool {
	return l != nil && (l.mHeld || l.wHeld || l.rHeld || l.permit != nil)
}

// key and token are those COMMAND gets: the Mutex's for an exclusive run,
// which etcdctl lock's users know, else those of the read hold or permit.
func (l *runLock) key() string {
	switch l.mode {
	case shared:
		return l.rw.Key()
	case counted:
		return l.permit.Key()
	}
	return l.m.Key()
}

func (l *runLock) token() int64 {
	switch l.mode {
	case shared:
		return l.rw.Token()
	case counted:
		return l.permit.Token()
	}
	return l.m.Token()
}

// done returns the channels that close when a hold of the run is lost or
// about to be: b is nil but for an exclusive run, which holds two.
func (l *runLock) done() (a, b <-chan struct{}) {
	switch l.mode {
	case shared:
		return l.rw.Done(), nil
	case counted:
		return l.permit.Done(), nil
	}
	return l.m.Done(), l.rw.Done()
}

// release releases whatever the run holds, the last taken first.
func (l *runLock) release(ctx context.Context) error {
	var errs []error
	if l.wHeld {
		l.wHeld = false
		errs = append(errs, l.rw.UnlockContext(ctx))
	}
	if l.rHeld {
		l.rHeld = false
		errs = append(errs, l.rw.RUnlockContext(ctx))
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
