//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

func TestRunNoOverlap(t *testing.T) {
	testflags.Parallel(t)
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	name := lockName(t)
	log := filepath.Join(t.TempDir(), "log")
	script := `echo "start $ETCDLOCK_TOKEN $ETCDLOCK_KEY $ETCD_LOCK_KEY $ETCD_LOCK_REV $ETCDLOCK_FENCE" >>"$LOG"; sleep 0.2; echo "end $ETCDLOCK_TOKEN" >>"$LOG"`

	const runs = 3
	procs := make([]*proc, runs)
	for i := range procs {
		procs[i] = startCLI(t, []string{"LOG=" + log}, "run", "--endpoints", srv.Endpoints()[0], name, "--", "sh", "-c", script)
	}
	for _, p := range procs {
		p.wait(t).want(t, 0)
	}

	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 2*runs {
		t.Fatalf("log: got %d lines, want %d:\n%s", len(lines), 2*runs, b)
	}
	var last int64
	for i := 0; i < len(lines); i += 2 {
		start, end := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(start) != 6 || start[0] != "start" || len(end) != 2 || end[0] != "end" || end[1] != start[1] {
			t.Fatalf("log lines %d-%d: got %q, %q, want a start then the end of the same token:\n%s", i+1, i+2, lines[i], lines[i+1], b)
		}
		token, err := strconv.ParseInt(start[1], 10, 64)
		if err != nil || token <= last {
			t.Fatalf("token %d: got %q, want a number above %d:\n%s", i/2+1, start[1], last, b)
		}
		last = token
		key := start[2]
		if !strings.HasPrefix(key, name+"/") || start[3] != key || start[4] != start[1] {
			t.Fatalf("env: got ETCDLOCK_KEY=%s ETCD_LOCK_KEY=%s ETCD_LOCK_REV=%s, want keys %s/<lease> and the revision %s", key, start[3], start[4], name, start[1])
		}
		if f, err := etcdlock.ParseFence(start[5]); err != nil || f != (etcdlock.Fence{Name: name, Key: key, Token: token}) {
			t.Fatalf("ETCDLOCK_FENCE=%s: read as %+v, %v; want the lock %s, key %s, token %d", start[5], f, err, name, key, token)
		}
	}
	if keys := lockKeys(t, cli, name); len(keys) != 0 {
		t.Fatalf("keys after the runs: got %v, want none", keys)
	}
}

func TestRunExitStatus(t *testing.T) {
	testflags.Parallel(t)
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	notExec := filepath.Join(t.TempDir(), "not-executable")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		command []string
		want    int
	}{
		{"success", []string{"true"}, 0},
		{"exit 3", []string{"sh", "-c", "exit 3"}, 3},
		{"killed by SIGKILL", []string{"sh", "-c", "kill -KILL $$"}, 128 + 9},
		{"not found", []string{"etcdlock-test-no-such-command"}, exitNotFound},
		{"not executable", []string{notExec}, exitCannotRun},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := lockName(t)
			args := append([]string{"run", "--endpoints", srv.Endpoints()[0], name, "--"}, tc.command...)
			runCLI(t, nil, args...).want(t, tc.want)
			if keys := lockKeys(t, cli, name); len(keys) != 0 {
				t.Fatalf("keys after the run: got %v, want none", keys)
			}
		})
	}
}

func TestRunBusy(t *testing.T) {
	testflags.Parallel(t)
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	name := lockName(t)
	holder := holdLock(t, cli, name)
	marker := filepath.Join(t.TempDir(), "ran")
	ep := srv.Endpoints()[0]

	t.Run("wait 0", func(t *testing.T) {
		// Flags may also follow NAME.
		r := runCLI(t, nil, "run", "--endpoints", ep, name, "--wait", "0", "--", "touch", marker)
		r.want(t, exitBusy)
		if r.took > 5*time.Second {
			t.Errorf("--wait 0 took %v, want a single try", r.took)
		}
	})
	t.Run("wait 300ms", func(t *testing.T) {
		r := runCLI(t, nil, "run", "--endpoints", ep, "--wait", "300ms", name, "--", "touch", marker)
		r.want(t, exitBusy)
		if r.took < 300*time.Millisecond {
			t.Errorf("--wait 300ms took %v, want at least 300ms", r.took)
		}
	})
	if _, err := os.Stat(marker); err == nil {
		t.Fatalf("the command ran although the lock was busy")
	}
	if keys := lockKeys(t, cli, name); len(keys) != 1 || keys[0].key != holder.Key() {
		t.Fatalf("keys: got %v, want only the holder's %s", keys, holder.Key())
	}

	if err := holder.UnlockContext(t.Context()); err != nil {
		t.Fatalf("Unlock: got %v, want nil", err)
	}
	runCLI(t, nil, "run", "--endpoints", ep, "--wait", "0", name, "--", "touch", marker).want(t, 0)
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("the command did not run once the lock was free: %v", err)
	}
}

