package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// demoChecks are the beginnings of the demo's checks, in order: one per
// PASS line.
var demoChecks = []string{
	"mutual exclusion",
	"reentrancy",
	"TryLock while held",
	"TryLockFor(200ms) while held",
	"cancelled LockContext",
	"lock loss",
	"read-write: readers overlap",
	"read-write: writers exclude",
	"semaphore: never more than 2 holders",
	"semaphore: in etcd, each holder's key was among the 2 oldest",
	"semaphore: the limit was reached",
	"failover: c1 died",
	"failover: c2 ",
	"failover: one leader at a time",
	"fencing tokens of the lock strictly increase",
	"no key left under",
	"no unexpected errors",
}

func checkDemoOutput(t *testing.T, r result) {
	t.Helper()
	t.Logf("demo took %v:\n%s", r.took, r.stdout)
	r.want(t, 0)
	var checks []string
	for line := range strings.SplitSeq(r.stdout, "\n") {
		if strings.HasPrefix(line, "PASS  ") || strings.HasPrefix(line, "FAIL  ") {
			checks = append(checks, line)
		}
	}
	if len(checks) != len(demoChecks) {
		t.Fatalf("got %d checks, want %d", len(checks), len(demoChecks))
	}
	for i, want := range demoChecks {
		if !strings.HasPrefix(checks[i], "PASS  "+want) {
			t.Errorf("check %d: got %q, want PASS  %s...", i+1, checks[i], want)
		}
	}
	if want := fmt.Sprintf("demo: all %d checks passed in ", len(demoChecks)); !strings.Contains(r.stdout, want) {
		t.Errorf("stdout: want %q", want)
	}
}

// TestDemo runs the demo in this process, so that goleak sees whether it
// leaves a goroutine behind.
func TestDemo(t *testing.T) {
	start := time.Now()
	code, stdout, stderr := callCLI(nil, "demo")
	checkDemoOutput(t, result{code: code, stdout: stdout, stderr: stderr, took: time.Since(start)})
	goleak.VerifyNone(t)
}

func TestDemoExternalEtcd(t *testing.T) {
	testflags.Parallel(t)
	srv := etcdtest.Start(t)
	checkDemoOutput(t, runCLI(t, nil, "demo", "--endpoints", srv.Endpoints()[0], "--workers", "5", "--rounds", "3"))
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	resp, err := srv.Client(t).Get(ctx, "etcdlock-demo/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count != 0 {
		t.Fatalf("keys left under etcdlock-demo/: got %d, want 0", resp.Count)
	}
}
