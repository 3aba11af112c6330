package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// eventLog is an Observer that keeps every event.
type eventLog struct {
	mu     sync.Mutex
	events []etcdlock.Event
}

func (l *eventLog) Observe(e etcdlock.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

// find returns the events that match.
func (l *eventLog) find(match func(etcdlock.Event) bool) []etcdlock.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []etcdlock.Event
	for _, e := range l.events {
		if match(e) {
			out = append(out, e)
		}
	}
	return out
}

// wait waits for an event that matches, and returns it.
func (l *eventLog) wait(t *testing.T, what string, match func(etcdlock.Event) bool) etcdlock.Event {
	t.Helper()
	var found []etcdlock.Event
	eventually(t, what, func() bool {
		found = l.find(match)
		return len(found) > 0
	})
	return found[len(found)-1]
}

func ended(lock string, o etcdlock.Outcome) func(etcdlock.Event) bool {
	return func(e etcdlock.Event) bool {
		return e.Kind == etcdlock.AcquireEnded && e.Lock == lock && e.Outcome == o
	}
}

// TestObserverEvents: every kind of event, with its fields, for each
// primitive.
func TestObserverEvents(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	var log eventLog
	s := newSession(t, client, etcdlock.WithObserver(&log), etcdlock.WithTTL(2*time.Second))
	other := newSession(t, client)

	t.Run("Mutex", func(t *testing.T) {
		name := lockName(t)
		m := etcdlock.NewMutex(s, name)
		if err := m.LockContext(ctx); err != nil {
			t.Fatal(err)
		}
		token := m.Token()
		time.Sleep(10 * time.Millisecond)
		if err := m.UnlockContext(ctx); err != nil {
			t.Fatal(err)
		}
		e := log.wait(t, "acquired", ended(name, etcdlock.OutcomeAcquired))
		if e.Primitive != etcdlock.KindMutex || e.Token != token || e.Key != m.Key() && e.Key == "" || e.Contended || e.Wait <= 0 {
			t.Errorf("AcquireEnded: got %+v, want mutex, token %d, uncontended, a wait", e, token)
		}
		if n := len(log.find(func(e etcdlock.Event) bool { return e.Kind == etcdlock.AcquireStarted && e.Lock == name })); n != 1 {
			t.Errorf("AcquireStarted events: got %d, want 1", n)
		}
		h := log.wait(t, "hold ended", func(e etcdlock.Event) bool { return e.Kind == etcdlock.HoldEnded && e.Lock == name })
		if h.HeldFor < 10*time.Millisecond || h.Token != token {
			t.Errorf("HoldEnded: got %+v, want Held ≥ 10ms, token %d", h, token)
		}
		r := log.wait(t, "released", func(e etcdlock.Event) bool { return e.Kind == etcdlock.Released && e.Lock == name })
		if r.Err != nil || r.FencedMiss {
			t.Errorf("Released: got %+v, want no error, no miss", r)
		}

		// Busy, timed out, cancelled, contended.
		holder := etcdlock.NewMutex(other, name)
		if err := holder.LockContext(ctx); err != nil {
			t.Fatal(err)
		}
		if m.TryLock() {
			t.Fatal("TryLock on a held lock: got true")
		}
		log.wait(t, "busy", ended(name, etcdlock.OutcomeBusy))
		if ok, _ := m.TryLockFor(ctx, 50*time.Millisecond); ok {
			t.Fatal("TryLockFor on a held lock: got true")
		}
		log.wait(t, "timed out", ended(name, etcdlock.OutcomeTimedOut))
		cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		if err := m.LockContext(cctx); err == nil {
			t.Fatal("LockContext on a held lock: got nil")
		}
		log.wait(t, "canceled", ended(name, etcdlock.OutcomeCanceled))
		w := lockInGoroutine(t, ctx, ours{m})
		eventually(t, "the waiter queued", func() bool { return len(lockKeys(t, client, name)) == 2 })
		if err := holder.UnlockContext(ctx); err != nil {
			t.Fatal(err)
		}
		if err := waitErr(t, w.locked); err != nil {
			t.Fatal(err)
		}
		log.wait(t, "an acquisition after a wait, contended", func(e etcdlock.Event) bool {
			return ended(name, etcdlock.OutcomeAcquired)(e) && e.Contended
		})

		// A loss, seen by the loss watch, and the release of the lost hold.
		done := m.Done()
		if _, err := client.Delete(ctx, keyOf(name, s.Lease())); err != nil {
			t.Fatal(err)
		}
		<-done
		if e := log.wait(t, "lost", func(e etcdlock.Event) bool { return e.Kind == etcdlock.HoldLost && e.Lock == name }); e.Reason != etcdlock.LossKeyDeleted {
			t.Errorf("HoldLost: got %+v, want key_deleted", e)
		}
		if err := w.Release(); !errors.Is(err, etcdlock.ErrLockLost) {
			t.Fatalf("release of the lost hold: got %v, want ErrLockLost", err)
		}
		log.wait(t, "fenced miss", func(e etcdlock.Event) bool { return e.Kind == etcdlock.Released && e.Lock == name && e.FencedMiss })
	})

	t.Run("RWMutex and Semaphore", func(t *testing.T) {
		name := lockName(t)
		rw := etcdlock.NewRWMutex(s, name)
		rw.RLock()
		if rw.HoldCount() != 1 {
			t.Errorf("HoldCount after RLock: got %d, want 1", rw.HoldCount())
		}
		rw.RUnlock()
		rw.Lock()
		if rw.HoldCount() != 1 {
			t.Errorf("HoldCount after Lock: got %d, want 1", rw.HoldCount())
		}
		rw.Unlock()
		p, err := etcdlock.NewSemaphore(s, name+"-sem", 2).Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
		for lock, kind := range map[string]etcdlock.Kind{name: etcdlock.KindRead, name + " ": etcdlock.KindWrite, name + "-sem": etcdlock.KindSemaphore} {
			lock = strings.TrimSpace(lock)
			log.wait(t, string(kind)+" acquired", func(e etcdlock.Event) bool {
				return e.Kind == etcdlock.AcquireEnded && e.Lock == lock && e.Primitive == kind && e.Outcome == etcdlock.OutcomeAcquired
			})
			log.wait(t, string(kind)+" released", func(e etcdlock.Event) bool {
				return e.Kind == etcdlock.HoldEnded && e.Lock == lock && e.Primitive == kind
			})
		}
	})

	t.Run("keep-alive", func(t *testing.T) {
		e := log.wait(t, "a keep-alive", func(e etcdlock.Event) bool { return e.Kind == etcdlock.KeptAlive })
		if e.Err != nil || e.RTT <= 0 || e.Margin <= 0 || e.Margin > 2*time.Second {
			t.Errorf("KeptAlive: got %+v, want a round trip and a margin in (0, TTL]", e)
		}
	})
}

