// Package testflags holds what this module's TestMain functions share: the
// choice between the quick suite (go test ./..., the default) and the long
// fault runs (ETCDLOCK_LONG=1, which .ci/run sets).
package testflags

import (
	"flag"
	"os"
	"strconv"
	"testing"
)

// LongEnv is the environment variable that asks for the long fault runs:
// chaos, holder processes, checked histories, the full fault matrix, the
// model-based sequences at length. Any value but "" or "0" asks for them;
// -short never runs them.
const LongEnv = "ETCDLOCK_LONG"

// Long reports whether this run is the long one: LongEnv set, and not
// -short. Tests of many seconds run only then, and tests that inject faults
// on a budget take the long budget.
func Long() bool {
	if !flag.Parsed() {
		flag.Parse()
	}
	v := os.Getenv(LongEnv)
	return v != "" && v != "0" && !testing.Short()
}

// SetParallel lets up to n parallel tests run at once in the quick suite,
// unless the command line sets -parallel itself. Call it from TestMain,
// before m.Run.
//
// The tests that call Parallel spend most of their time waiting for
// leases, timers and etcd, not on the CPU, so that the default (GOMAXPROCS,
// 2 on a 2-core machine) leaves the machine idle. The long run keeps the
// default: its fault runs time their faults and want the CPU to themselves.
func SetParallel(n int) {
	if Long() {
		return
	}
	set := false
	flag.Visit(func(f *flag.Flag) {
		if f.Name == "test.parallel" {
			set = true
		}
	})
	if !set {
		_ = flag.Set("test.parallel", strconv.Itoa(n))
	}
}

// Parallel marks t as a parallel test in the quick suite, and does nothing
// in the long run, which keeps its tests one at a time.
func Parallel(t *testing.T) {
	t.Helper()
	if !Long() {
		t.Parallel()
	}
}
