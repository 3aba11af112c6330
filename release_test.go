package etcdlock_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// losses records the HoldLost events of a Session.
type losses struct {
	mu     sync.Mutex
	events []etcdlock.Event
}

func (l *losses) Observe(e etcdlock.Event) {
	if e.Kind == etcdlock.HoldLost {
		l.mu.Lock()
		l.events = append(l.events, e)
		l.mu.Unlock()
	}
}

// of returns the losses of key recorded so far.
func (l *losses) of(key string) []etcdlock.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.DeleteFunc(slices.Clone(l.events), func(e etcdlock.Event) bool { return e.Key != key })
}

// entryOf returns the entry of the lock name's queue attached to lease.
func entryOf(t *testing.T, client *clientv3.Client, name string, lease clientv3.LeaseID) etcdlock.QueueEntry {
	t.Helper()
	for _, e := range inspect(t, testContext(t), client, name) {
		if e.Lease == lease {
			return e
		}
	}
	t.Fatalf("no key of lease %x in the queue of %q", lease, name)
	return etcdlock.QueueEntry{}
}

// TestRelease: Release deletes the holder's key, for every kind; etcd then
// has no key of the holder's in the queue, the holder's Done closes, an event
// names the key, its unlock returns ErrLockLost, and the next in the queue
// holds.
func TestRelease(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	kinds := append(slices.Clone(family), member{"MultiMutex", openMulti, openMutex, 1})
	for _, p := range kinds {
		t.Run(p.name, func(t *testing.T) {
			ctx := testContext(t)
			name := lockName(t)
			seen := &losses{}
			s := newSession(t, client, etcdlock.WithObserver(seen))
			l := p.open(s, name)
			mustLock(t, l)
			done := l.Done()
			waiter := lockInGoroutine(t, ctx, famLocker{p.blocker(newSession(t, client), name)})

			e := entryOf(t, client, name, s.Lease())
			if !e.Holds || e.Token != l.Token() {
				t.Fatalf("holder's entry: got %+v, want a holder with token %d", e, l.Token())
			}
			if err := etcdlock.Release(ctx, client, name, e); err != nil {
				t.Fatalf("Release: got %v, want nil", err)
			}
			if slices.Contains(lockKeys(t, client, name), e.Key) {
				t.Fatalf("key %s still in etcd after Release", e.Key)
			}
			if _, ok := closedWithin(done, doneBound); !ok {
				t.Fatalf("Done still open %v after Release", doneBound)
			}
			if err := waitErr(t, waiter.locked); err != nil {
				t.Fatalf("the next in the queue: got %v, want it to hold", err)
			}
			resp, err := client.Txn(ctx).If(l.IsOwner()).Commit()
			if err != nil || resp.Succeeded {
				t.Fatalf("IsOwner after Release: got %v, %v; want a failed comparison", resp, err)
			}
			if err := l.Unlock(ctx); !errors.Is(err, etcdlock.ErrLockLost) {
				t.Fatalf("unlock after Release: got %v, want ErrLockLost", err)
			}
			if left := keysOfLease(t, client, name, s.Lease()); len(left) > 0 {
				t.Fatalf("keys of the holder after its unlock: got %v, want none", left)
			}
			eventually(t, "HoldLost naming the key", func() bool { return len(seen.of(e.Key)) == 1 })
			if got := seen.of(e.Key)[0]; got.Reason != etcdlock.LossKeyDeleted || got.Token != e.Token {
				t.Fatalf("HoldLost: got reason %q token %d, want %q, %d", got.Reason, got.Token, etcdlock.LossKeyDeleted, e.Token)
			}
		})
	}
}

// TestReleaseMultiRest: releasing one key of a MultiMutex's hold leaves its
// other keys in etcd until the holder unlocks, which deletes them.
func TestReleaseMultiRest(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	s := newSession(t, client)
	m := etcdlock.NewMultiMutex(s, name+"-a", name+"-b")
	if err := m.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	done := m.Done()
	if err := etcdlock.Release(ctx, client, name+"-a", entryOf(t, client, name+"-a", s.Lease())); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, ok := closedWithin(done, doneBound); !ok {
		t.Fatalf("Done still open %v after Release of one key", doneBound)
	}
	if got := keysOfLease(t, client, name+"-b", s.Lease()); len(got) != 1 {
		t.Fatalf("the other name's key before the unlock: got %v, want it there", got)
	}
	if err := m.UnlockContext(ctx); !errors.Is(err, etcdlock.ErrLockLost) {
		t.Fatalf("unlock: got %v, want ErrLockLost", err)
	}
	if got := keysOfLease(t, client, name+"-b", s.Lease()); len(got) != 0 {
		t.Fatalf("the other name's key after the unlock: got %v, want none", got)
	}
}