// TestObserverEventContext: an event of a lock call carries the call's
// context (what a trace's span of it needs): AcquireStarted and
// AcquireEnded the call's, HoldEnded and HoldLost the acquiring call's;
// a keep-alive's carries none.
func TestObserverEventContext(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	var log eventLog
	s := newSession(t, client, etcdlock.WithObserver(&log), etcdlock.WithTTL(2*time.Second))
	type key struct{}
	name := lockName(t)
	m := etcdlock.NewMutex(s, name)
	lockCtx := context.WithValue(testContext(t), key{}, "lock")
	if err := m.LockContext(lockCtx); err != nil {
		t.Fatal(err)
	}
	if err := m.UnlockContext(context.WithValue(testContext(t), key{}, "unlock")); err != nil {
		t.Fatal(err)
	}
	lost := etcdlock.NewMutex(s, name+"/lost")
	if err := lost.LockContext(context.WithValue(testContext(t), key{}, "lost")); err != nil {
		t.Fatal(err)
	}
	_ = lost.Done()
	if _, err := client.Delete(testContext(t), lost.Key()); err != nil {
		t.Fatal(err)
	}
	log.wait(t, "the loss", func(e etcdlock.Event) bool { return e.Kind == etcdlock.HoldLost })
	log.wait(t, "a keep-alive", func(e etcdlock.Event) bool { return e.Kind == etcdlock.KeptAlive })
	for _, e := range log.find(func(etcdlock.Event) bool { return true }) {
		var want any
		switch {
		case e.Kind == etcdlock.HoldLost:
			want = "lost"
		case e.Kind == etcdlock.AcquireStarted, e.Kind == etcdlock.AcquireEnded, e.Kind == etcdlock.HoldEnded:
			want = map[string]any{name: "lock", name + "/lost": "lost"}[e.Lock]
		}
		var got any
		if e.Context != nil {
			got = e.Context.Value(key{})
		}
		if (want == nil) != (e.Context == nil) || got != want {
			t.Errorf("%s of %q: the context's value got %v (context %v), want %v", e.Kind, e.Lock, got, e.Context != nil, want)
		}
	}
}

