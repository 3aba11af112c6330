package etcdtest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// recordingTB is a testing.TB whose errors and cleanups are kept, so that a
// test can show what would fail another test.
type recordingTB struct {
	testing.TB
	mu       sync.Mutex
	errs     []string
	cleanups []func()
}

func (r *recordingTB) Helper() {}
func (r *recordingTB) Error(args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprint(args...))
}
func (r *recordingTB) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }

// end runs the cleanups, as the end of a test does, and returns the errors.
func (r *recordingTB) end() []string {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.errs
}

// The Resource's rules, section by section: an unfenced one records overlaps
// and stale sections and fails the test with them; a fenced one refuses
// them, and finds nothing.
func TestResourceRules(t *testing.T) {
	testflags.Parallel(t)
	begin := func(t *testing.T, r *etcdtest.Resource, name string, token int64) *etcdtest.Section {
		t.Helper()
		s, err := r.Begin(name, token)
		if err != nil {
			t.Fatalf("Begin(%q, %d): got %v, want nil", name, token, err)
		}
		return s
	}
	end := func(t *testing.T, s *etcdtest.Section, want error) {
		t.Helper()
		if err := s.End(); !errors.Is(err, want) {
			t.Fatalf("End: got %v, want %v", err, want)
		}
	}

	t.Run("unfenced", func(t *testing.T) {
		tb := &recordingTB{TB: t}
		r := etcdtest.NewResource(tb)
		a := begin(t, r, "orders", 10)
		b := begin(t, r, "orders", 11) // the next holder, while a goes on
		end(t, b, nil)
		end(t, a, nil)
		c := begin(t, r, "orders", 9) // a holder long gone
		end(t, c, nil)
		d := begin(t, r, "other", 1) // another lock: nothing to do with orders
		end(t, d, nil)
		e := begin(t, r, "orders", 12)
		f := begin(t, r, "orders", 12) // one hold, two goroutines
		end(t, f, nil)
		end(t, e, nil)
		if err := e.End(); err == nil {
			t.Fatal("a second End: got nil, want an error")
		}
		if begun, effected := r.Sections(); begun != 6 || effected != 6 {
			t.Fatalf("Sections: got %d begun, %d effected, want 6 and 6", begun, effected)
		}
		errs := tb.end()
		want := []string{"overlap: the section of token 10", "stale: the section of token 9 took effect after that of token 10", "stale: the section of token 9 took effect after that of token 11"}
		if len(errs) != len(want) {
			t.Fatalf("the test's errors: got %d %q, want %d", len(errs), errs, len(want))
		}
		for i, w := range want {
			if !strings.Contains(errs[i], w) {
				t.Errorf("error %d: got %q, want it to say %q", i, errs[i], w)
			}
		}
	})

	t.Run("fenced", func(t *testing.T) {
		tb := &recordingTB{TB: t}
		r := etcdtest.NewFencedResource(tb)
		a := begin(t, r, "orders", 10)
		b := begin(t, r, "orders", 11)
		end(t, b, nil)
		end(t, a, etcdtest.ErrStaleToken) // rolled back: 11 began before its end
		if _, err := r.Begin("orders", 9); !errors.Is(err, etcdtest.ErrStaleToken) {
			t.Fatalf("Begin of a stale token: got %v, want ErrStaleToken", err)
		}
		c := begin(t, r, "orders", 11) // the same holder again: not stale
		end(t, c, nil)
		open := begin(t, r, "orders", 12) // never ended: no effect
		_ = open
		if begun, effected := r.Sections(); begun != 4 || effected != 2 {
			t.Fatalf("Sections: got %d begun, %d effected, want 4 and 2", begun, effected)
		}
		if errs := tb.end(); len(errs) != 0 {
			t.Fatalf("the test's errors: got %q, want none", errs)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		r := etcdtest.NewResource(nil)
		for _, tc := range []struct {
			name  string
			token int64
		}{{"", 1}, {"orders", 0}, {"orders", -3}} {
			if s, err := r.Begin(tc.name, tc.token); err == nil || s != nil {
				t.Errorf("Begin(%q, %d): got %v, %v, want an error", tc.name, tc.token, s, err)
			}
		}
		if begun, _ := r.Sections(); begun != 0 {
			t.Fatalf("Sections after bad input: got %d, want 0", begun)
		}
	})
}

// TestExampleFencing is what a test of code under a lock does to show that
// the code survives a holder paused past its lease's TTL: the first holder's
// client is paused until the next holder has begun, and then it goes on
// with its critical section. Against a resource that checks no token the
// test fails (an overlap); against one that refuses stale tokens the stale
// section is refused and the test passes. The unfenced run fails a
// recording TB here, so that this test passes to show it.
func TestExampleFencing(t *testing.T) {
	testflags.Parallel(t)
	srv := etcdtest.Start(t)
	for _, fenced := range []bool{false, true} {
		t.Run(fmt.Sprintf("fenced=%v", fenced), func(t *testing.T) {
			tb := &recordingTB{TB: t}
			res := etcdtest.NewResource(tb)
			if fenced {
				res = etcdtest.NewFencedResource(tb)
			}
			endErr := pausedHolder(t, srv, res)
			errs := tb.end()
			if fenced {
				if !errors.Is(endErr, etcdtest.ErrStaleToken) || len(errs) != 0 {
					t.Fatalf("fenced: the paused holder's End: got %v, want ErrStaleToken; the test's errors: got %q, want none", endErr, errs)
				}
				return
			}
			if endErr != nil || len(errs) != 1 || !strings.Contains(errs[0], "overlap") {
				t.Fatalf("unfenced: the paused holder's End: got %v, want nil; the test's errors: got %q, want one overlap", endErr, errs)
			}
		})
	}
}

// pausedHolder runs two holders of one lock against res: the first is
// paused past its TTL in its critical section, until the second has begun
// its own, and then ends its section. It returns what that End returned.
func pausedHolder(t *testing.T, srv *etcdtest.Server, res *etcdtest.Resource) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := "orders"

	cliA, proxy := srv.ProxiedClient(t)
	a, err := etcdlock.NewSession(cliA, etcdlock.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := etcdlock.NewSession(srv.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()

	ma := etcdlock.NewMutex(a, name)
	if err := ma.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	sec, err := res.Begin(name, ma.Token())
	if err != nil {
		t.Fatal(err)
	}

	next := make(chan error, 1)
	go func() {
		mb := etcdlock.NewMutex(b, name)
		if err := mb.LockContext(ctx); err != nil { // after a's lease expired
			next <- err
			return
		}
		s, err := res.Begin(name, mb.Token())
		if err == nil {
			err = s.End()
		}
		next <- errors.Join(err, mb.UnlockContext(ctx))
	}()
	// The first holder stops, as in a GC pause, until the next one has
	// begun: its lease expires meanwhile, and it has not seen it.
	proxy.PauseWhile(func() {
		if err := res.WaitNewer(ctx, name, ma.Token()); err != nil {
			t.Errorf("the next holder's section: %v", err)
		}
	})
	endErr := sec.End()
	if err := <-next; err != nil {
		t.Fatalf("the next holder: %v", err)
	}
	_ = ma.UnlockContext(ctx) // ErrLockLost or ErrSessionExpired: its lease is gone
	return endErr
}

// PauseProcess stops a process for the duration, and lets it go on.
func TestPauseProcess(t *testing.T) {
	testflags.Parallel(t)
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("reads a process's state from /proc, which this system lacks")
	}
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	state := func() string {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		// pid (comm) state ...
		fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		return fields[0]
	}
	paused := make(chan error, 1)
	go func() { paused <- etcdtest.PauseProcess(cmd.Process, 5*time.Second) }()
	deadline := time.Now().Add(10 * time.Second)
	for state() != "T" {
		if time.Now().After(deadline) {
			t.Fatalf("process state during the pause: got %s, want T (stopped)", state())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := <-paused; err != nil {
		t.Fatal(err)
	}
	if s := state(); s == "T" {
		t.Fatalf("process state after the pause: got %s, want it running or sleeping", s)
	}
	if err := etcdtest.PauseProcess(nil, time.Second); err == nil {
		t.Error("PauseProcess(nil): got nil, want an error")
	}
}
