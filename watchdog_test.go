package etcdlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// TestWatchdogLead: a leader's f that stops reporting progress has its
// context cancelled no earlier than the period after its last report, and
// Lead leads again with a new token, as etcd shows; one that keeps reporting
// keeps the lead.
func TestWatchdogLead(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	// Reports come every period/6: a scheduling stall of a loaded machine
	// must stay well below the period for the lead to be kept.
	const period = time.Second
	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	name := lockName(t)
	var tokens []int64
	var lastReport, cancelled time.Time
	err := etcdlock.Lead(ctx, client, name, func(ctx context.Context) error {
		h, _ := etcdlock.HoldFrom(ctx)
		tokens = append(tokens, h.Token)
		if len(tokens) == 2 {
			if e := entryOf(t, client, name, h.Lease); !e.Holds || e.Token != h.Token {
				t.Errorf("etcd's holder in the second term: %+v, want token %d", e, h.Token)
			}
			cancel()
			return nil
		}
		// Reports for 3 periods: the lead is kept.
		for end := time.Now().Add(3 * period); time.Now().Before(end); time.Sleep(period / 6) {
			lastReport = time.Now() // no later than the report
			etcdlock.Progress(ctx)
			if ctx.Err() != nil {
				t.Errorf("f's context cancelled while it reported progress")
			}
		}
		<-ctx.Done()
		cancelled = time.Now()
		return ctx.Err()
	}, etcdlock.WithTTL(5*time.Second), etcdlock.WithWatchdog(period))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Lead: got %v, want context.Canceled", err)
	}
	if len(tokens) != 2 || tokens[1] <= tokens[0] {
		t.Fatalf("tokens of the terms: got %v, want two, increasing", tokens)
	}
	idle := cancelled.Sub(lastReport)
	if idle < period {
		t.Fatalf("f's context cancelled %v after its last report, before the period %v", idle, period)
	}
	checkBound(t, "the watchdog's cancel after the last report", idle, 2*period+time.Second)
}

// TestWatchdogHung: an f that does not return after its context is
// cancelled has its Session closed: etcd has neither the lease nor the key,
// another process leads, and Lead returns ErrStalled once f returns.
func TestWatchdogHung(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	const period = 300 * time.Millisecond
	ctx := testContext(t)
	name := lockName(t)
	held := make(chan etcdlock.Hold, 1)
	release := make(chan struct{})
	led := result(func() error {
		return etcdlock.Lead(ctx, client, name, func(ctx context.Context) error {
			h, _ := etcdlock.HoldFrom(ctx)
			held <- h
			<-release // ignores its context
			return nil
		}, etcdlock.WithTTL(5*time.Second), etcdlock.WithWatchdog(period))
	})
	h := <-held
	other := etcdlock.NewMutex(newSession(t, client), name)
	if err := other.LockContext(ctx); err != nil {
		t.Fatalf("another process's lock, f hung: %v", err)
	}
	if leaseAlive(t, client, h.Lease) {
		t.Fatalf("etcd still has the hung leader's lease")
	}
	if keys := lockKeys(t, client, name); len(keys) != 1 || keys[0] != other.Key() {
		t.Fatalf("keys: got %v, want only the new holder's", keys)
	}
	close(release)
	if err := waitErr(t, led); !errors.Is(err, etcdlock.ErrStalled) {
		t.Fatalf("Lead once f returned: got %v, want ErrStalled", err)
	}
	if err := other.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestWatchdogDo: Do returns ErrStalled and releases the lock; bad periods
// are refused before anything is written; Progress outside a scope does
// nothing.
func TestWatchdogDo(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	m := etcdlock.NewMutex(newSession(t, client, etcdlock.WithWatchdog(200*time.Millisecond)), name)
	err := m.Do(ctx, func(ctx context.Context) error {
		<-ctx.Done()
		return ctx.Err()
	})
	if !errors.Is(err, etcdlock.ErrStalled) {
		t.Fatalf("Do without progress: got %v, want ErrStalled", err)
	}
	if keys := lockKeys(t, client, name); len(keys) > 0 {
		t.Fatalf("keys after a stalled Do: got %v, want none", keys)
	}
	etcdlock.Progress(ctx)
	var nilCtx context.Context // a nil context is no scope
	etcdlock.Progress(nilCtx)

	before := revision(t, client)
	for _, d := range []time.Duration{0, -time.Second} {
		if _, err := etcdlock.NewSession(client, etcdlock.WithWatchdog(d)); !errors.Is(err, etcdlock.ErrInvalidArgument) {
			t.Errorf("NewSession WithWatchdog(%v): got %v, want ErrInvalidArgument", d, err)
		}
		ran := false
		err := etcdlock.Lead(ctx, client, name, func(context.Context) error { ran = true; return nil }, etcdlock.WithWatchdog(d))
		if !errors.Is(err, etcdlock.ErrInvalidArgument) || ran {
			t.Errorf("Lead WithWatchdog(%v): got %v (f ran: %v), want ErrInvalidArgument", d, err, ran)
		}
	}
	if w := wroteSince(t, client, before); len(w) > 0 {
		t.Fatalf("writes after bad input: %v", w)
	}
}