// TestObserverLossReasons: HoldLost says why the hold was lost, for each
// way of losing it.
func TestObserverLossReasons(t *testing.T) {
	testflags.Parallel(t)
	healthy, proxied, proxy := startProxied(t)
	defer proxy.Unblackhole()
	ctx := testContext(t)
	// lose takes a hold on s, has cause end it, and checks the reason.
	lose := func(t *testing.T, s *etcdlock.Session, log *eventLog, cause func(key string), want etcdlock.LossReason) {
		t.Helper()
		name := lockName(t)
		m := etcdlock.NewMutex(s, name)
		if err := m.LockContext(ctx); err != nil {
			t.Fatal(err)
		}
		done := m.Done()
		cause(m.Key())
		if _, ok := closedWithin(done, testTimeout); !ok {
			t.Fatal("Done still open")
		}
		e := log.wait(t, "HoldLost", func(e etcdlock.Event) bool { return e.Kind == etcdlock.HoldLost && e.Lock == name })
		if e.Reason != want {
			t.Errorf("HoldLost: got reason %q, want %q", e.Reason, want)
		}
		if e.Key != m.Key() || e.Token != m.Token() || e.Lease != s.Lease() {
			t.Errorf("HoldLost: got key %q, token %d, lease %x; want %q, %d, %x", e.Key, e.Token, e.Lease, m.Key(), m.Token(), s.Lease())
		}
	}
	observed := func(t *testing.T, client *clientv3.Client, opts ...etcdlock.SessionOption) (*etcdlock.Session, *eventLog) {
		log := &eventLog{}
		return newSession(t, client, append(opts, etcdlock.WithObserver(log))...), log
	}

	t.Run("key deleted by hand", func(t *testing.T) {
		s, log := observed(t, healthy)
		lose(t, s, log, func(key string) {
			if _, err := healthy.Delete(ctx, key); err != nil {
				t.Fatal(err)
			}
		}, etcdlock.LossKeyDeleted)
	})
	t.Run("lease revoked by another client", func(t *testing.T) {
		s, log := observed(t, healthy)
		lose(t, s, log, func(string) {
			if _, err := healthy.Revoke(ctx, s.Lease()); err != nil {
				t.Fatal(err)
			}
		}, etcdlock.LossLeaseGone)
	})
	t.Run("keep-alives silent", func(t *testing.T) {
		s, log := observed(t, proxied, etcdlock.WithTTL(2*time.Second))
		log.wait(t, "a keep-alive acknowledged", func(e etcdlock.Event) bool { return e.Kind == etcdlock.KeptAlive && e.Err == nil })
		lose(t, s, log, func(string) { proxy.Blackhole() }, etcdlock.LossKeepAliveSilent)
		proxy.Unblackhole()
	})
	t.Run("Session closed", func(t *testing.T) {
		s, log := observed(t, healthy)
		lose(t, s, log, func(string) { _ = s.Close() }, etcdlock.LossSessionClosed)
	})
	t.Run("WithContext ended", func(t *testing.T) {
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		s, log := observed(t, healthy, etcdlock.WithContext(sctx))
		lose(t, s, log, func(string) { cancel() }, etcdlock.LossSessionClosed)
	})
}

