//go:build unix

package main

import (
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/syncbuf"
)

// TestRunMetrics runs etcdlock run with --metrics-addr and --log-level in
// this process, scrapes its metrics while COMMAND runs, and checks that the
// server is gone once run returns.
func TestRunMetrics(t *testing.T) {
	srv := etcdtest.Start(t)
	name := lockName(t)
	dir := t.TempDir()
	ready, finish := filepath.Join(dir, "ready"), filepath.Join(dir, "finish")
	stderr := &syncbuf.Buffer{}
	args := []string{"run", "--endpoints", srv.Endpoints()[0], "--metrics-addr", "127.0.0.1:0", "--log-level", "debug",
		name, "--", "sh", "-c", `echo ready >"$0"; while [ ! -e "$1" ]; do sleep 0.05; done`, ready, finish}
	code := -1
	done := make(chan struct{})
	go func() {
		defer close(done)
		code = cli(args, stdio{out: io.Discard, err: stderr, getenv: func(string) string { return "" }})
	}()
	finished := false
	end := func() {
		if !finished {
			finished = true
			if err := os.WriteFile(finish, nil, 0o600); err != nil {
				t.Errorf("write %s: %v", finish, err)
			}
			<-done
		}
	}
	t.Cleanup(end)

	// The address, with the port the system chose, is logged at info.
	served := regexp.MustCompile(`msg="etcdlock: serving metrics" addr=(\S+) path=/metrics`)
	var addr string
	waitFor(t, "the metrics address in the log", func() bool {
		if m := served.FindStringSubmatch(stderr.String()); m != nil {
			addr = m[1]
		}
		return addr != ""
	})
	waitFile(t, ready, "ready")
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: opTimeout}
	url := "http://" + addr + "/metrics"
	want := []string{
		`etcdlock_acquisitions_total{contended="false",outcome="acquired",primitive="mutex"} 1`,
		`etcdlock_holds{primitive="mutex"} 1`,
		`go_goroutines `,
	}
	var body string
	waitFor(t, "the lock's metrics", func() bool {
		resp, err := client.Get(url)
		if err != nil {
			t.Fatalf("GET %s while COMMAND runs: %v", url, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: got %s, %v; want 200 OK", url, resp.Status, err)
		}
		body = string(b)
		for _, w := range want {
			if !strings.Contains(body, w) {
				return false
			}
		}
		return true
	})

	end()
	if code != 0 {
		t.Fatalf("exit status: got %d, want 0\nstderr:\n%s", code, stderr.String())
	}
	if _, err := net.DialTimeout("tcp", addr, opTimeout); err == nil {
		t.Errorf("metrics server at %s: still accepting after run returned", addr)
	}
	// The Session's events, logged by WithLogger at debug.
	for _, w := range []string{
		`level=DEBUG msg="etcdlock: acquire ended" lock=` + name + ` primitive=mutex key=` + name + `/`,
		`level=DEBUG msg="etcdlock: released" lock=` + name,
	} {
		if !strings.Contains(stderr.String(), w) {
			t.Errorf("stderr: got\n%s\nwant a line with %q", stderr.String(), w)
		}
	}
}

// TestObserveFlagsBadInput checks --log-level and --metrics-addr mistakes:
// usage errors, before etcd is asked anything.
func TestObserveFlagsBadInput(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--log-level", "loud", "n", "--", "true"}, "-log-level"},
		{[]string{"run", "--metrics-addr", busy.Addr().String(), "n", "--", "true"}, "--metrics-addr"},
		{[]string{"run", "--metrics-addr", "no-port", "n", "--", "true"}, "--metrics-addr"},
	} {
		code, _, stderr := callCLI(nil, tc.args...)
		if code != exitUsage || !strings.Contains(stderr, tc.want) {
			t.Errorf("etcdlock %q: got %d, %q; want %d and %q", tc.args, code, stderr, exitUsage, tc.want)
		}
	}
	code, stdout, _ := callCLI(nil, "help", "run")
	if code != 0 || !strings.Contains(stdout, "--metrics-addr address") || !strings.Contains(stdout, "--log-level level") {
		t.Errorf("help run: got %d, %q; want 0 and the observability flags", code, stdout)
	}
}

// waitFor polls cond until it holds, and fails the test if it does not
// within opTimeout.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(opTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s: never", opTimeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
