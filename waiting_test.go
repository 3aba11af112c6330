package etcdlock_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/queue"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// waitingOf returns the waiting signal of a lock of the family's hold, as
// the goroutine that holds it sees it.
func waitingOf(t *testing.T, l famLock) <-chan struct{} {
	t.Helper()
	var h etcdlock.Hold
	var ok bool
	switch l := l.(type) {
	case mutexLock:
		h, ok = l.m.Held()
	case writeLock:
		h, ok = l.rw.Held()
	case readLock:
		h, ok = l.rw.Held()
	case multiLock:
		h, ok = l.m.Held()
	case *semLock:
		return l.permits[0].Waiting()
	}
	if !ok {
		t.Fatalf("%T: no hold", l)
	}
	return h.Waiting()
}

// queueWaiters returns how many entries of the lock's queue wait, as etcd
// has it.
func queueWaiters(t *testing.T, ctx context.Context, client *clientv3.Client, name string) int {
	t.Helper()
	n := 0
	for _, e := range inspect(t, ctx, client, name) {
		if !e.Holds {
			n++
		}
	}
	return n
}

// TestWaiting: a hold's Waiting closes once another acquisition waits
// behind it, for every kind, and not for one that holds beside it (a
// reader, a permit); etcd shows the waiter when it closes.
func TestWaiting(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	kinds := []struct {
		member
		beside func(s *etcdlock.Session, name string) famLock // holds beside the hold, nil if nothing can
	}{
		{member{"Mutex", openMutex, openMutex, 1}, nil},
		{member{"RWMutex write", openWriter, openReader, 1}, nil},
		{member{"RWMutex read", openReader, openWriter, 1}, openReader},
		{member{"Semaphore 2", openSemaphore(2), openSemaphore(2), queue.NearHead}, openSemaphore(2)},
		{member{"MultiMutex", openMulti, openMutex, 1}, nil},
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			testflags.Parallel(t)
			ctx := testContext(t)
			name := lockName(t)
			l := k.open(newSession(t, client), name)
			mustLock(t, l)
			waiting := waitingOf(t, l)
			if k.beside != nil {
				b := k.beside(newSession(t, client), name)
				mustLock(t, b)
				defer func() {
					if err := b.Unlock(ctx); err != nil {
						t.Error(err)
					}
				}()
				if _, closed := closedWithin(waiting, 300*time.Millisecond); closed {
					t.Fatalf("Waiting closed for a holder beside the hold")
				}
			}
			w := lockInGoroutine(t, ctx, famLocker{k.blocker(newSession(t, client), name)})
			if _, ok := closedWithin(waiting, doneBound); !ok {
				t.Fatalf("Waiting still open %v after another acquisition queued", doneBound)
			}
			if n := queueWaiters(t, ctx, client, name); n == 0 {
				t.Fatalf("Waiting closed, and etcd has no waiter in the queue")
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if k.beside == nil {
				if err := waitErr(t, w.locked); err != nil {
					t.Fatalf("the waiter: %v", err)
				}
			}
		})
	}
}

// TestWaitingAlreadyQueued: a waiter queued before the holder asks is seen
// by the first read.
func TestWaitingAlreadyQueued(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	m := etcdlock.NewMutex(newSession(t, client), name)
	if err := m.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	lockInGoroutine(t, ctx, oursOn(newSession(t, client), name))
	eventually(t, "the waiter queued", func() bool { return len(lockKeys(t, client, name)) == 2 })
	h, _ := m.Held()
	if _, ok := closedWithin(h.Waiting(), doneBound); !ok {
		t.Fatalf("Waiting still open %v with a waiter in the queue", doneBound)
	}
	if err := m.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
	if (etcdlock.Hold{}).Waiting() != nil || (*etcdlock.Permit)(nil).Waiting() != nil {
		t.Fatalf("Waiting of no hold: want nil")
	}
}

// TestWaitingNoPolling: while nobody waits, Waiting costs one read and a
// watch: no more requests from the holder's client.
func TestWaitingNoPolling(t *testing.T) {
	testflags.Parallel(t)
	srv, healthy := startServer(t)
	var calls atomic.Int64
	client := serverClient(t, srv, func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method != "/etcdserverpb.Lease/LeaseKeepAlive" {
			calls.Add(1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}, nil)
	ctx := testContext(t)
	name := lockName(t)
	m := etcdlock.NewMutex(newSession(t, client, etcdlock.WithTTL(10*time.Second)), name)
	if err := m.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	h, _ := m.Held()
	before := calls.Load()
	waiting := h.Waiting()
	time.Sleep(time.Second)
	if n := calls.Load() - before; n > 1 {
		t.Fatalf("requests in 1 s of Waiting with nobody waiting: got %d, want at most 1 (the read)", n)
	}
	lockInGoroutine(t, ctx, oursOn(newSession(t, healthy), name))
	if _, ok := closedWithin(waiting, doneBound); !ok {
		t.Fatalf("Waiting still open %v after a waiter queued", doneBound)
	}
	if err := m.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestWaitingAfterLoss: once the hold's key is gone (here released by an
// operator), a waiter behind the next holder is not one behind this hold:
// Waiting stays open. And an RWMutex's writer of the same Session, which has
// a key of its own, does not count as waiting behind its reader; another
// Session's writer does.
func TestWaitingAfterLoss(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)

	a := etcdlock.NewMutex(newSession(t, client), name)
	if err := a.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	h, _ := a.Held()
	waiting := h.Waiting()
	if err := etcdlock.Release(ctx, client, name, entryOf(t, client, name, h.Lease)); err != nil {
		t.Fatal(err)
	}
	b := etcdlock.NewMutex(newSession(t, client), name)
	if err := b.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	c := lockInGoroutine(t, ctx, famLocker{openMutex(newSession(t, client), name)})
	eventually(t, "a waiter behind the next holder", func() bool { return queueWaiters(t, ctx, client, name) == 1 })
	if _, ok := closedWithin(waiting, time.Second); ok {
		t.Fatal("Waiting of a released hold closed for a waiter behind the next holder")
	}
	if err := b.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
	if err := waitErr(t, c.locked); err != nil {
		t.Fatal(err)
	}

	s := newSession(t, client)
	rw := etcdlock.NewRWMutex(s, name+"/rw")
	if err := rw.RLockContext(ctx); err != nil {
		t.Fatal(err)
	}
	hr, _ := rw.Held()
	rwaiting := hr.Waiting()
	sameSession := lockInGoroutine(t, ctx, famLocker{openWriter(s, name+"/rw")})
	eventually(t, "the same Session's writer queued", func() bool { return queueWaiters(t, ctx, client, name+"/rw") == 1 })
	if _, ok := closedWithin(rwaiting, time.Second); ok {
		t.Fatal("a reader's Waiting closed for a writer of its own Session")
	}
	other := lockInGoroutine(t, ctx, famLocker{openWriter(newSession(t, client), name+"/rw")})
	eventually(t, "another Session's writer queued", func() bool { return queueWaiters(t, ctx, client, name+"/rw") == 2 })
	if _, ok := closedWithin(rwaiting, doneBound); !ok {
		t.Fatal("a reader's Waiting still open with another Session's writer queued behind it")
	}
	if err := rw.RUnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
	for _, w := range []*worker{sameSession, other} { // the writers, in turn
		if err := waitErr(t, w.locked); err != nil {
			t.Fatal(err)
		}
		if err := w.Release(); err != nil {
			t.Fatal(err)
		}
	}
}
