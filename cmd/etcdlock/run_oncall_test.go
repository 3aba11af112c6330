//go:build unix

package main

import (
	"strings"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// TestRunOnCall: run --max-hold stops COMMAND as a lost lock and leaves no
// key; run --lock-delay starts COMMAND only the delay after the holder
// before it crashed; run --watchdog gives up the lock once COMMAND stops
// touching $ETCDLOCK_PROGRESS, and not while it does.
func TestRunOnCall(t *testing.T) {
	testflags.Parallel(t)
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	ep := srv.Endpoints()[0]

	t.Run("max-hold", func(t *testing.T) {
		name := lockName(t)
		r := runCLI(t, nil, "run", "--max-hold", "1s", "--kill-grace", "0", "--endpoints", ep, name, "--", "sleep", "60")
		r.want(t, exitLost)
		if !strings.Contains(r.stderr, "--max-hold 1s") {
			t.Fatalf("stderr: got %q, want it to name --max-hold", r.stderr)
		}
		if keys := lockKeys(t, cli, name); len(keys) != 0 {
			t.Fatalf("keys after --max-hold: got %v, want none", keys)
		}
	})

	t.Run("lock-delay", func(t *testing.T) {
		name := lockName(t)
		holder := newSession(t, cli)
		if err := etcdlock.NewMutex(holder, name).LockContext(t.Context()); err != nil {
			t.Fatal(err)
		}
		p := startCLI(t, nil, "run", "--lock-delay", "1s", "--endpoints", ep, name, "--", "true")
		waitKeys(t, cli, name, 2)
		revoked := time.Now()
		if _, err := cli.Revoke(t.Context(), holder.Lease()); err != nil {
			t.Fatal(err)
		}
		p.wait(t).want(t, 0)
		if took := time.Since(revoked); took < time.Second {
			t.Fatalf("run returned %v after the holder crashed, before its --lock-delay 1s", took)
		}
	})

	t.Run("watchdog", func(t *testing.T) {
		name := lockName(t)
		// Reports progress for 1.2 s, then hangs.
		report := `for i in 1 2 3 4 5 6; do touch "$ETCDLOCK_PROGRESS"; sleep 0.2; done; sleep 60`
		// A period of 3 s: a 0.2 s step would need to stall 3 s on a loaded
		// machine to trip it early.
		r := runCLI(t, nil, "run", "--watchdog", "3s", "--kill-grace", "0", "--endpoints", ep, name, "--", "sh", "-c", report)
		r.want(t, exitLost)
		if !strings.Contains(r.stderr, "--watchdog 3s") {
			t.Fatalf("stderr: got %q, want it to name --watchdog", r.stderr)
		}
		if r.took < 1200*time.Millisecond {
			t.Fatalf("run gave up after %v, while COMMAND reported progress for 1.2 s", r.took)
		}
		if keys := lockKeys(t, cli, name); len(keys) != 0 {
			t.Fatalf("keys after the watchdog gave up: got %v, want none", keys)
		}
		ok := `for i in 1 2 3 4 5 6; do touch "$ETCDLOCK_PROGRESS"; sleep 0.2; done`
		runCLI(t, nil, "run", "--watchdog", "3s", "--endpoints", ep, name, "--", "sh", "-c", ok).want(t, 0)
	})

	t.Run("bad input", func(t *testing.T) {
		for _, flag := range []string{"--max-hold", "--lock-delay", "--watchdog"} {
			runCLI(t, nil, "run", flag, "-1s", "--endpoints", ep, lockName(t), "--", "true").want(t, exitUsage)
		}
	})
}
