package etcdlock_test

// Benchmarks of holders that contend (bench_test.go has the harness and
// its metrics): Sessions of their own, goroutines of one process, and
// goroutines on locks of their own; the hand-off and the keys a run left.

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdlock/etcdlock"
)

var benchCounts = []int{2, 8, 32}

// benchHandoffs is the WithLocalHandoff bound of BenchmarkOneProcess's
// hand-off variant: at most 8 local holds in a row keep the key.
const benchHandoffs = 8

// BenchmarkContended: n Sessions, each on a client of its own as separate
// processes would be, take turns on one lock. One op is one acquisition.
func BenchmarkContended(b *testing.B) {
	for _, n := range benchCounts {
		b.Run(fmt.Sprintf("sessions=%d", n), func(b *testing.B) {
			forEachImpl(b, startBench(b), benchSessions(n))
		})
	}
}

// benchSessions returns the body of BenchmarkContended for n sessions.
func benchSessions(n int) func(b *testing.B, e *benchServer, impl benchImpl) {
	return func(b *testing.B, e *benchServer, impl benchImpl) {
		name := benchName(b)
		lockers := make([]benchLocker, n)
		for i := range lockers {
			lockers[i] = impl.newSession(b, e.client(b))(name)
		}
		benchContend(b, e, name, lockers, benchOneLock)
	}
}

// BenchmarkOneProcess: n goroutines of one process, on one client, take
// turns on one lock. etcdlock: one Session and one Mutex shared by all, with
// the default Session, and with WithLocalHandoff(benchHandoffs). Upstream: a
// Session per goroutine, since goroutines sharing a Session all hold the
// lock at once (D1). One op is one acquisition.
func BenchmarkOneProcess(b *testing.B) {
	etcdlockRun := func(e *benchServer, n int, opts ...etcdlock.SessionOption) func(b *testing.B) {
		return func(b *testing.B) {
			m := etcdlock.NewMutex(benchSession(b, e.client(b), opts...), benchName(b))
			lockers := make([]benchLocker, n)
			for i := range lockers {
				lockers[i] = etcdlockLocker{m}
			}
			benchContend(b, e, benchName(b), lockers, benchOneLock)
		}
	}
	for _, n := range benchCounts {
		b.Run(fmt.Sprintf("goroutines=%d", n), func(b *testing.B) {
			e := startBench(b)
			b.Run("etcdlock", etcdlockRun(e, n))
			b.Run(fmt.Sprintf("etcdlock-handoff%d", benchHandoffs), etcdlockRun(e, n, etcdlock.WithLocalHandoff(benchHandoffs)))
			b.Run("upstream", func(b *testing.B) {
				c, name := e.client(b), benchName(b)
				lockers := make([]benchLocker, n)
				for i := range lockers {
					lockers[i] = concurrency.NewMutex(benchUpstreamSession(b, c, etcdlock.DefaultTTL), name)
				}
				benchContend(b, e, benchName(b), lockers, benchOneLock)
			})
		})
	}
}

// BenchmarkIndependent: n goroutines of one process, on one client and one
// Session, each lock and unlock a lock of their own. One op is one lock and
// unlock pair.
func BenchmarkIndependent(b *testing.B) {
	for _, n := range append([]int{1}, benchCounts[1:]...) {
		b.Run(fmt.Sprintf("locks=%d", n), func(b *testing.B) {
			forEachImpl(b, startBench(b), func(b *testing.B, e *benchServer, impl benchImpl) {
				newLocker, name := impl.newSession(b, e.client(b)), benchName(b)
				lockers := make([]benchLocker, n)
				for i := range lockers {
					lockers[i] = newLocker(fmt.Sprintf("%s-%d", name, i))
				}
				benchContend(b, e, name, lockers, benchIndependent)
			})
		})
	}
}

// How the lockers of benchContend contend.
type benchContention int

const (
	// benchOneLock: the lockers take turns on one lock. Each joins the
	// queue when its goroutine starts, and leaves once b.N acquisitions
	// have been claimed.
	benchOneLock benchContention = iota
	// benchIndependent: each locker has a lock of its own.
	benchIndependent
	// benchQueued: one lock, and every locker waits in its queue before the
	// clock starts: the first holds the lock until each of the others has a
	// key under its prefix and a watch (waitQueue). The clock stops at the
	// b.N-th acquisition, which also cancels the others' waits, so the
	// queue stays full for the whole run whatever b.N is. writes/op and
	// max-keys are not reported; leftover-keys is the number of keys the
	// cancelled waits left under the prefix (deleted before the next run).
	benchQueued
)

