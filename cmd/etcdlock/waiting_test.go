//go:build unix

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// waitForFile is a command that holds the lock until the file $GO exists.
var waitForFile = []string{"sh", "-c", `while [ ! -e "$GO" ]; do sleep 0.05; done`}

// startHolding starts etcdlock run with args before NAME, holding name until
// the returned function is called; it returns once the lock is held.
func startHolding(t *testing.T, cli *clientv3.Client, ep, name string, args ...string) (*proc, func()) {
	t.Helper()
	goFile := filepath.Join(t.TempDir(), "go")
	argv := append(append([]string{"run", "--endpoints", ep}, args...), append([]string{name, "--"}, waitForFile...)...)
	p := startCLI(t, []string{"GO=" + goFile}, argv...)
	waitKeys(t, cli, name, 1)
	return p, func() {
		if err := os.WriteFile(goFile, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// identities returns the identities in the queue of name, holders first.
func identities(t *testing.T, cli *clientv3.Client, name string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	entries, err := etcdlock.Inspect(ctx, cli, name)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	ids := make([]string, len(entries))
	for i, e := range entries {
		ids[i] = e.Identity
	}
	return ids
}

// TestRunIdentity: run stores host and pid in its key, no argument of
// COMMAND; the command too with --identity-cmd; or --identity.
func TestRunIdentity(t *testing.T) {
	testflags.Parallel(t)
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	ep := srv.Endpoints()[0]
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want func(pid int) string
	}{
		{"default", nil, func(pid int) string { return fmt.Sprintf("host=%s pid=%d", host, pid) }},
		{"--identity-cmd", []string{"--identity-cmd"}, func(pid int) string {
			return fmt.Sprintf(`host=%s pid=%d cmd=sh -c 'while [ ! -e "$GO" ]; do sleep 0.05; done'`, host, pid)
		}},
		{"--identity", []string{"--identity", "nightly report #7"}, func(int) string { return "nightly report #7" }},
		{"--identity empty", []string{"--identity="}, func(int) string { return "" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := lockName(t)
			p, release := startHolding(t, cli, ep, name, tc.args...)
			got := identities(t, cli, name)
			for deadline := time.Now().Add(opTimeout); len(got) < 2 && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond) // the write lock comes after the Mutex
				got = identities(t, cli, name)
			}
			release()
			p.wait(t).want(t, 0)
			// An exclusive run's two keys: its Mutex's and its write lock's.
			if want := tc.want(p.cmd.Process.Pid); len(got) != 2 || got[0] != want || got[1] != want {
				t.Fatalf("identity: got %q, want [%q %q]", got, want, want)
			}
		})
	}
}

// TestRunReportsHolder: a run that waits says who holds the lock once it
// has waited holderReportAfter, once per holder: not again when the queue
// changes behind the holder, again when the holder changes.
func TestRunReportsHolder(t *testing.T) {
	testflags.Parallel(t)
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	ep := srv.Endpoints()[0]
	name := lockName(t)

	first, releaseFirst := startHolding(t, cli, ep, name)
	firstID := identities(t, cli, name)[0]
	// The second holder, queued before the run under test.
	second := etcdlock.NewMutex(newSession(t, cli, etcdlock.WithIdentity("second holder")), name)
	secondHeld := make(chan error, 1)
	releaseSecond := make(chan struct{})
	secondDone := make(chan struct{})
	sctx, stopSecond := context.WithCancel(context.Background())
	go func() {
		defer close(secondDone)
		err := second.LockContext(sctx)
		secondHeld <- err
		if err != nil {
			return
		}
		select {
		case <-releaseSecond:
		case <-sctx.Done():
		}
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if err := second.UnlockContext(ctx); err != nil {
			t.Errorf("second holder: unlock: %v", err)
		}
	}()
	defer func() {
		stopSecond()
		<-secondDone
	}()
	waitKeys(t, cli, name, 2)

	waiter := startCLI(t, nil, "run", "--endpoints", ep, name, "--", "true")
	waitKeys(t, cli, name, 3)
	line := waitLine(t, waiter, 1)
	if took := time.Since(waiter.start); took < holderReportAfter {
		t.Errorf("said who holds the lock %v after it started, want not before %v", took, holderReportAfter)
	}
	if !strings.Contains(line, "held for at least ") || !strings.Contains(line, "by "+firstID+" (key ") {
		t.Errorf("stderr: got %q, want the first holder's identity %q, and for how long", line, firstID)
	}

	// A waiter behind the run comes and goes: the holder is the same.
	other := etcdlock.NewMutex(newSession(t, cli, etcdlock.WithIdentity("passer-by")), name)
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- other.LockContext(ctx) }()
	waitKeys(t, cli, name, 4)
	cancel()
	<-errc
	waitKeys(t, cli, name, 3)
	time.Sleep(500 * time.Millisecond) // time to read the queue again, and say nothing

	releaseFirst()
	first.wait(t).want(t, 0)
	if err := <-secondHeld; err != nil {
		t.Fatalf("second holder: lock: %v", err)
	}
	line = waitLine(t, waiter, 2)
	if !strings.Contains(line, "held by second holder (key "+second.Key()+", token ") {
		t.Errorf("stderr: got %q, want the second holder's identity and key %s", line, second.Key())
	}
	close(releaseSecond)
	r := waiter.wait(t)
	r.want(t, 0)
	if n := strings.Count(r.stderr, "waiting for the lock"); n != 2 || strings.Contains(r.stderr, "passer-by") {
		t.Fatalf("stderr: got %d reports, want 2, one per holder:\n%s", n, r.stderr)
	}
	t.Logf("stderr of the waiting run:\n%s", r.stderr)
}

// waitLine waits until p's stderr has n lines and returns the last.
func waitLine(t *testing.T, p *proc, n int) string {
	t.Helper()
	deadline := time.Now().Add(holderReportAfter + opTimeout)
	for {
		if s := p.stderr.String(); strings.Count(s, "\n") >= n {
			return strings.Split(s, "\n")[n-1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("stderr: got %q, want %d lines", p.stderr.String(), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
