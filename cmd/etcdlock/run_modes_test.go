//go:build unix

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// logUntilGo logs "start" and "end" lines to $LOG around a wait for the
// file $GO.
var logUntilGo = []string{"sh", "-c", `echo start >>"$LOG"; while [ ! -e "$GO" ]; do sleep 0.05; done; echo end >>"$LOG"`}

// logLines returns the lines of the log at path.
func logLines(path string) []string {
	b, _ := os.ReadFile(path)
	return strings.Fields(string(b))
}

// waitLog waits until the log at path has n lines "start".
func waitLog(t *testing.T, path string, n int) {
	t.Helper()
	deadline := time.Now().Add(opTimeout)
	for strings.Count(strings.Join(logLines(path), " "), "start") < n {
		if time.Now().After(deadline) {
			t.Fatalf("log: got %q, want %d starts", logLines(path), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// countRows returns how many rows of holders' table have the role (its
// first word) and kind.
func countRows(table, role, kind string) int {
	n := 0
	for line := range strings.SplitSeq(table, "\n") {
		f := strings.Fields(line)
		if len(f) > 2 && f[0] == role && (f[1] == kind || role == "waiter" && f[2] == kind) {
			n++
		}
	}
	return n
}

// maxRunning returns the most runs that ran at once, from a log of starts
// and ends.
func maxRunning(lines []string) int {
	n, most := 0, 0
	for _, l := range lines {
		if l == "start" {
			n++
		} else {
			n--
		}
		most = max(most, n)
	}
	return most
}

// TestRunShared: --shared runs hold together, and none holds beside a run
// without --shared, either way round; holders shows them as readers.
func TestRunShared(t *testing.T) {
	testflags.Parallel(t)
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	ep := srv.Endpoints()[0]
	name := lockName(t)
	dir := t.TempDir()
	log, goFile := filepath.Join(dir, "log"), filepath.Join(dir, "go")
	env := []string{"LOG=" + log, "GO=" + goFile}

	readers := []*proc{
		startCLI(t, env, append([]string{"run", "--endpoints", ep, "--shared", name, "--"}, logUntilGo...)...),
		startCLI(t, env, append([]string{"run", "--endpoints", ep, "--shared", name, "--"}, logUntilGo...)...),
	}
	waitLog(t, log, 2) // both run at once

	r := runCLI(t, nil, "holders", "--endpoints", ep, name)
	r.want(t, 0)
	if countRows(r.stdout, "holder", "read") != 2 {
		t.Errorf("holders: got\n%s\nwant 2 holders of kind read", r.stdout)
	}
	r = runCLI(t, nil, "run", "--endpoints", ep, "--wait", "0", name, "--", "true")
	r.want(t, exitBusy)
	if !strings.Contains(r.stderr, "is busy") {
		t.Errorf("stderr: got %q, want it to say the lock is busy", r.stderr)
	}

	// A run without --shared waits for both readers.
	writer := startCLI(t, env, append([]string{"run", "--endpoints", ep, name, "--"}, logUntilGo...)...)
	time.Sleep(500 * time.Millisecond)
	if got := logLines(log); len(got) != 2 {
		t.Fatalf("log: got %q, want the two readers' starts only: the exclusive run started beside them", got)
	}
	if err := os.WriteFile(goFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range append(readers, writer) {
		p.wait(t).want(t, 0)
	}
	if got, want := strings.Join(logLines(log), " "), "start start end end start end"; got != want {
		t.Errorf("log: got %q, want %q", got, want)
	}

	// While a run without --shared holds, a --shared run is busy.
	p, release := startHolding(t, cli, ep, name)
	r = runCLI(t, nil, "run", "--endpoints", ep, "--shared", "--wait", "0", name, "--", "true")
	r.want(t, exitBusy)
	if !strings.Contains(r.stderr, "busy for a shared hold") {
		t.Errorf("stderr: got %q, want it to say the lock is busy for a shared hold", r.stderr)
	}
	release()
	p.wait(t).want(t, 0)
}

// TestRunLimit: --limit 2 lets two runs hold at once, never three;
// holders shows the permits and the waiter.
func TestRunLimit(t *testing.T) {
	testflags.Parallel(t)
	srv := etcdtest.Start(t)
	ep := srv.Endpoints()[0]
	name := lockName(t)
	dir := t.TempDir()
	log, goFile := filepath.Join(dir, "log"), filepath.Join(dir, "go")
	env := []string{"LOG=" + log, "GO=" + goFile}

	var procs []*proc
	for range 3 {
		procs = append(procs, startCLI(t, env, append([]string{"run", "--endpoints", ep, "--limit", "2", name, "--"}, logUntilGo...)...))
	}
	waitLog(t, log, 2)
	time.Sleep(500 * time.Millisecond)
	if got := logLines(log); len(got) != 2 {
		t.Fatalf("log: got %q, want two starts: a third run started beside two", got)
	}
	r := runCLI(t, nil, "holders", "--endpoints", ep, name)
	r.want(t, 0)
	if countRows(r.stdout, "holder", "semaphore") != 2 || countRows(r.stdout, "waiter", "semaphore") != 1 {
		t.Errorf("holders: got\n%s\nwant 2 holders and a waiter of kind semaphore", r.stdout)
	}
	r = runCLI(t, nil, "run", "--endpoints", ep, "--limit", "2", "--wait", "0", name, "--", "true")
	r.want(t, exitBusy)
	if !strings.Contains(r.stderr, "all its 2 permits are taken") {
		t.Errorf("stderr: got %q, want it to say both permits are taken", r.stderr)
	}

	if err := os.WriteFile(goFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		p.wait(t).want(t, 0)
	}
	lines := logLines(log)
	if len(lines) != 6 || maxRunning(lines) != 2 {
		t.Errorf("log: got %q, want three runs, at most two at once", lines)
	}

	// An exclusive run's key is no permit of 2.
	p, release := startHolding(t, srv.Client(t), ep, name)
	r = runCLI(t, nil, "run", "--endpoints", ep, "--limit", "2", "--wait", "0", name, "--", "true")
	r.want(t, exitUsage)
	if !strings.Contains(r.stderr, "--limit 2") {
		t.Errorf("stderr: got %q, want it to name --limit 2", r.stderr)
	}
	release()
	p.wait(t).want(t, 0)
}
