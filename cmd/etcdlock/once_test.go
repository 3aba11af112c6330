//go:build unix

package main

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/once"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// TestRunOncePer: run --once-per runs COMMAND once per slot, judged by the
// record in etcd and by what COMMAND leaves behind: its status when it ran
// (a failure records nothing), 76 when the slot was done (before the lock,
// or found done once the lock was ours), 75 when busy, 64 for bad flags.
func TestRunOncePer(t *testing.T) {
	testflags.Parallel(t)
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	ep := srv.Endpoints()[0]
	// record returns the slot's record, nil if none.
	record := func(t *testing.T, name, slot string) *clientv3.GetResponse {
		t.Helper()
		resp, err := cli.Get(t.Context(), once.Key(name, slot))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			return nil
		}
		return resp
	}
	// run runs etcdlock run --once-per slot with args, COMMAND touching a
	// file; it returns the result and whether COMMAND ran.
	run := func(t *testing.T, name, slot, status string, args ...string) (result, bool) {
		t.Helper()
		ran := filepath.Join(t.TempDir(), "ran")
		argv := append([]string{"run", "--endpoints", ep, "--once-per", slot, "--retention", "1m"}, args...)
		argv = append(argv, name, "--", "sh", "-c", `touch "$RAN"; exit `+status)
		r := runCLI(t, []string{"RAN=" + ran}, argv...)
		_, err := os.Stat(ran)
		return r, err == nil
	}

	t.Run("ran, then done", func(t *testing.T) {
		name := lockName(t)
		if r, ran := run(t, name, "s1", "3"); r.code != 3 || !ran {
			t.Fatalf("a failing COMMAND: got status %d, ran %v, want 3, true (%s)", r.code, ran, r.stderr)
		}
		if rec := record(t, name, "s1"); rec != nil {
			t.Fatalf("a record after a failing COMMAND: %v", rec)
		}
		if r, ran := run(t, name, "s1", "0"); r.code != 0 || !ran {
			t.Fatalf("COMMAND: got status %d, ran %v, want 0, true (%s)", r.code, ran, r.stderr)
		}
		rec := record(t, name, "s1")
		if rec == nil {
			t.Fatal("no record after COMMAND exited 0")
		}
		ttl, err := cli.TimeToLive(t.Context(), clientv3.LeaseID(rec.Kvs[0].Lease))
		if err != nil || ttl.GrantedTTL != 60 {
			t.Fatalf("the record's lease: got %v, %v, want a TTL of 60 s", ttl, err)
		}
		if r, ran := run(t, name, "s1", "0"); r.code != exitDone || ran {
			t.Fatalf("a done slot: got status %d, ran %v, want %d, false (%s)", r.code, ran, exitDone, r.stderr)
		}
		if r, ran := run(t, name, "s1", "0", "--quiet"); r.code != exitDone || ran || r.stderr != "" {
			t.Fatalf("a done slot, --quiet: got status %d, ran %v, stderr %q, want %d, false, none", r.code, ran, r.stderr, exitDone)
		}
		if keys := lockKeys(t, cli, name); len(keys) != 0 {
			t.Fatalf("lock keys after the runs: got %v, want none", keys)
		}
	})

	t.Run("busy", func(t *testing.T) {
		name := lockName(t)
		holdLock(t, cli, name)
		if r, ran := run(t, name, "s1", "0", "--wait", "0"); r.code != exitBusy || ran {
			t.Fatalf("a held lock: got status %d, ran %v, want %d, false (%s)", r.code, ran, exitBusy, r.stderr)
		}
		if rec := record(t, name, "s1"); rec != nil {
			t.Fatalf("a record after a busy run: %v", rec)
		}
	})

	t.Run("done while waiting", func(t *testing.T) {
		name := lockName(t)
		m := holdLock(t, cli, name)
		ran := filepath.Join(t.TempDir(), "ran")
		p := startCLI(t, []string{"RAN=" + ran}, "run", "--endpoints", ep, "--once-per", "s1", "--retention", "1m", name, "--", "touch", ran)
		waitKeys(t, cli, name, 2)
		// The holder runs the slot meanwhile, then unlocks.
		if _, err := m.DoOnce(t.Context(), "s1", time.Minute, func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
		if err := m.UnlockContext(t.Context()); err != nil {
			t.Fatal(err)
		}
		if r := p.wait(t); r.code != exitDone {
			t.Fatalf("run: got status %d, want %d (%s)", r.code, exitDone, r.stderr)
		}
		if _, err := os.Stat(ran); err == nil {
			t.Fatal("COMMAND ran on a slot done while run waited")
		}
	})

	t.Run("crash", func(t *testing.T) {
		name := lockName(t)
		pidFile := filepath.Join(t.TempDir(), "pid")
		p := startCLI(t, nil, "run", "--endpoints", ep, "--ttl", "2s", "--once-per", "s1", "--retention", "1m", name, "--", "sh", "-c", `echo $$ >"$0"; exec sleep 60`, pidFile)
		pid := readPID(t, pidFile)
		// etcdlock dies while COMMAND runs; COMMAND, in a group of its own,
		// is killed by hand.
		if err := p.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		_ = p.cmd.Wait()
		if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if rec := record(t, name, "s1"); rec != nil {
			t.Fatalf("a record after a crash: %v", rec)
		}
		// The next run waits for the crashed run's lease, then runs.
		if r, ran := run(t, name, "s1", "0"); r.code != 0 || !ran {
			t.Fatalf("the run after a crash: got status %d, ran %v, want 0, true (%s)", r.code, ran, r.stderr)
		}
		if record(t, name, "s1") == nil {
			t.Fatal("no record after the run that followed a crash")
		}
	})

	t.Run("bad flags", func(t *testing.T) {
		name := lockName(t)
		for _, args := range [][]string{
			{"--once-per", "s1"},
			{"--once-per", "s1", "--retention", "-1s"},
			{"--retention", "1m"},
			{"--once-per", "s1", "--retention", "1m", "--shared"},
			{"--once-per", "s1", "--retention", "1m", "--limit", "2"},
		} {
			argv := append(append([]string{"run", "--endpoints", ep}, args...), name, "--", "true")
			runCLI(t, nil, argv...).want(t, exitUsage)
		}
		if rec := record(t, name, "s1"); rec != nil {
			t.Fatalf("a record after bad flags: %v", rec)
		}
	})
}