// TestObserverLossBeforeEnd: a holder that unlocks as soon as Done closes
// ends its hold while the loss's report may still be asking etcd whether
// the lease went too. HoldLost still comes before HoldEnded and Released,
// with the loss's reason, also when the Session closes right after: an
// adapter that ends a hold's span at HoldEnded would otherwise record a
// lost hold as a clean one, and the reason said the Session's close had
// caused a loss found before it.
func TestObserverLossBeforeEnd(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	for i := range 5 {
		log := &eventLog{}
		s := newSession(t, client, etcdlock.WithObserver(log))
		name := fmt.Sprintf("%s-%d", lockName(t), i)
		lockLoseUnlock(t, ctx, client, etcdlock.NewMutex(s, name))
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		var kinds []string
		for _, e := range log.find(func(e etcdlock.Event) bool { return e.Lock == name }) {
			switch e.Kind {
			case etcdlock.HoldLost:
				kinds = append(kinds, fmt.Sprintf("%s(%s)", e.Kind, e.Reason))
			case etcdlock.HoldEnded, etcdlock.Released:
				kinds = append(kinds, string(e.Kind))
			}
		}
		want := []string{"hold_lost(key_deleted)", "hold_ended", "released"}
		if fmt.Sprint(kinds) != fmt.Sprint(want) {
			t.Errorf("try %d: the hold's last events: got %v, want %v", i+1, kinds, want)
		}
	}
}

// lockLoseUnlock locks m, deletes its key by hand, waits for its Done, and
// unlocks it at once, which must say ErrLockLost.
func lockLoseUnlock(t *testing.T, ctx context.Context, client *clientv3.Client, m *etcdlock.Mutex) {
	t.Helper()
	if err := m.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	done := m.Done()
	if _, err := client.Delete(ctx, m.Key()); err != nil {
		t.Fatal(err)
	}
	<-done
	if err := m.UnlockContext(ctx); !errors.Is(err, etcdlock.ErrLockLost) {
		t.Fatalf("unlock of the lost hold: got %v, want ErrLockLost", err)
	}
}

// blockingObserver blocks in Observe until released.
type blockingObserver struct {
	release chan struct{}
	log     eventLog
}

func (o *blockingObserver) Observe(e etcdlock.Event) {
	<-o.release
	o.log.Observe(e)
}

