package etcdlock_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// The text form reads back as the same Fence, for every kind of hold and for
// names with bytes that need escapes.
func TestFenceText(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	s := newSession(t, client)
	ctx := testContext(t)
	base := lockName(t)

	check := func(what string, f etcdlock.Fence, name string) {
		t.Helper()
		if f.Name != name || f.Token < 1 || !strings.HasPrefix(f.Key, name+"/") {
			t.Fatalf("%s: got fence %+v, want name %q, a token and a key under it", what, f, name)
		}
		text := f.String()
		if strings.ContainsAny(text, " \t\r\n") || !strings.HasPrefix(text, "etcdlock:") {
			t.Fatalf("%s: text %q: want printable, no spaces, prefix etcdlock:", what, text)
		}
		for _, r := range text {
			if r < 0x21 || r > 0x7e {
				t.Fatalf("%s: text %q has %q: want printable ASCII", what, text, r)
			}
		}
		back, err := etcdlock.ParseFence(text)
		if err != nil || back != f {
			t.Fatalf("%s: ParseFence(%q) = %+v, %v; want %+v, nil", what, text, back, err, f)
		}
		j, err := json.Marshal(struct{ F etcdlock.Fence }{f})
		if err != nil {
			t.Fatalf("%s: json: %v", what, err)
		}
		var got struct{ F etcdlock.Fence }
		if err := json.Unmarshal(j, &got); err != nil || got.F != f {
			t.Fatalf("%s: json %s read back as %+v, %v; want %+v", what, j, got.F, err, f)
		}
		if err := etcdlock.CheckFence(ctx, client, f); err != nil {
			t.Fatalf("%s: CheckFence of a held fence: got %v, want nil", what, err)
		}
	}

	odd := base + "/odd: name%with spaces,ünï/and:colons"
	m := etcdlock.NewMutex(s, odd)
	if err := m.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	h, _ := m.Held()
	check("mutex", h.Fence(), odd)
	if f := h.Fence(); !strings.Contains(f.String(), "%3A") || strings.Count(f.String(), ":") != 3 {
		t.Fatalf("text %q: want the name's colons escaped", f.String())
	}
	if err := m.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}

	rw := etcdlock.NewRWMutex(s, base+"/rw")
	if err := rw.RLockContext(ctx); err != nil {
		t.Fatal(err)
	}
	h, _ = rw.Held()
	check("reader", h.Fence(), base+"/rw")
	if err := rw.RUnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rw.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	h, _ = rw.Held()
	check("writer", h.Fence(), base+"/rw")
	if err := rw.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}

	sem := etcdlock.NewSemaphore(s, base+"/sem", 2)
	p, err := sem.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	check("permit", p.Fence(), base+"/sem")
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if f := p.Fence(); f != (etcdlock.Fence{}) || f.String() != "" {
		t.Fatalf("a released permit's fence: got %+v %q, want the zero Fence and \"\"", f, f.String())
	}

	mm := etcdlock.NewMultiMutex(s, base+"/b", base+"/a")
	if err := mm.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	h, _ = mm.Held()
	check("multi", h.Fence(), base+"/a")
	mb := etcdlock.NewMutex(s, base+"/b")
	fb := etcdlock.Fence{Name: base + "/b", Key: mb.Key(), Token: mb.Token()}
	check("multi, second name", fb, base+"/b")
	if fb.Token != h.Fence().Token {
		t.Fatalf("a MultiMutex's fences: tokens %d and %d, want one", fb.Token, h.Fence().Token)
	}
	if err := mm.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
	if f := (etcdlock.Hold{}).Fence(); f != (etcdlock.Fence{}) {
		t.Fatalf("the zero Hold's fence: got %+v, want the zero Fence", f)
	}
}