// benchContend runs each locker in a goroutine of its own, lock then unlock
// in a loop, b.N acquisitions in all, and reports acq/s. It fails if two
// holders of one lock overlap. Unless independent, the lockers are holders of
// the lock name: it then also reports the hand-off percentiles and, for
// benchOneLock, the most keys the lock had at once.
func benchContend(b *testing.B, e *benchServer, name string, lockers []benchLocker, how benchContention) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e.callTimeout())
	defer cancel()
	// runCtx is the lock calls' context: a failure ends it, and so does the
	// last acquisition of a queued run.
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	// Each locker's lock calls have a context of their own, so that the
	// waits of a queued run can be ended a batch at a time (queueBatch).
	lockCtx := make([]context.Context, len(lockers))
	stopLock := make([]context.CancelFunc, len(lockers))
	for i := range lockers {
		lockCtx[i], stopLock[i] = context.WithCancel(runCtx)
		defer stopLock[i]()
	}
	finished := make(chan struct{})                 // queued: closed at the b.N-th acquisition
	returned := make([]chan struct{}, len(lockers)) // closed when a locker's goroutine ends
	for i := range returned {
		returned[i] = make(chan struct{})
	}
	var keys *benchKeyWatch
	if how == benchOneLock {
		keys = benchWatchKeys(b, e.plain, name)
	}
	queued := how == benchQueued

	var (
		claimed  atomic.Int64                         // acquisitions started (not queued)
		acquired atomic.Int64                         // acquisitions made
		inside   = make([]atomic.Int32, len(lockers)) // holders of each lock
		overlaps atomic.Int64
		prev     atomic.Int64  // id of the last holder to start unlocking; 0: none yet
		unlockAt atomic.Int64  // when it started, in ns since t0
		over     atomic.Bool   // queued: the b.N-th acquisition was made
		end      benchSnapshot // queued: at the b.N-th acquisition
		errOnce  sync.Once
		firstErr error
		wg       sync.WaitGroup
		started  = make(chan struct{}) // closed when the clock starts, after t0 is set
		t0       time.Time
	)
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err })
		stopRun()
	}
	handoffs := make([][]time.Duration, len(lockers))
	run := func(i int, l benchLocker) {
		id, lock := int64(i+1), 0
		if how == benchIndependent {
			lock = i
		}
		for queued || claimed.Add(1) <= int64(b.N) {
			if err := l.Lock(lockCtx[i]); err != nil {
				if !over.Load() {
					fail(fmt.Errorf("holder %d: Lock: %w", id, err))
				}
				return
			}
			// Already closed: no acquisition can be made before the clock
			// starts, but only this receive tells the race detector so.
			<-started
			locked := time.Since(t0)
			n := acquired.Add(1)
			if inside[lock].Add(1) != 1 {
				overlaps.Add(1)
			}
			if p := prev.Load(); how != benchIndependent && p != 0 && p != id && n <= int64(b.N) {
				handoffs[i] = append(handoffs[i], locked-time.Duration(unlockAt.Load()))
			}
			inside[lock].Add(-1)
			if queued && n == int64(b.N) {
				end = e.counts()
				over.Store(true)
				close(finished)
			}
			prev.Store(id)
			unlockAt.Store(int64(time.Since(t0)))
			if err := l.Unlock(ctx); err != nil {
				fail(fmt.Errorf("holder %d: Unlock: %w", id, err))
				return
			}
			if queued && n >= int64(b.N) {
				return
			}
		}
	}

	first := 0 // the lockers started before the clock
	if queued {
		// The first locker holds the lock while the others queue, and its
		// release is the first hand-off.
		holding := make(chan struct{})
		wg.Go(func() {
			defer close(returned[0])
			if err := lockers[0].Lock(lockCtx[0]); err != nil {
				fail(fmt.Errorf("holder 1: Lock: %w", err))
				return
			}
			close(holding)
			<-started
			prev.Store(1)
			unlockAt.Store(int64(time.Since(t0)))
			if err := lockers[0].Unlock(ctx); err != nil {
				fail(fmt.Errorf("holder 1: Unlock: %w", err))
				return
			}
			run(0, lockers[0])
		})
		select {
		case <-holding:
			created := e.created.Load()
			batch := e.queueBatch
			if batch <= 0 {
				batch = len(lockers)
			}
			for i := 1; i < len(lockers); i++ {
				wg.Go(func() { defer close(returned[i]); run(i, lockers[i]) })
				if i%batch != 0 && i < len(lockers)-1 {
					continue
				}
				if err := e.waitQueue(runCtx, name, i+1, created); err != nil {
					fail(fmt.Errorf("waiting for %d sessions to queue for %q: %w", i+1, name, err))
					break
				}
			}
		case <-runCtx.Done():
		}
		first = len(lockers)
	}
	mt := e.startMeter(b)
	b.ResetTimer()
	t0 = time.Now()
	close(started)
	for i := first; i < len(lockers); i++ {
		wg.Go(func() { defer close(returned[i]); run(i, lockers[i]) })
	}
	leftover := 0
	if queued {
		select { // the b.N-th acquisition, or a failure
		case <-finished:
		case <-runCtx.Done():
		}
		b.StopTimer()
		// End the waits, a batch at a time if asked: thousands of waits
		// that end at once each delete their key, and etcd refuses
		// requests once its apply lags 5,000 entries behind.
		if batch := e.queueBatch; batch > 0 && over.Load() {
			for i := range lockers {
				stopLock[i]()
				if (i+1)%batch == 0 || i == len(lockers)-1 {
					for j := i + 1 - min(batch, i%batch+1); j <= i; j++ {
						<-returned[j]
					}
				}
			}
		}
		stopRun()
		wg.Wait() // the waits end at once and should remove their keys
		// A lock call cancelled after etcd applied its put but before the
		// reply came back may leave its key behind (upstream does): the
		// next run would then wait behind it for ever. Count such keys,
		// and delete them.
		resp, err := e.plain.Delete(ctx, name+"/", clientv3.WithPrefix())
		if err != nil {
			b.Fatalf("delete what the cancelled waits left under %q: %v", name+"/", err)
		}
		leftover = int(resp.Deleted)
	} else {
		wg.Wait()
		b.StopTimer()
		end = e.counts()
	}
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	if n := overlaps.Load(); n > 0 {
		b.Fatalf("%d acquisitions overlapped another holder, want 0", n)
	}
	if queued {
		mt.reportUntil(b, b.N, end)
		b.ReportMetric(float64(leftover), "leftover-keys")
	} else {
		mt.report(b, b.N)
	}
	b.ReportMetric(float64(b.N)/end.at.Sub(t0).Seconds(), "acq/s")
	if all := slices.Concat(handoffs...); len(all) > 0 {
		slices.Sort(all)
		for _, q := range []struct {
			q    float64
			unit string
		}{{0.50, "handoff-p50-ms"}, {0.90, "handoff-p90-ms"}, {0.99, "handoff-p99-ms"}, {1, "handoff-max-ms"}} {
			b.ReportMetric(benchPercentile(all, q.q).Seconds()*1e3, q.unit)
		}
	}
	if keys != nil {
		b.ReportMetric(float64(keys.stop(b)), "max-keys")
	}
}