// TestReleaseBadInput: an error for each mistake, and nothing written.
func TestReleaseBadInput(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	s := newSession(t, client)
	m := etcdlock.NewMutex(s, name)
	if err := m.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	held := entryOf(t, client, name, s.Lease())
	var nilCtx context.Context // a nil context is the bad input under test
	with := func(key string, token int64) etcdlock.QueueEntry { return etcdlock.QueueEntry{Key: key, Token: token} }
	cases := []struct {
		what   string
		ctx    context.Context
		client *clientv3.Client
		name   string
		e      etcdlock.QueueEntry
		want   error
	}{
		{"empty name", ctx, client, "", held, etcdlock.ErrInvalidName},
		{"nil context", nilCtx, client, name, held, etcdlock.ErrInvalidArgument},
		{"nil client", ctx, nil, name, held, etcdlock.ErrInvalidArgument},
		{"unknown name", ctx, client, name + "-other", held, etcdlock.ErrInvalidArgument},
		{"a nested key", ctx, client, name, with(name+"/x/"+held.Key[len(name)+1:], held.Token), etcdlock.ErrInvalidArgument},
		{"the prefix itself", ctx, client, name, with(name+"/", held.Token), etcdlock.ErrInvalidArgument},
		{"no key", ctx, client, name, with("", held.Token), etcdlock.ErrInvalidArgument},
		{"token 0", ctx, client, name, with(held.Key, 0), etcdlock.ErrInvalidArgument},
		{"negative token", ctx, client, name, with(held.Key, -1), etcdlock.ErrInvalidArgument},
		{"another token", ctx, client, name, with(held.Key, held.Token+1), etcdlock.ErrNotHeld},
		{"a key not there", ctx, client, name, with(name+"/1234", held.Token), etcdlock.ErrNotHeld},
	}
	before := revision(t, client)
	for _, c := range cases {
		if err := etcdlock.Release(c.ctx, c.client, c.name, c.e); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.what, err, c.want)
		}
	}
	if w := wroteSince(t, client, before); len(w) > 0 {
		t.Fatalf("writes after bad input: %v, want none", w)
	}
	if err := m.UnlockContext(ctx); err != nil {
		t.Fatalf("unlock of the hold untouched: got %v, want nil", err)
	}
}

// TestReleaseRacesUnlock: Release and the holder's unlock at once: exactly
// one of them deletes the key; the other says it was gone (ErrNotHeld to
// Release, ErrLockLost to the unlock), and the next hold's key is never
// touched.
func TestReleaseRacesUnlock(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	sa, sb := newSession(t, client), newSession(t, client)
	a, b := etcdlock.NewMutex(sa, name), etcdlock.NewMutex(sb, name)
	var released, unlocked int
	for i := range 20 {
		// The next holder is ready: a Release fenced on a stale token must
		// not delete its key.
		next, holder, lease := a, b, sb.Lease()
		if i%2 == 0 {
			next, holder, lease = b, a, sa.Lease()
		}
		if err := holder.LockContext(ctx); err != nil {
			t.Fatal(err)
		}
		_ = holder.Done()
		e := entryOf(t, client, name, lease)
		w := lockInGoroutine(t, ctx, ours{next})
		var wg sync.WaitGroup
		var rerr, uerr error
		wg.Go(func() { rerr = etcdlock.Release(ctx, client, name, e) })
		uerr = holder.UnlockContext(ctx)
		wg.Wait()
		switch {
		case rerr == nil && errors.Is(uerr, etcdlock.ErrLockLost):
			released++
		case errors.Is(rerr, etcdlock.ErrNotHeld) && uerr == nil:
			unlocked++
		default:
			t.Fatalf("round %d: Release %v, unlock %v; want one nil and the other ErrNotHeld or ErrLockLost", i, rerr, uerr)
		}
		if err := waitErr(t, w.locked); err != nil {
			t.Fatalf("round %d: next holder: %v", i, err)
		}
		if keys := lockKeys(t, client, name); len(keys) != 1 || keys[0] != next.Key() {
			t.Fatalf("round %d: keys %v, want only the next holder's %s", i, keys, next.Key())
		}
		if err := w.Release(); err != nil {
			t.Fatalf("round %d: next holder's unlock: %v", i, err)
		}
	}
	t.Logf("Release first %d times, unlock first %d times", released, unlocked)
}