// Anything that is not the text form of a fence gets ErrInvalidFence, with
// what is wrong; so does a Fence that names no hold, in MarshalText and
// CheckFence, which then reads nothing.
func TestParseFenceMalformed(t *testing.T) {
	testflags.Parallel(t)
	for _, tc := range []struct{ text, says string }{
		{"", "does not begin"},
		{"1042", "does not begin"},
		{"etcdlock1:1042:jobs:694d", "does not begin"},
		{"etcdlock:", "want etcdlock:<token>"},
		{"etcdlock:1042:jobs", "want etcdlock:<token>"},
		{"etcdlock:1042:jobs:694d:more", "want etcdlock:<token>"},
		{"etcdlock:0:jobs:694d", "not a positive decimal"},
		{"etcdlock:-5:jobs:694d", "not a positive decimal"},
		{"etcdlock:+5:jobs:694d", "not a positive decimal"},
		{"etcdlock:007:jobs:694d", "not a positive decimal"},
		{"etcdlock:x:jobs:694d", "not a positive decimal"},
		{"etcdlock:99999999999999999999:jobs:694d", "not a positive decimal"},
		{"etcdlock:1042::694d", "empty lock name"},
		{"etcdlock:1042:jobs:", "not a lock key"},
		{"etcdlock:1042:jobs:694d/extra", "not a lock key"},
		{"etcdlock:1042:jobs:read/", "not a lock key"},
		{"etcdlock:1042:jo%2:694d", "bad %-escape"},
		{"etcdlock:1042:jo%zzbs:694d", "bad %-escape"},
		{"etcdlock:1042:jo bs:694d", "bad %-escape"},
		{"etcdlock:1042:jobs:694d\n", "bad %-escape"},
	} {
		f, err := etcdlock.ParseFence(tc.text)
		if !errors.Is(err, etcdlock.ErrInvalidFence) || !strings.Contains(err.Error(), tc.says) || f != (etcdlock.Fence{}) {
			t.Errorf("ParseFence(%q) = %+v, %v; want the zero Fence and ErrInvalidFence saying %q", tc.text, f, err, tc.says)
		}
		before := etcdlock.Fence{Name: "kept", Key: "kept/1", Token: 1}
		got := before
		if err := got.UnmarshalText([]byte(tc.text)); tc.text != "" && (!errors.Is(err, etcdlock.ErrInvalidFence) || got != before) {
			t.Errorf("UnmarshalText(%q): got %+v, %v; want ErrInvalidFence and the Fence unchanged", tc.text, got, err)
		}
	}

	_, client := startServer(t)
	ctx := testContext(t)
	for _, f := range []etcdlock.Fence{
		{Key: "jobs/694d", Token: 1},                 // no name
		{Name: "jobs", Key: "jobs/694d"},             // no token
		{Name: "jobs", Key: "other/694d", Token: 7},  // a key of another lock
		{Name: "jobs", Key: "jobs/a/694d", Token: 7}, // a nested lock's key
	} {
		if _, err := f.MarshalText(); !errors.Is(err, etcdlock.ErrInvalidFence) {
			t.Errorf("MarshalText(%+v): got %v, want ErrInvalidFence", f, err)
		}
		rev := revision(t, client)
		if err := etcdlock.CheckFence(ctx, client, f); !errors.Is(err, etcdlock.ErrInvalidFence) {
			t.Errorf("CheckFence(%+v): got %v, want ErrInvalidFence", f, err)
		}
		if w := wroteSince(t, client, rev); len(w) > 0 {
			t.Errorf("CheckFence(%+v) wrote %v", f, w)
		}
	}
	//lint:ignore SA1012 a nil context is the bad input under test
	if err := etcdlock.CheckFence(nil, client, etcdlock.Fence{Name: "a", Key: "a/1", Token: 1}); !errors.Is(err, etcdlock.ErrInvalidArgument) {
		t.Errorf("CheckFence(nil ctx): got %v, want ErrInvalidArgument", err)
	}
	if err := etcdlock.CheckFence(ctx, nil, etcdlock.Fence{Name: "a", Key: "a/1", Token: 1}); !errors.Is(err, etcdlock.ErrInvalidArgument) {
		t.Errorf("CheckFence(nil client): got %v, want ErrInvalidArgument", err)
	}
}

// FuzzParseFence: whatever ParseFence accepts, String writes back as text
// that reads as the same Fence; it never panics.
func FuzzParseFence(f *testing.F) {
	for _, s := range []string{"etcdlock:1042:jobs/nightly:694d8f3a2b1c", "etcdlock:7:a%3Ab:read/1f", "etcdlock:1:x:write/2", "etcdlock:1:%25:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fc, err := etcdlock.ParseFence(s)
		if err != nil {
			if !errors.Is(err, etcdlock.ErrInvalidFence) {
				t.Fatalf("ParseFence(%q): got %v, want ErrInvalidFence", s, err)
			}
			return
		}
		back, err := etcdlock.ParseFence(fc.String())
		if err != nil || back != fc {
			t.Fatalf("ParseFence(%q) = %+v; its String %q reads as %+v, %v", s, fc, fc.String(), back, err)
		}
	})
}