// TestRunBusyFlock: the busy case as scripts written for flock(1) expect
// it: its exit status (-E), silence on request (-q), and otherwise a message
// that names the holder.
func TestRunBusyFlock(t *testing.T) {
	testflags.Parallel(t)
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	name := lockName(t)
	const who = "host=cron-1 pid=42 nightly"
	m := etcdlock.NewMutex(newSession(t, cli, etcdlock.WithIdentity(who)), name)
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	if err := m.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	ep := srv.Endpoints()[0]
	for _, tc := range []struct {
		name   string
		flags  []string
		want   int
		stderr string // "" for none at all
	}{
		{"wait 0", []string{"--wait", "0"}, exitBusy, "busy: " + who + " (key " + m.Key()},
		{"wait 0, conflict exit code", []string{"--wait", "0", "--conflict-exit-code", "3"}, 3, who},
		{"wait 0, -q", []string{"--wait", "0", "-q"}, exitBusy, ""},
		{"wait 300ms, --quiet, conflict exit code 1", []string{"--wait", "300ms", "--quiet", "--conflict-exit-code", "1"}, 1, ""},
		{"wait 300ms", []string{"--wait", "300ms"}, exitBusy, who + " (key " + m.Key() + fmt.Sprintf(", token %d) still held it after --wait 300ms", m.Token())},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append([]string{"run", "--endpoints", ep}, tc.flags...), name, "--", "true")
			r := runCLI(t, nil, args...)
			r.want(t, tc.want)
			switch {
			case tc.stderr == "" && r.stderr != "":
				t.Errorf("stderr: got %q, want nothing", r.stderr)
			case !strings.Contains(r.stderr, tc.stderr):
				t.Errorf("stderr: got %q, want it to contain %q", r.stderr, tc.stderr)
			}
		})
	}
}

// TestRunExcludesUpstream: a lock taken with etcd's concurrency.Mutex (as
// etcdctl lock takes it) keeps etcdlock run out, and holders shows it.
func TestRunExcludesUpstream(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	name := lockName(t)
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(10))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m := concurrency.NewMutex(s, name)
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	ep := srv.Endpoints()[0]
	runCLI(t, nil, "run", "--endpoints", ep, "--wait", "0", name, "--", "true").want(t, exitBusy)
	r := runCLI(t, nil, "holders", "--endpoints", ep, name)
	r.want(t, 0)
	if !strings.Contains(r.stdout, m.Key()) {
		t.Fatalf("holders: got %q, want the concurrency.Mutex key %s", r.stdout, m.Key())
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	runCLI(t, nil, "run", "--endpoints", ep, "--wait", "0", name, "--", "true").want(t, 0)
}

func TestRunSignalWhileWaiting(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			name := lockName(t)
			holder := holdLock(t, cli, name)
			marker := filepath.Join(t.TempDir(), "ran")
			p := startCLI(t, nil, "run", "--endpoints", srv.Endpoints()[0], name, "--", "touch", marker)
			waitKeys(t, cli, name, 2) // the run is queued behind the holder
			if err := p.cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			p.wait(t).want(t, 128+int(sig))
			if keys := lockKeys(t, cli, name); len(keys) != 1 || keys[0].key != holder.Key() {
				t.Fatalf("keys right after: got %v, want only the holder's %s", keys, holder.Key())
			}
			if _, err := os.Stat(marker); err == nil {
				t.Fatalf("the command ran although etcdlock was stopped while waiting")
			}
		})
	}
}

