package etcdlock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// Held: one snapshot of the calling goroutine's hold, judged in etcd.

// checkHeld checks a snapshot against etcd: its key is there with its token
// as create revision and its lease, its IsOwner guard holds, Done is open.
func checkHeld(t *testing.T, client *clientv3.Client, who string, h etcdlock.Hold, name string) {
	t.Helper()
	ctx := testContext(t)
	resp, err := client.Get(ctx, h.Key)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case h.Name != name:
		t.Errorf("%s: Held.Name %q, want %q", who, h.Name, name)
	case len(resp.Kvs) != 1:
		t.Errorf("%s: Held.Key %q is not in etcd", who, h.Key)
	case resp.Kvs[0].CreateRevision != h.Token || clientv3.LeaseID(resp.Kvs[0].Lease) != h.Lease:
		t.Errorf("%s: Held token %d, lease %x; etcd has create revision %d, lease %x", who, h.Token, h.Lease, resp.Kvs[0].CreateRevision, resp.Kvs[0].Lease)
	}
	if r, err := client.Txn(ctx).If(h.IsOwner()).Commit(); err != nil || !r.Succeeded {
		t.Errorf("%s: Held.IsOwner() guard failed while held: %v", who, err)
	}
	if isClosed(h.Done()) {
		t.Errorf("%s: Held.Done() closed while held", who)
	}
}

// checkEnded checks that a snapshot of an ended hold says so.
func checkEnded(t *testing.T, client *clientv3.Client, who string, h etcdlock.Hold) {
	t.Helper()
	if r, err := client.Txn(testContext(t)).If(h.IsOwner()).Commit(); err != nil || r.Succeeded {
		t.Errorf("%s: Held.IsOwner() guard holds after the hold ended (err %v)", who, err)
	}
	select {
	case <-h.Done():
	case <-time.After(2 * time.Second):
		t.Errorf("%s: Held.Done() open 2 s after the hold ended", who)
	}
}