// CheckFence answers from etcd: nil while the hold holds; ErrLockLost once
// it was unlocked, deleted by someone else, made anew, or for a waiter's
// key; readers and permits that hold together all pass.
func TestCheckFence(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	s1, s2 := newSession(t, client), newSession(t, client)
	ctx := testContext(t)
	name := lockName(t)

	lost := func(what string, f etcdlock.Fence, says string) {
		t.Helper()
		err := etcdlock.CheckFence(ctx, client, f)
		if !errors.Is(err, etcdlock.ErrLockLost) || !strings.Contains(err.Error(), says) {
			t.Fatalf("%s: CheckFence = %v, want ErrLockLost saying %q", what, err, says)
		}
	}
	holds := func(what string, f etcdlock.Fence) {
		t.Helper()
		if err := etcdlock.CheckFence(ctx, client, f); err != nil {
			t.Fatalf("%s: CheckFence = %v, want nil", what, err)
		}
	}

	m1, m2 := etcdlock.NewMutex(s1, name), etcdlock.NewMutex(s2, name)
	if err := m1.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	h1, _ := m1.Held()
	first := h1.Fence()
	holds("holder", first)

	// A waiter's key: a Fence made from Inspect's view of it.
	locked, release := make(chan error, 1), make(chan struct{})
	unlocked := result(func() error {
		err := m2.LockContext(ctx)
		locked <- err
		if err != nil {
			return err
		}
		<-release
		return m2.UnlockContext(ctx)
	})
	var waiter etcdlock.Fence
	eventually(t, "the second Session's key in the queue", func() bool {
		q, err := etcdlock.Inspect(ctx, client, name)
		if err == nil && len(q) == 2 {
			waiter = etcdlock.Fence{Name: name, Key: q[1].Key, Token: q[1].Token}
		}
		return waiter.Token != 0
	})
	lost("waiter", waiter, "waits")
	holds("holder, with a waiter", first)

	// Someone else deletes the holder's key: the fence is lost at once,
	// and the waiter's fence, now holding, passes.
	if _, err := client.Delete(ctx, first.Key); err != nil {
		t.Fatal(err)
	}
	lost("deleted", first, "is gone")
	if err := <-locked; err != nil {
		t.Fatal(err)
	}
	holds("the next holder", waiter)
	if err := m1.UnlockContext(ctx); !errors.Is(err, etcdlock.ErrLockLost) {
		t.Fatalf("unlock of the deleted hold: got %v, want ErrLockLost", err)
	}
	close(release)
	if err := <-unlocked; err != nil {
		t.Fatal(err)
	}
	lost("unlocked", waiter, "is gone")

	// The same Session locks again: same key, new token.
	if err := m1.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	h1, _ = m1.Held()
	if h1.Key != first.Key {
		t.Fatalf("relock: key %s, want %s", h1.Key, first.Key)
	}
	lost("made anew", first, "made anew")
	holds("relocked", h1.Fence())
	// A fence of this lock's key presented under another name is no fence.
	other := h1.Fence()
	other.Name = name + "-other"
	if err := etcdlock.CheckFence(ctx, client, other); !errors.Is(err, etcdlock.ErrInvalidFence) {
		t.Fatalf("a fence of another lock: got %v, want ErrInvalidFence", err)
	}
	if err := m1.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}

	// Readers and permits hold together: each one's fence passes.
	r1, r2 := etcdlock.NewRWMutex(s1, name+"/rw"), etcdlock.NewRWMutex(s2, name+"/rw")
	var fences []etcdlock.Fence
	for _, rw := range []*etcdlock.RWMutex{r1, r2} {
		if err := rw.RLockContext(ctx); err != nil {
			t.Fatal(err)
		}
		h, _ := rw.Held()
		fences = append(fences, h.Fence())
	}
	sem1 := etcdlock.NewSemaphore(s1, name+"/sem", 2)
	sem2 := etcdlock.NewSemaphore(s2, name+"/sem", 2)
	for _, sem := range []*etcdlock.Semaphore{sem1, sem2} {
		p, err := sem.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		fences = append(fences, p.Fence())
		t.Cleanup(func() { _ = p.Release(testContext(t)) })
	}
	for i, f := range fences {
		holds(fmt.Sprintf("shared hold %d", i), f)
	}
	if err := r1.RUnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
	lost("released reader", fences[0], "is gone")
	holds("the other reader", fences[1])
	if err := r2.RUnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
}

