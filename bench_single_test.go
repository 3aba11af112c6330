package etcdlock_test

// Benchmarks of one holder (bench_test.go has the harness and its
// metrics): a lock nobody else wants, with fsync, the fenced unlock, a
// relock by its holder, and TryLock on a held and on a free lock.

import (
	"context"
	"errors"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
)

// BenchmarkUncontended: one holder locks and unlocks a lock nobody else
// wants. One op is a LockContext and an UnlockContext (upstream: Lock(ctx)
// and Unlock(ctx)).
func BenchmarkUncontended(b *testing.B) {
	forEachImpl(b, startBench(b), benchUncontended)
}

func benchUncontended(b *testing.B, e *benchServer, impl benchImpl) {
	benchLockUnlock(b, e, impl.newSession(b, e.client(b))(benchName(b)))
}

// benchLockUnlock measures one holder that locks and unlocks l, which nobody
// else wants: one op is a Lock and an Unlock.
func benchLockUnlock(b *testing.B, e *benchServer, l benchLocker) {
	ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
	defer cancel()
	m := e.startMeter(b)
	for b.Loop() {
		if err := l.Lock(ctx); err != nil {
			b.Fatalf("Lock: %v", err)
		}
		if err := l.Unlock(ctx); err != nil {
			b.Fatalf("Unlock: %v", err)
		}
	}
	m.report(b, b.N)
}

// BenchmarkFsync: BenchmarkUncontended and BenchmarkContended/sessions=2 on
// an etcd that fsyncs its log and backend (etcdtest.WithFsync), as a
// production etcd does, with its data in a temporary directory: on the disk
// of TMPDIR, /tmp by default.
func BenchmarkFsync(b *testing.B) {
	b.Run("Uncontended", func(b *testing.B) {
		forEachImpl(b, startBench(b, etcdtest.WithFsync()), benchUncontended)
	})
	b.Run("Contended/sessions=2", func(b *testing.B) {
		forEachImpl(b, startBench(b, etcdtest.WithFsync()), benchSessions(2))
	})
}

// BenchmarkFencedDelete prices the fence of UnlockContext (D6), without a
// lock: one op puts a key and deletes it, with a plain Delete as
// concurrency.Mutex's Unlock does, or with a Txn that deletes the key only if
// its create revision is the put's, as UnlockContext does.
func BenchmarkFencedDelete(b *testing.B) {
	e := startBench(b)
	c := e.client(b)
	ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
	defer cancel()
	b.Run("delete", func(b *testing.B) {
		key := benchName(b)
		for b.Loop() {
			if _, err := c.Put(ctx, key, ""); err != nil {
				b.Fatalf("Put: %v", err)
			}
			if _, err := c.Delete(ctx, key); err != nil {
				b.Fatalf("Delete: %v", err)
			}
		}
	})
	b.Run("fenced-delete", func(b *testing.B) {
		key := benchName(b)
		for b.Loop() {
			put, err := c.Put(ctx, key, "")
			if err != nil {
				b.Fatalf("Put: %v", err)
			}
			resp, err := c.Txn(ctx).
				If(clientv3.Compare(clientv3.CreateRevision(key), "=", put.Header.Revision)).
				Then(clientv3.OpDelete(key)).
				Commit()
			if err != nil || !resp.Succeeded {
				b.Fatalf("fenced delete: succeeded %v, err %v; want true, nil", resp != nil && resp.Succeeded, err)
			}
		}
	})
}