func TestMutexHeld(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	s := newSession(t, client)
	m := etcdlock.NewMutex(s, name)

	if h, ok := m.Held(); ok || h != (etcdlock.Hold{}) {
		t.Errorf("Held before any lock = %+v, %v; want the zero Hold, false", h, ok)
	}
	if err := m.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	h, ok := m.Held()
	if !ok {
		t.Fatal("Held of the holder: false")
	}
	checkHeld(t, client, "the holder", h, name)
	if h.Key != m.Key() || h.Token != m.Token() || h.Lease != s.Lease() {
		t.Errorf("Held %+v disagrees with Key %q, Token %d, Lease %x", h, m.Key(), m.Token(), s.Lease())
	}
	other := make(chan bool)
	go func() { _, ok := m.Held(); other <- ok }()
	if <-other {
		t.Error("Held of another goroutine of the process, which holds nothing: true")
	}
	if err := m.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Held(); ok {
		t.Error("Held after the unlock: true")
	}
	checkEnded(t, client, "the old snapshot", h)

	// Locked again: a new snapshot, a new token; the old one stays ended.
	if err := m.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	h2, _ := m.Held()
	checkHeld(t, client, "the second hold", h2, name)
	if h2.Token <= h.Token {
		t.Errorf("second hold's token %d, want above the first's %d", h2.Token, h.Token)
	}
	checkEnded(t, client, "the first snapshot, during the second hold", h)
	if err := m.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}

	// Do's f gets the same snapshot through its context.
	err := m.Do(ctx, func(fctx context.Context) error {
		fromCtx, ok := etcdlock.HoldFrom(fctx)
		mine, ok2 := m.Held()
		if !ok || !ok2 || fromCtx.Token != mine.Token || fromCtx.Key != mine.Key {
			t.Errorf("in Do: HoldFrom %+v (%v), Held %+v (%v): want the same hold", fromCtx, ok, mine, ok2)
		}
		checkHeld(t, client, "Do's hold", fromCtx, name)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestRWMutexHeld(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)
	s := newSession(t, client)
	rw := etcdlock.NewRWMutex(s, name)

	type snap struct {
		h  etcdlock.Hold
		ok bool
	}
	// Two readers, each with its own snapshot; A unlocks, B's stays whole.
	heldA, heldB := make(chan snap), make(chan snap)
	unlockA, doneA, unlockB, doneB := make(chan struct{}), make(chan error), make(chan struct{}), make(chan error)
	reader := func(held chan<- snap, unlock <-chan struct{}, done chan<- error) {
		if err := rw.RLockContext(ctx); err != nil {
			held <- snap{}
			return
		}
		h, ok := rw.Held()
		held <- snap{h, ok}
		<-unlock
		done <- rw.RUnlockContext(ctx)
	}
	go reader(heldA, unlockA, doneA)
	go reader(heldB, unlockB, doneB)
	a, b := <-heldA, <-heldB
	if !a.ok || !b.ok {
		t.Fatalf("readers' Held: %v, %v; want true", a.ok, b.ok)
	}
	if a.h.Key == b.h.Key || a.h.Token == b.h.Token {
		t.Errorf("two readers' snapshots name one hold: %+v, %+v", a.h, b.h)
	}
	checkHeld(t, client, "reader A", a.h, name)
	checkHeld(t, client, "reader B", b.h, name)
	close(unlockA)
	if err := <-doneA; err != nil {
		t.Fatal(err)
	}
	checkEnded(t, client, "reader A after its unlock", a.h)
	checkHeld(t, client, "reader B after A's unlock", b.h, name)
	if h, ok := rw.Held(); ok {
		t.Errorf("Held of a goroutine that holds nothing: %+v", h)
	}
	close(unlockB)
	if err := <-doneB; err != nil {
		t.Fatal(err)
	}
	checkEnded(t, client, "reader B after its unlock", b.h)

	if err := rw.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	w, ok := rw.Held()
	if !ok {
		t.Fatal("the writer's Held: false")
	}
	checkHeld(t, client, "the writer", w, name)
	if err := rw.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
	checkEnded(t, client, "the writer after its unlock", w)
}

// TestMultiMutexHeld: a MultiMutex's snapshot names every key, all in etcd at
// its one token; its guard fails once the hold ended.
func TestMultiMutexHeld(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	ctx := testContext(t)
	a, b := lockName(t)+"/a", lockName(t)+"/b"
	s := newSession(t, client)
	m := etcdlock.NewMultiMutex(s, b, a)
	if h, ok := m.Held(); ok || h.Token != 0 || !isClosed(h.Done()) {
		t.Fatalf("Held before any lock: %+v, %v; want the zero Hold, false", h, ok)
	}
	if err := m.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	h, ok := m.Held()
	if !ok {
		t.Fatal("Held while held: false")
	}
	if want := []string{keyOf(a, s.Lease()), keyOf(b, s.Lease())}; fmt.Sprint(h.Keys()) != fmt.Sprint(want) || h.Key != want[0] || h.Name != a+","+b {
		t.Errorf("Held: name %q, key %q, keys %v; want %q, %q, %v", h.Name, h.Key, h.Keys(), a+","+b, want[0], want)
	}
	if h.Token != m.Token() {
		t.Errorf("Held.Token %d, Token() %d", h.Token, m.Token())
	}
	checkHeld(t, client, "the MultiMutex", h, a+","+b)
	for _, key := range h.Keys() {
		guard := clientv3.Compare(clientv3.CreateRevision(key), "=", h.Token)
		if r, err := client.Txn(ctx).If(guard).Commit(); err != nil || !r.Succeeded {
			t.Errorf("key %s at the token %d: not in etcd (%v)", key, h.Token, err)
		}
	}
	if err := m.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
	checkEnded(t, client, "the MultiMutex after its unlock", h)
}

// One snapshot of the hold: name, key, token, lease and loss signal, read at
// once.
func ExampleMutex_Held() {
	srv, client := startExampleServer()
	defer srv.Close()
	s, _ := etcdlock.NewSession(client)
	defer s.Close()

	m := etcdlock.NewMutex(s, "reports")
	m.Lock()
	h, ok := m.Held()
	fmt.Println("held:", ok, h.Name, h.Key == m.Key(), h.Token > 0)
	m.Unlock()

	<-h.Done() // the hold ended
	_, ok = m.Held()
	fmt.Println("after unlock:", ok)
	// Output:
	// held: true reports true true
	// after unlock: false
}