// exampleLocked starts an in-process etcd, makes a Session and locks a
// Mutex of name, for the fence examples; stop unlocks, if still held, and
// stops it all.
func exampleLocked(name string) (*clientv3.Client, *etcdlock.Session, *etcdlock.Mutex, func()) {
	srv, client := startExampleServer()
	s, err := etcdlock.NewSession(client)
	if err != nil {
		log.Fatal(err)
	}
	m := etcdlock.NewMutex(s, name)
	if err := m.LockContext(context.Background()); err != nil {
		log.Fatal(err)
	}
	return client, s, m, func() {
		if m.HoldCount() > 0 {
			_ = m.UnlockContext(context.Background())
		}
		_ = s.Close()
		srv.Close()
	}
}

// A fence travels with each write to what the lock guards, here as text (an
// HTTP header, an SQL parameter, an environment variable), and reads back as
// the same Fence.
func ExampleFence() {
	_, s, m, stop := exampleLocked("jobs/nightly")
	defer stop()
	h, _ := m.Held()
	text := h.Fence().String() // such as etcdlock:1042:jobs/nightly:694d8f3a2b1c
	fmt.Println(strings.HasPrefix(text, "etcdlock:"), strings.HasSuffix(text, fmt.Sprintf(":jobs/nightly:%x", s.Lease())))

	f, err := etcdlock.ParseFence(text)
	fmt.Println("read back:", f == h.Fence(), err)
	fmt.Println("token:", f.Token == m.Token())

	_, err = etcdlock.ParseFence("etcdlock:1042:jobs/nightly")
	fmt.Println(err)
	// Output:
	// true true
	// read back: true <nil>
	// token: true
	// etcdlock: invalid fence "etcdlock:1042:jobs/nightly": want etcdlock:<token>:<name>:<key after the name>
}

// A server that receives a fence and can reach etcd asks whether its hold
// still holds, with one read.
func ExampleCheckFence() {
	client, _, m, stop := exampleLocked("reports")
	defer stop()
	ctx := context.Background()
	h, _ := m.Held()
	f := h.Fence()
	fmt.Println("while held:", etcdlock.CheckFence(ctx, client, f))

	if err := m.UnlockContext(ctx); err != nil {
		log.Fatal(err)
	}
	err := etcdlock.CheckFence(ctx, client, f)
	fmt.Println("after the unlock:", errors.Is(err, etcdlock.ErrLockLost))
	// Output:
	// while held: <nil>
	// after the unlock: true
}

// CheckFence through a member that lags behind a delete of the fence's key
// never answers that the hold holds: its read is linearizable, which the
// lagging member cannot serve; once it has caught up, it answers lost.
func TestCheckFenceLaggingMember(t *testing.T) {
	testflags.Parallel(t)
	if sharedEtcd() {
		t.Skip("lags a member of a cluster of its own: needs an embedded etcd")
	}
	c := etcdtest.StartCluster(t, 3)
	lead := c.Leader()
	lagging, other := (lead+1)%3, (lead+2)%3
	eps := c.Endpoints()
	healthy := interceptedClient(t, eps[other:other+1], nil, nil)
	behind := interceptedClient(t, eps[lagging:lagging+1], nil, nil)
	ctx := testContext(t)
	s := newSession(t, healthy)
	m := etcdlock.NewMutex(s, lockName(t))
	// A loaded machine can time out a request of a fresh 3-member cluster
	// ("etcdserver: request timed out"): the lock and the delete are tried
	// again until etcd takes them.
	eventually(t, "the lock", func() bool { return m.LockContext(ctx) == nil })
	h, _ := m.Held()
	f := h.Fence()
	eventually(t, "the lagging member holding the fence's key", func() bool {
		return etcdlock.CheckFence(ctx, behind, f) == nil
	})

	c.Lag(lagging)
	eventually(t, "the delete of the fence's key", func() bool {
		_, err := healthy.Delete(ctx, f.Key)
		return err == nil
	})
	qctx, cancel := context.WithTimeout(ctx, time.Second)
	err := etcdlock.CheckFence(qctx, behind, f)
	cancel()
	if err == nil {
		t.Fatal("CheckFence through the lagging member after the key's delete: got nil (holds), want an error")
	}
	t.Logf("through the lagging member: %v", err)
	c.CatchUp(lagging)
	eventually(t, "the caught-up member answering lost", func() bool {
		return errors.Is(etcdlock.CheckFence(ctx, behind, f), etcdlock.ErrLockLost)
	})
}