// waitQueue waits until n holders are in the queue of the lock name: n
// keys under its prefix, and a watch confirmed by etcd for each of the n-1
// waiters (watch creations counted from created on), which both libraries
// make to wait for their predecessor. Until then the waiters' first reads
// and watches would still be under way when the clock starts.
func (e *benchServer) waitQueue(ctx context.Context, name string, n int, created int64) error {
	for {
		resp, err := e.plain.Get(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return err
		}
		if resp.Count >= int64(n) && e.created.Load()-created >= int64(n-1) {
			return nil
		}
		t := time.NewTimer(5 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%d keys, %d watches: %w", resp.Count, e.created.Load()-created, ctx.Err())
		case <-t.C:
		}
	}
}

// benchPercentile returns the q-quantile of sorted, by the nearest rank.
func benchPercentile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// A benchKeyWatch counts the keys under a lock's prefix over a run. It
// replays etcd's history of the prefix once the run is over, in revision
// order, so that no watch adds work to the measured part, and returns the
// most keys that existed at once.
type benchKeyWatch struct {
	client *clientv3.Client
	pfx    string
	from   int64 // the revision at the start
	live   map[string]bool
}

func benchWatchKeys(b *testing.B, c *clientv3.Client, name string) *benchKeyWatch {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
	defer cancel()
	pfx := name + "/"
	resp, err := c.Get(ctx, pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		b.Fatalf("get keys of %q: %v", name, err)
	}
	w := &benchKeyWatch{client: c, pfx: pfx, from: resp.Header.Revision, live: make(map[string]bool)}
	for _, kv := range resp.Kvs {
		w.live[string(kv.Key)] = true
	}
	return w
}

// stop replays every change under the prefix since the start, up to a mark
// it puts under the prefix, and returns the most keys seen at once.
func (w *benchKeyWatch) stop(b *testing.B) int {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
	defer cancel()
	end := w.pfx + "end/"
	if _, err := w.client.Put(ctx, end, ""); err != nil {
		b.Fatalf("put %q: %v", end, err)
	}
	defer func() { _, _ = w.client.Delete(ctx, end) }()
	most := len(w.live)
	wch := w.client.Watch(ctx, w.pfx, clientv3.WithPrefix(), clientv3.WithRev(w.from+1))
	for wr := range wch {
		if err := wr.Err(); err != nil {
			b.Fatalf("replay of %q: %v", w.pfx, err)
		}
		for _, ev := range wr.Events {
			key := string(ev.Kv.Key)
			switch {
			case key == end:
				return most
			case ev.Type == clientv3.EventTypePut:
				w.live[key] = true
			default:
				delete(w.live, key)
			}
			most = max(most, len(w.live))
		}
	}
	b.Fatalf("replay of %q: the watch ended before the end mark", w.pfx)
	return 0
}