// TestRunIgnoredSignal: a signal ignored when etcdlock starts, as under
// nohup, does not stop its wait.
func TestRunIgnoredSignal(t *testing.T) {
	testflags.Parallel(t)
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	name := lockName(t)
	holder := holdLock(t, cli, name)
	p := startCLIVia(t, []string{"sh", "-c", `trap '' HUP; exec "$@"`, "sh"}, nil,
		"run", "--endpoints", srv.Endpoints()[0], name, "--", "true")
	waitKeys(t, cli, name, 2)
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if keys := lockKeys(t, cli, name); len(keys) != 2 {
		t.Fatalf("keys after SIGHUP: got %v, want the holder's and the waiting run's", keys)
	}
	if err := holder.UnlockContext(t.Context()); err != nil {
		t.Fatalf("Unlock: got %v, want nil", err)
	}
	p.wait(t).want(t, 0)
}

func TestRunSignalForwarded(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	name := lockName(t)
	out := filepath.Join(t.TempDir(), "out")
	// The shell exits 7 on SIGTERM; its sleep, in the same process group,
	// gets the signal too.
	script := `trap 'echo got-TERM >>"$OUT"; exit 7' TERM; echo ready >>"$OUT"; while :; do sleep 0.05; done`
	p := startCLI(t, []string{"OUT=" + out}, "run", "--endpoints", srv.Endpoints()[0], name, "--", "sh", "-c", script)
	waitFile(t, out, "ready")
	if keys := lockKeys(t, cli, name); len(keys) != 1 {
		t.Fatalf("keys while running: got %v, want 1", keys)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.wait(t).want(t, 7)
	waitFile(t, out, "got-TERM")
	if keys := lockKeys(t, cli, name); len(keys) != 0 {
		t.Fatalf("keys after: got %v, want none", keys)
	}
}

func TestRunLockLost(t *testing.T) {
	testflags.Parallel(t)
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	revoke := func(ctx context.Context, k *keyInfo) error {
		_, err := cli.Revoke(ctx, k.lease)
		return err
	}
	deleteKey := func(ctx context.Context, k *keyInfo) error {
		_, err := cli.Delete(ctx, k.key)
		return err
	}
	for _, tc := range []struct {
		name   string
		script string // writes its PID, then that of a background child, to $PIDS
		grace  time.Duration
		lose   func(context.Context, *keyInfo) error
		why    string // in the exit message
	}{
		// The shell and its background sleep both die of SIGTERM.
		{"revoked, stops on SIGTERM", `echo $$ >"$PIDS"; sleep 60 & echo $! >>"$PIDS"; wait`, 5 * time.Second, revoke, "its lease was revoked, or expired"},
		{"key deleted, stops on SIGTERM", `echo $$ >"$PIDS"; sleep 60 & echo $! >>"$PIDS"; wait`, 5 * time.Second, deleteKey, "its key was deleted while its lease lived"},
		// Both ignore SIGTERM: SIGKILL after the grace period.
		{"revoked, ignores SIGTERM", `trap '' TERM; echo $$ >"$PIDS"; sleep 60 & echo $! >>"$PIDS"; wait`, 500 * time.Millisecond, revoke, "its lease was revoked, or expired"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := lockName(t)
			pids := filepath.Join(t.TempDir(), "pids")
			p := startCLI(t, []string{"PIDS=" + pids}, "run", "--endpoints", srv.Endpoints()[0],
				"--ttl", "2s", "--kill-grace", tc.grace.String(), name, "--", "sh", "-c", tc.script)
			child, grandchild := readPIDs(t, pids)

			keys := waitKeys(t, cli, name, 1)
			lost := time.Now()
			ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
			defer cancel()
			if err := tc.lose(ctx, keys[0]); err != nil {
				t.Fatalf("losing the lock: got %v, want nil", err)
			}
			r := p.wait(t)
			r.want(t, exitLost)
			took := time.Since(lost)
			t.Logf("exited %v after the lock was lost; stderr:\n%s", took, r.stderr)
			// Done closes within about 100 ms; the bounds leave room for
			// slow machines.
			if took > tc.grace+5*time.Second {
				t.Errorf("exited %v after the lock was lost, want within %v", took, tc.grace+5*time.Second)
			}
			if tc.grace < time.Second && took < tc.grace {
				t.Errorf("exited %v after the lock was lost, want SIGKILL only after the grace %v", took, tc.grace)
			}
			if !strings.Contains(r.stderr, "lost the lock") || !strings.Contains(r.stderr, tc.why) {
				t.Errorf("stderr: got %q, want it to say the lock was lost: %s", r.stderr, tc.why)
			}
			for _, pid := range []int{child, grandchild} {
				if !processGone(pid) {
					t.Errorf("process %d still runs after etcdlock exited", pid)
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		})
	}
}

// TestRunKeepAliveSilence cuts etcdlock off from etcd: the command must be
// stopped before etcd expires the lease, so before anyone else can get the
// lock.
func TestRunKeepAliveSilence(t *testing.T) {
	testflags.Parallel(t)
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	_, proxy := srv.ProxiedClient(t)
	name := lockName(t)
	pids := filepath.Join(t.TempDir(), "pids")
	p := startCLI(t, []string{"PIDS=" + pids}, "run", "--endpoints", proxy.Endpoints()[0],
		"--ttl", "4s", "--kill-grace", "5s", name, "--", "sh", "-c", `echo $$ >"$PIDS"; exec sleep 60`)
	child := readPID(t, pids)
	keys := waitKeys(t, cli, name, 1)

	proxy.Blackhole()
	cut := time.Now()
	for !processGone(child) {
		if time.Since(cut) > opTimeout {
			proxy.Unblackhole()
			t.Fatalf("the command still runs %v after etcd went silent", opTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	stopped := time.Since(cut)
	after := lockKeys(t, cli, name)
	proxy.Unblackhole()
	t.Logf("command stopped %v after etcd went silent (TTL 4s)", stopped)
	if len(after) != 1 || after[0].rev != keys[0].rev {
		t.Errorf("keys when the command stopped: got %v, want still %v: it was stopped only after etcd expired the lease", after, keys)
	}
	r := p.wait(t)
	r.want(t, exitLost)
}

// TestRunDefaultsKillBeforeExpiry: with only --ttl, a COMMAND that ignores
// SIGTERM, and its child, are gone before etcd can expire the lease once
// etcdlock is cut off from etcd.
func TestRunDefaultsKillBeforeExpiry(t *testing.T) {
	testflags.Parallel(t)
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	_, proxy := srv.ProxiedClient(t)
	name := lockName(t)
	pids := filepath.Join(t.TempDir(), "pids")
	const ttl = 6 * time.Second
	p := startCLI(t, []string{"PIDS=" + pids}, "run", "--endpoints", proxy.Endpoints()[0], "--ttl", ttl.String(),
		name, "--", "sh", "-c", `trap '' TERM; echo $$ >"$PIDS"; sleep 60 & echo $! >>"$PIDS"; wait`)
	leader, child := readPIDs(t, pids)
	keys := waitKeys(t, cli, name, 1)

	// No acknowledgement reaches etcdlock after the cut: the last one came
	// before it, and the lease can expire TTL after that one at the earliest.
	proxy.Blackhole()
	cut := time.Now()
	for groupAlive(leader) {
		if time.Since(cut) > opTimeout {
			proxy.Unblackhole()
			syscall.Kill(-leader, syscall.SIGKILL)
			t.Fatalf("the command's group still runs %v after etcd went silent", opTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	gone := time.Since(cut)
	after := lockKeys(t, cli, name)
	proxy.Unblackhole()
	t.Logf("process group gone %v after etcd went silent (--ttl %v, SIGKILL due at %v after the last ack)", gone, ttl, silentAt(ttl)+defaultGrace(ttl))
	// Judged in etcd, not by the wall clock: the lease (and so the key) is
	// still there when the group is gone.
	if len(after) != 1 || after[0].rev != keys[0].rev {
		t.Errorf("keys when the group was gone: got %v, want still %v: it outlived the lease", after, keys)
	}
	for _, pid := range []int{leader, child} {
		if !processGone(pid) {
			t.Errorf("process %d still runs", pid)
		}
	}
	r := p.wait(t)
	r.want(t, exitLost)
	if !strings.Contains(r.stderr, "etcd acknowledged no keep-alive for 2/3 of the TTL 6s") {
		t.Errorf("stderr: got %q, want it to say etcd went silent", r.stderr)
	}
	if strings.Contains(r.stderr, "--kill-grace") {
		t.Errorf("stderr: got %q, want no warning about the default --kill-grace", r.stderr)
	}
}

func TestKillGraceWarning(t *testing.T) {
	for _, tc := range []struct {
		ttl, grace time.Duration
		late       time.Duration // by how much SIGKILL comes after the expiry; <0: none
	}{
		{10 * time.Second, time.Second, -1},
		{6 * time.Second, 5 * time.Second, 3 * time.Second},
		{6 * time.Second, 2 * time.Second, 0},
		{1500 * time.Millisecond, 0, -1}, // rounded up to 2s
	} {
		ttl := roundTTL(tc.ttl)
		late := lateKill(ttl, tc.grace)
		if (tc.late < 0) != (late < 0) || tc.late >= 0 && late != tc.late {
			t.Errorf("lateKill(%v, %v): got %v, want %v", ttl, tc.grace, late, tc.late)
		}
	}
	for _, ttl := range []time.Duration{time.Second, 2 * time.Second, 6 * time.Second, 10 * time.Second, time.Minute, time.Hour} {
		if g := defaultGrace(ttl); lateKill(ttl, g) >= -ttl/7 || g > 10*time.Second {
			t.Errorf("defaultGrace(%v) = %v: SIGKILL %v before the expiry, want at least a sixth of the TTL and a grace of at most 10s", ttl, g, -lateKill(ttl, g))
		}
	}
	// The warning is given before etcdlock connects: no etcd needed.
	_, _, stderr := callCLI(nil, "run", "--endpoints", ",", "--ttl", "6s", "--kill-grace", "5s", "n", "--", "true")
	if !strings.Contains(stderr, "SIGKILL 3s after the lease can expire") {
		t.Errorf("stderr: got %q, want a warning that SIGKILL comes 3s late", stderr)
	}
	_, _, stderr = callCLI(nil, "run", "--endpoints", ",", "--ttl", "6s", "--kill-grace", "1s", "n", "--", "true")
	if strings.Contains(stderr, "warning") {
		t.Errorf("stderr: got %q, want no warning for --kill-grace 1s with --ttl 6s", stderr)
	}
}

// readPIDs reads the two process IDs a test command writes to path.
func readPIDs(t *testing.T, path string) (first, second int) {
	t.Helper()
	deadline := time.Now().Add(opTimeout)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(path)
		if f := strings.Fields(string(b)); len(f) == 2 && strings.HasSuffix(string(b), "\n") {
			first, _ = strconv.Atoi(f[0])
			second, _ = strconv.Atoi(f[1])
			if first > 0 && second > 0 {
				return first, second
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s: want two process IDs", path)
	return 0, 0
}

func TestRunTLS(t *testing.T) {
	testflags.Parallel(t)
	srv := etcdtest.Start(t, etcdtest.WithTLS(), etcdtest.WithClientCertAuth())
	files := srv.TLS()
	ep := srv.Endpoints()[0]
	name := lockName(t)

	t.Run("flags", func(t *testing.T) {
		r := runCLI(t, nil, "run", "--endpoints", ep, "--cacert", files.CAFile, "--cert", files.CertFile, "--key", files.KeyFile,
			name, "--", "sh", "-c", `echo "token=$ETCDLOCK_TOKEN"`)
		r.want(t, 0)
		if !strings.Contains(r.stdout, "token=") || strings.Contains(r.stdout, "token=\n") {
			t.Fatalf("stdout: got %q, want the token", r.stdout)
		}
	})
	t.Run("environment", func(t *testing.T) {
		env := []string{"ETCDCTL_ENDPOINTS=" + ep, "ETCDCTL_CACERT=" + files.CAFile, "ETCDCTL_CERT=" + files.CertFile, "ETCDCTL_KEY=" + files.KeyFile}
		runCLI(t, env, "run", name, "--", "true").want(t, 0)
		r := runCLI(t, env, "holders", name)
		r.want(t, 0)
		if strings.TrimSpace(r.stdout) != "no holder" {
			t.Fatalf("holders: got %q, want no holder", r.stdout)
		}
	})
	t.Run("no client certificate", func(t *testing.T) {
		runCLI(t, nil, "run", "--endpoints", ep, "--cacert", files.CAFile, "--dial-timeout", "1s", name, "--", "true").want(t, exitUnavailable)
	})
}

func TestRunUnreachable(t *testing.T) {
	testflags.Parallel(t)
	ep := closedPort(t)
	const secret = "unreachable-S3CRET"
	for _, args := range [][]string{
		{"run", "--endpoints", ep, "--dial-timeout", "500ms", "--user", "root", "--password", secret, "x", "--", "true"},
		{"holders", "--endpoints", ep, "--dial-timeout", "500ms", "--user", "root:" + secret, "x"},
	} {
		t.Run(args[0], func(t *testing.T) {
			r := runCLI(t, nil, args...)
			r.want(t, exitUnavailable)
			if r.took > 15*time.Second {
				t.Errorf("took %v, want about the dial timeout", r.took)
			}
			if !strings.Contains(r.stderr, ep) {
				t.Errorf("stderr: got %q, want it to name %s", r.stderr, ep)
			}
			if strings.Contains(r.stdout+r.stderr, secret) {
				t.Errorf("output shows the password:\n%s%s", r.stdout, r.stderr)
			}
		})
	}
}

// TestRunUnreachableSaysWhy: a refused connection and an unknown host are
// said as such, long before the dial timeout.
func TestRunUnreachableSaysWhy(t *testing.T) {
	testflags.Parallel(t)
	refused := closedPort(t)
	for _, tc := range []struct {
		name, ep, want string
	}{
		{"refused", refused, refused + ": connection refused"},
		{"unknown host", "etcdlock-test.invalid:2379", `etcdlock-test.invalid:2379: unknown host "etcdlock-test.invalid"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "unknown host" {
				_, err := net.LookupHost("etcdlock-test.invalid")
				if dnsErr, ok := errors.AsType[*net.DNSError](err); !ok || !dnsErr.IsNotFound {
					t.Skipf("the resolver does not say that .invalid hosts do not exist: %v", err)
				}
			}
			r := runCLI(t, nil, "run", "--endpoints", tc.ep, "--dial-timeout", "30s", "x", "--", "true")
			r.want(t, exitUnavailable)
			if !strings.Contains(r.stderr, tc.want) {
				t.Errorf("stderr: got %q, want %q", r.stderr, tc.want)
			}
			if r.took > 10*time.Second {
				t.Errorf("took %v, want well within the dial timeout 30s", r.took)
			}
		})
	}
}

func TestAuth(t *testing.T) {
	testflags.Parallel(t)
	if os.Getenv(etcdtest.EnvEndpoints) != "" {
		// Auth is on or off for a whole etcd: turned on in one shared by
		// other tests, it would lock them out.
		t.Skip("turns etcd's auth on: needs an etcd of its own, not the one ETCDTEST_ENDPOINTS shares")
	}
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	const password = "auth-S3CRET-pw"
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	if _, err := cli.UserAdd(ctx, "root", password); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}
	ep := srv.Endpoints()[0]
	name := lockName(t)
	// Authentication is slow under the race detector (bcrypt): a generous
	// dial timeout where it must succeed.
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want int
	}{
		{"run with flags", nil, []string{"run", "--user", "root", "--password", password, "--dial-timeout", "20s", name, "--", "true"}, 0},
		{"holders with environment", []string{"ETCDCTL_USER=root", "ETCDCTL_PASSWORD=" + password}, []string{"holders", "--dial-timeout", "20s", name}, 0},
		{"run with a wrong password", nil, []string{"run", "--user", "root:" + password + "-wrong", "--dial-timeout", "20s", name, "--", "true"}, exitUnavailable},
		{"holders without credentials", nil, []string{"holders", name}, exitUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{tc.args[0], "--endpoints", ep}, tc.args[1:]...)
			r := runCLI(t, tc.env, args...)
			r.want(t, tc.want)
			if strings.Contains(r.stdout+r.stderr, password) {
				t.Errorf("output shows the password:\n%s%s", r.stdout, r.stderr)
			}
		})
	}
}

// TestAuthLockRole: under a role with read and write on the lock's prefix
// alone (what etcdctl lock needs), run holds and releases, leaving no key;
// under a role with read on it alone, holders lists a Semaphore's queue
// (without its limit record, as 1.0.0 needed).
func TestAuthLockRole(t *testing.T) {
	testflags.Parallel(t)
	if os.Getenv(etcdtest.EnvEndpoints) != "" {
		t.Skip("turns etcd's auth on: needs an etcd of its own, not the one ETCDTEST_ENDPOINTS shares")
	}
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	name := lockName(t)
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	s, err := etcdlock.NewSession(cli)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, err := etcdlock.NewSemaphore(s, name+"-sem", 2).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release(ctx)
	rw, read := clientv3.PermissionType(clientv3.PermReadWrite), clientv3.PermissionType(clientv3.PermRead)
	steps := []func() error{
		func() error { _, err := cli.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err },
	}
	for _, u := range []struct {
		user, pfx string
		perm      clientv3.PermissionType
	}{{"locker", name + "/", rw}, {"reader", name + "-sem/", read}} {
		steps = append(steps,
			func() error { _, err := cli.RoleAdd(ctx, u.user); return err },
			func() error { _, err := cli.UserAdd(ctx, u.user, u.user+"pw"); return err },
			func() error { _, err := cli.UserGrantRole(ctx, u.user, u.user); return err },
			func() error {
				_, err := cli.RoleGrantPermission(ctx, u.user, u.pfx, clientv3.GetPrefixRangeEnd(u.pfx), u.perm)
				return err
			})
	}
	steps = append(steps, func() error { _, err := cli.AuthEnable(ctx); return err })
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("auth setup, step %d: %v", i, err)
		}
	}
	ep := srv.Endpoints()[0]
	runCLI(t, nil, "run", "--endpoints", ep, "--user", "locker:lockerpw", "--dial-timeout", "20s", name, "--", "true").want(t, 0)
	r := runCLI(t, nil, "holders", "--endpoints", ep, "--user", "reader:readerpw", "--dial-timeout", "20s", name+"-sem")
	r.want(t, 0)
	if !strings.Contains(r.stdout, p.Key()) {
		t.Errorf("holders of the Semaphore: got %q, want its holder %s", r.stdout, p.Key())
	}
	root, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints(), Username: "root", Password: "rootpw", DialTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if keys := lockKeys(t, root, name); len(keys) != 0 {
		t.Errorf("keys after run: got %q, want none", keys)
	}
	if _, err := root.AuthDisable(ctx); err != nil {
		t.Errorf("auth disable: %v", err)
	}
}

// closedPort returns the address of a loopback port that nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestRunSeveralLocks: run --lock A --lock B holds both at once: busy while
// a Mutex holds either, writing nothing then; COMMAND gets the first name's
// key and the shared token; nothing is left after.
func TestRunSeveralLocks(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	ep := srv.Endpoints()[0]
	a, b := lockName(t)+"-a", lockName(t)+"-b"
	held := holdLock(t, cli, b)
	runCLI(t, nil, "run", "--endpoints", ep, "--wait", "0", "--lock", b, "--lock", a, "--", "true").want(t, exitBusy)
	if keys := lockKeys(t, cli, a); len(keys) != 0 {
		t.Fatalf("keys of %s after a busy run: got %v, want none", a, keys)
	}
	// Waiting: queued in both, holding neither.
	out := filepath.Join(t.TempDir(), "out")
	p := startCLI(t, []string{"OUT=" + out}, "run", "--endpoints", ep, "--lock", b, "--lock", a, "--",
		"sh", "-c", `echo "$ETCDLOCK_KEY $ETCDLOCK_TOKEN" >"$OUT"`)
	waitKeys(t, cli, b, 2)
	keyA := waitKeys(t, cli, a, 1)[0]
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	if err := held.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
	p.wait(t).want(t, 0)
	b2, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("the command did not run: %v", err)
	}
	key, token, _ := strings.Cut(strings.TrimSpace(string(b2)), " ")
	if key != keyA.key || token != strconv.FormatInt(keyA.rev, 10) {
		t.Errorf("ETCDLOCK_KEY ETCDLOCK_TOKEN: got %q %q, want %q %d", key, token, keyA.key, keyA.rev)
	}
	for _, name := range []string{a, b} {
		if keys := lockKeys(t, cli, name); len(keys) != 0 {
			t.Errorf("keys of %s after the run: got %v, want none", name, keys)
		}
	}
	for _, args := range [][]string{
		{"--lock", a, "--lock", b, "--shared", "--", "true"},
		{"--lock", a, "--lock", b, "--limit", "2", "--", "true"},
		{a, "--lock", b, "--", "true"},
		{"--lock", a, "--lock", b, "true"},
	} {
		runCLI(t, nil, append([]string{"run", "--endpoints", ep}, args...)...).want(t, exitUsage)
	}
}