// BenchmarkRelock: the goroutine that holds the lock locks it again and
// unlocks. Upstream has no reentrancy (a second Lock on the same Session
// returns at once, and one Unlock frees it for everyone), so there is no
// upstream half.
func BenchmarkRelock(b *testing.B) {
	e := startBench(b)
	b.Run("etcdlock", func(b *testing.B) {
		m := etcdlock.NewMutex(benchSession(b, e.client(b)), benchName(b))
		ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
		defer cancel()
		if err := m.LockContext(ctx); err != nil {
			b.Fatalf("LockContext: %v", err)
		}
		mt := e.startMeter(b)
		for b.Loop() {
			if err := m.LockContext(ctx); err != nil {
				b.Fatalf("re-lock: %v", err)
			}
			if err := m.UnlockContext(ctx); err != nil {
				b.Fatalf("unlock of the re-lock: %v", err)
			}
		}
		b.StopTimer()
		mt.report(b, b.N)
		if got := m.HoldCount(); got != 1 {
			b.Fatalf("HoldCount after the loop: got %d, want 1", got)
		}
		if err := m.UnlockContext(ctx); err != nil {
			b.Fatalf("UnlockContext: %v", err)
		}
	})
}

// BenchmarkTryLockHeld: TryLock on a lock that another Session holds, on a
// client of its own. Every try must fail.
func BenchmarkTryLockHeld(b *testing.B) {
	e := startBench(b)
	b.Run("etcdlock", func(b *testing.B) {
		ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
		defer cancel()
		name := benchName(b)
		holder := etcdlock.NewMutex(benchSession(b, e.plain), name)
		if err := holder.LockContext(ctx); err != nil {
			b.Fatalf("holder LockContext: %v", err)
		}
		m := etcdlock.NewMutex(benchSession(b, e.client(b)), name)
		mt := e.startMeter(b)
		for b.Loop() {
			if m.TryLock() {
				b.Fatal("TryLock took a lock held by another Session")
			}
		}
		b.StopTimer()
		mt.report(b, b.N)
		if err := holder.UnlockContext(ctx); err != nil {
			b.Fatalf("holder UnlockContext: %v", err)
		}
	})
	b.Run("upstream", func(b *testing.B) {
		ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
		defer cancel()
		name := benchName(b)
		holder := concurrency.NewMutex(benchUpstreamSession(b, e.plain, etcdlock.DefaultTTL), name)
		if err := holder.Lock(ctx); err != nil {
			b.Fatalf("holder Lock: %v", err)
		}
		m := concurrency.NewMutex(benchUpstreamSession(b, e.client(b), etcdlock.DefaultTTL), name)
		mt := e.startMeter(b)
		for b.Loop() {
			if err := m.TryLock(ctx); !errors.Is(err, concurrency.ErrLocked) {
				b.Fatalf("TryLock on a lock held by another Session: got %v, want %v", err, concurrency.ErrLocked)
			}
		}
		b.StopTimer()
		mt.report(b, b.N)
		if err := holder.Unlock(ctx); err != nil {
			b.Fatalf("holder Unlock: %v", err)
		}
	})
}

// BenchmarkTryLockFree: TryLock on a free lock, then UnlockContext (upstream:
// TryLock(ctx) and Unlock(ctx)). One op is the pair; rpcs/op counts both.
func BenchmarkTryLockFree(b *testing.B) {
	e := startBench(b)
	b.Run("etcdlock", func(b *testing.B) {
		ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
		defer cancel()
		m := etcdlock.NewMutex(benchSession(b, e.client(b)), benchName(b))
		mt := e.startMeter(b)
		for b.Loop() {
			if !m.TryLock() {
				b.Fatal("TryLock of a free lock: got false")
			}
			if err := m.UnlockContext(ctx); err != nil {
				b.Fatalf("UnlockContext: %v", err)
			}
		}
		b.StopTimer()
		mt.report(b, b.N)
	})
	b.Run("upstream", func(b *testing.B) {
		ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
		defer cancel()
		m := concurrency.NewMutex(benchUpstreamSession(b, e.client(b), etcdlock.DefaultTTL), benchName(b))
		mt := e.startMeter(b)
		for b.Loop() {
			if err := m.TryLock(ctx); err != nil {
				b.Fatalf("TryLock of a free lock: %v", err)
			}
			if err := m.Unlock(ctx); err != nil {
				b.Fatalf("Unlock: %v", err)
			}
		}
		b.StopTimer()
		mt.report(b, b.N)
	})
}

// benchCounts are the numbers of holders or locks of the scaling benchmarks.