// TestObserverNeverBlocks: an Observer that does not return delays no lock
// call; the events it could not take are dropped, and counted.
func TestObserverNeverBlocks(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	// 400 pairs: seconds alone, a minute and more on a loaded machine under
	// -race. The bound is the test's: generous.
	ctx, cancel := context.WithTimeout(context.Background(), 4*testTimeout)
	defer cancel()
	o := &blockingObserver{release: make(chan struct{})}
	// A TTL long enough that no keep-alive (every TTL/4) falls in the run:
	// a KeptAlive dropped with the rest would count among the dropped, and
	// the run takes 15 s and more under -race beside other tests.
	s := newSession(t, client, etcdlock.WithObserver(o), etcdlock.WithTTL(20*time.Minute))
	// Close waits for the observer: release it first, also when the test
	// fails before it does (cleanups run last registered first).
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(o.release) }) }
	t.Cleanup(release)
	m := etcdlock.NewMutex(s, lockName(t))
	const pairs = 400 // 4 events each: more than the 1,024 the queue keeps
	for range pairs {
		if err := m.LockContext(ctx); err != nil {
			t.Fatal(err)
		}
		if err := m.UnlockContext(ctx); err != nil {
			t.Fatal(err)
		}
	}
	release()
	if err := s.Close(); err != nil { // delivers what is queued
		t.Fatal(err)
	}
	dropped := 0
	for _, e := range o.log.find(func(e etcdlock.Event) bool { return e.Kind == etcdlock.EventsDropped }) {
		dropped += e.Dropped
	}
	got := len(o.log.find(func(e etcdlock.Event) bool {
		return e.Kind != etcdlock.EventsDropped && e.Kind != etcdlock.KeptAlive && e.Kind != etcdlock.SessionClosed
	}))
	if dropped <= 0 || got+dropped != 4*pairs {
		t.Errorf("events delivered %d + dropped %d: want %d in all, some dropped", got, dropped, 4*pairs)
	}
	t.Logf("%d lock/unlock pairs with a stuck observer: %d events delivered, %d dropped", pairs, got, dropped)
}

// recordHandler is a slog.Handler that keeps every record.
type recordHandler struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r)
	return nil
}
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordHandler) WithGroup(string) slog.Handler      { return h }

// find returns the records with msg, rendered with their attributes.
func (h *recordHandler) find(msg string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range h.records {
		if !strings.Contains(r.Message, msg) {
			continue
		}
		line := fmt.Sprintf("%s %s", r.Level, r.Message)
		r.Attrs(func(a slog.Attr) bool {
			line += " " + a.String()
			return true
		})
		out = append(out, line)
	}
	return out
}

// TestWithLogger: a loss logs at Warn with the lock's name, key and token;
// acquisitions at Debug; the Session's identity is never logged.
func TestWithLogger(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	var h recordHandler
	s := newSession(t, client, etcdlock.WithLogger(slog.New(&h)), etcdlock.WithIdentity("host-a secret-looking"))
	name := lockName(t)
	m := etcdlock.NewMutex(s, name)
	lockLoseUnlock(t, ctx, client, m)
	var lost []string
	eventually(t, "the loss logged", func() bool { lost = h.find("hold lost"); return len(lost) == 1 })
	want := fmt.Sprintf("WARN etcdlock: hold lost lock=%s primitive=mutex key=%s/%x token=", name, name, s.Lease())
	if !strings.HasPrefix(lost[0], want) || !strings.HasSuffix(lost[0], "reason=key_deleted") {
		t.Errorf("log of the loss: got %q, want %q…reason=key_deleted", lost[0], want)
	}
	var got []string
	eventually(t, "the release logged", func() bool { got = h.find("already lost"); return len(got) == 1 })
	if !strings.HasPrefix(got[0], "WARN") {
		t.Errorf("log of the release of a lost hold: got %q, want it at WARN", got)
	}
	if got := h.find("acquire ended"); len(got) != 1 || !strings.HasPrefix(got[0], "DEBUG") {
		t.Errorf("log of the acquisition: got %q, want one at DEBUG", got)
	}
	for _, line := range h.find("") {
		if strings.Contains(line, "secret-looking") {
			t.Errorf("the identity was logged: %q", line)
		}
	}
	if _, err := etcdlock.NewSession(client, etcdlock.WithLogger(nil)); !errors.Is(err, etcdlock.ErrInvalidArgument) {
		t.Errorf("WithLogger(nil): got %v, want ErrInvalidArgument", err)
	}
	if _, err := etcdlock.NewSession(client, etcdlock.WithObserver(nil)); !errors.Is(err, etcdlock.ErrInvalidArgument) {
		t.Errorf("WithObserver(nil): got %v, want ErrInvalidArgument", err)
	}
}

