package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// describe renders entries as "kind:identity:holds" items, in order.
func describe(entries []etcdlock.QueueEntry) string {
	var parts []string
	for _, e := range entries {
		h := "waits"
		if e.Holds {
			h = "holds"
		}
		parts = append(parts, fmt.Sprintf("%s:%s:%s", e.Kind, e.Identity, h))
	}
	return strings.Join(parts, " ")
}

// inspect calls Inspect and checks what every entry must be: a key of the
// name, tokens ascending among holders and among waiters.
func inspect(t *testing.T, ctx context.Context, client *clientv3.Client, name string) []etcdlock.QueueEntry {
	t.Helper()
	entries, err := etcdlock.Inspect(ctx, client, name)
	if err != nil {
		t.Fatalf("Inspect(%q): %v", name, err)
	}
	for i, e := range entries {
		if !strings.HasPrefix(e.Key, name+"/") || e.Lease == 0 || e.Token <= 0 {
			t.Errorf("entry %d: %+v: want a key of %q with a lease and a token", i, e, name)
		}
		if i > 0 && entries[i-1].Holds == e.Holds && entries[i-1].Token >= e.Token {
			t.Errorf("entries %d, %d: tokens %d, %d out of order", i-1, i, entries[i-1].Token, e.Token)
		}
	}
	return entries
}

// TestInspect: holders first, then waiters in the order they will be
// served, with identities, for every kind of lock; one read, no write.
func TestInspect(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	as := func(id string) *etcdlock.Session { return newSession(t, client, etcdlock.WithIdentity(id)) }

	t.Run("Mutex", func(t *testing.T) {
		name := lockName(t)
		if entries := inspect(t, ctx, client, name); entries == nil || len(entries) != 0 {
			t.Errorf("Inspect of a free lock: got %#v, want an empty slice", entries)
		}
		holder := etcdlock.NewMutex(as("a"), name)
		if err := holder.LockContext(ctx); err != nil {
			t.Fatal(err)
		}
		w := lockInGoroutine(t, ctx, oursOn(as("b"), name))
		eventually(t, "b queued", func() bool { return len(lockKeys(t, client, name)) == 2 })
		up := concurrency.NewMutex(newUpstreamSession(t, client, 60), name)
		upLocked := result(func() error { return up.Lock(ctx) })
		eventually(t, "upstream queued", func() bool { return len(lockKeys(t, client, name)) == 3 })
		before := revision(t, client)
		entries := inspect(t, ctx, client, name)
		if w := wroteSince(t, client, before); len(w) > 0 {
			t.Errorf("writes after Inspect: %v, want none", w)
		}
		if got, want := describe(entries), "mutex:a:holds mutex:b:waits mutex::waits"; got != want {
			t.Errorf("Inspect: got %q, want %q", got, want)
		}
		if entries[0].Key != holder.Key() || entries[0].Token != holder.Token() {
			t.Errorf("holder entry: got %+v, want key %q token %d", entries[0], holder.Key(), holder.Token())
		}
		if err := holder.UnlockContext(ctx); err != nil {
			t.Fatal(err)
		}
		if err := waitErr(t, w.locked); err != nil {
			t.Fatal(err)
		}
		if got, want := describe(inspect(t, ctx, client, name)), "mutex:b:holds mutex::waits"; got != want {
			t.Errorf("Inspect after the holder left: got %q, want %q", got, want)
		}
		if err := w.Release(); err != nil {
			t.Fatal(err)
		}
		if err := waitErr(t, upLocked); err != nil {
			t.Fatal(err)
		}
		if err := up.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("RWMutex", func(t *testing.T) {
		name := lockName(t)
		r1 := etcdlock.NewRWMutex(as("r1"), name)
		r2 := etcdlock.NewRWMutex(as("r2"), name)
		for _, rw := range []*etcdlock.RWMutex{r1, r2} {
			if err := rw.RLockContext(ctx); err != nil {
				t.Fatal(err)
			}
		}
		w := lockInGoroutine(t, ctx, wlocker{etcdlock.NewRWMutex(as("w"), name)})
		eventually(t, "the writer queued", func() bool { return len(lockKeys(t, client, name+"/write")) == 1 })
		r3 := lockInGoroutine(t, ctx, rlocker{etcdlock.NewRWMutex(as("r3"), name)})
		eventually(t, "r3 queued", func() bool { return len(lockKeys(t, client, name+"/read")) == 3 })
		if got, want := describe(inspect(t, ctx, client, name)), "read:r1:holds read:r2:holds write:w:waits read:r3:waits"; got != want {
			t.Errorf("Inspect: got %q, want %q", got, want)
		}
		for _, rw := range []*etcdlock.RWMutex{r1, r2} {
			if err := rw.RUnlockContext(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := waitErr(t, w.locked); err != nil {
			t.Fatal(err)
		}
		if got, want := describe(inspect(t, ctx, client, name)), "write:w:holds read:r3:waits"; got != want {
			t.Errorf("Inspect with the writer holding: got %q, want %q", got, want)
		}
		if err := w.Release(); err != nil {
			t.Fatal(err)
		}
		if err := waitErr(t, r3.locked); err != nil {
			t.Fatal(err)
		}
		if err := r3.Release(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("Semaphore", func(t *testing.T) {
		name := lockName(t)
		var permits []*etcdlock.Permit
		for _, id := range []string{"p1", "p2"} {
			p, err := etcdlock.NewSemaphore(as(id), name, 2).Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			permits = append(permits, p)
		}
		waiter := acquireInGoroutine(ctx, etcdlock.NewSemaphore(as("p3"), name, 2))
		eventually(t, "p3 queued", func() bool { return len(lockKeys(t, client, name)) == 3 })
		if got, want := describe(inspect(t, ctx, client, name)), "semaphore:p1:holds semaphore:p2:holds semaphore:p3:waits"; got != want {
			t.Errorf("Inspect: got %q, want %q", got, want)
		}
		release(t, permits[0])
		release(t, admitted(t, waiter))
		release(t, permits[1])
	})

	t.Run("nested names", func(t *testing.T) {
		name := lockName(t)
		inner := etcdlock.NewMutex(as("inner"), name+"/sub")
		if err := inner.LockContext(ctx); err != nil {
			t.Fatal(err)
		}
		if entries := inspect(t, ctx, client, name); len(entries) != 0 {
			t.Errorf("Inspect of %q with only %q held: got %q, want nothing", name, name+"/sub", describe(entries))
		}
		if err := inner.UnlockContext(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		if _, err := etcdlock.Inspect(ctx, client, ""); !errors.Is(err, etcdlock.ErrInvalidName) {
			t.Errorf("Inspect of the empty name: got %v, want ErrInvalidName", err)
		}
		if _, err := etcdlock.Inspect(ctx, nil, "x"); !errors.Is(err, etcdlock.ErrInvalidArgument) {
			t.Errorf("Inspect with a nil client: got %v, want ErrInvalidArgument", err)
		}
		var nilCtx context.Context
		if _, err := etcdlock.Inspect(nilCtx, client, "x"); !errors.Is(err, etcdlock.ErrInvalidArgument) {
			t.Errorf("Inspect with a nil context: got %v, want ErrInvalidArgument", err)
		}
	})
}