// TestObserverWithContextEnd: a Session ended by its WithContext context,
// never closed, stops as Close stops it: its observers get SessionClosed and
// its delivery goroutine ends (goleak checks that at the end of the tests).
func TestObserverWithContextEnd(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	sctx, cancel := context.WithCancel(testContext(t))
	log := &eventLog{}
	s, err := etcdlock.NewSession(client, etcdlock.WithContext(sctx), etcdlock.WithObserver(log))
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	log.wait(t, "SessionClosed", func(e etcdlock.Event) bool { return e.Kind == etcdlock.SessionClosed && e.Lease == s.Lease() })
	if err := s.Close(); err != nil {
		t.Errorf("Close after the context ended: got %v, want nil (the revoke's result)", err)
	}
}

// closingObserver shuts its Session down from inside Observe on the first
// HoldLost, and reports what Close returned.
type closingObserver struct {
	s      atomic.Pointer[etcdlock.Session]
	once   sync.Once
	closed chan error
	log    eventLog
}

func (o *closingObserver) Observe(e etcdlock.Event) {
	o.log.Observe(e)
	if e.Kind == etcdlock.HoldLost {
		o.once.Do(func() { o.closed <- o.s.Load().Close() })
	}
}

// TestObserverMayClose: Session.Close called from inside an Observer
// returns within 5 s, whatever ended the hold, also while another Close (or
// the end of the WithContext context) is under way; the Session is closed
// after it, and delivery goes on after the Observer returns, to
// SessionClosed.
func TestObserverMayClose(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	const bound = 5 * time.Second
	for _, tc := range []struct {
		name  string
		cause func(t *testing.T, s *etcdlock.Session, key string, cancel context.CancelFunc) <-chan error
	}{
		{"key deleted", func(t *testing.T, _ *etcdlock.Session, key string, _ context.CancelFunc) <-chan error {
			if _, err := client.Delete(testContext(t), key); err != nil {
				t.Fatal(err)
			}
			return nil
		}},
		{"Close under way", func(_ *testing.T, s *etcdlock.Session, _ string, _ context.CancelFunc) <-chan error {
			return result(s.Close)
		}},
		{"WithContext ended", func(_ *testing.T, _ *etcdlock.Session, _ string, cancel context.CancelFunc) <-chan error {
			cancel()
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sctx, cancel := context.WithCancel(testContext(t))
			defer cancel()
			o := &closingObserver{closed: make(chan error, 1)}
			// No Close by t.Cleanup: where Close deadlocks, it would hang the test.
			s, err := etcdlock.NewSession(client, etcdlock.WithObserver(o), etcdlock.WithContext(sctx))
			if err != nil {
				t.Fatal(err)
			}
			o.s.Store(s)
			m := etcdlock.NewMutex(s, lockName(t))
			if err := m.LockContext(testContext(t)); err != nil {
				t.Fatal(err)
			}
			_ = m.Done() // watch the hold, so that its loss is reported
			outer := tc.cause(t, s, m.Key(), cancel)

			select {
			case err := <-o.closed:
				if err != nil {
					t.Errorf("Close from inside the Observer: got %v, want nil", err)
				}
			case <-time.After(bound):
				t.Fatalf("Close from inside the Observer: not returned within %v", bound)
			}
			if outer != nil {
				select {
				case err := <-outer:
					if err != nil {
						t.Errorf("the Close under way: got %v, want nil", err)
					}
				case <-time.After(bound):
					t.Fatalf("the Close under way, with the Observer's: not returned within %v", bound)
				}
			}
			if !isClosed(s.Done()) {
				t.Error("Session's Done after Close: open, want closed")
			}
			if leaseAlive(t, client, s.Lease()) {
				t.Errorf("lease %x after Close: alive, want revoked", s.Lease())
			}
			o.log.wait(t, "SessionClosed, after the Observer's Close", func(e etcdlock.Event) bool { return e.Kind == etcdlock.SessionClosed })
			if err := s.Close(); err != nil {
				t.Errorf("Close after the Observer's: got %v, want nil", err)
			}
		})
	}
}
