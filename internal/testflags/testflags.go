// Package testflags holds what this module's TestMain functions share.
package testflags

import (
	"flag"
	"strconv"
	"testing"
)

// ShortParallel lets up to n parallel tests run at once under -short,
// unless the command line sets -parallel itself. Call it from TestMain,
// before m.Run.
//
// The tests that call t.Parallel spend most of their time waiting for
// leases, timers and etcd, not on the CPU, so that the default (GOMAXPROCS,
// 2 on a 2-core machine) leaves the machine idle. The full run keeps the
// default: it runs with -race and its fault runs are heavier.
func ShortParallel(n int) {
	if !flag.Parsed() {
		flag.Parse()
	}
	if !testing.Short() {
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

// ParallelShort marks t as a parallel test under -short, and does nothing
// otherwise: the full run (with -race in CI) keeps its tests one at a time,
// as its fault runs, the race detector and the timing of fault injection
// (the fault matrix's) want the CPU to themselves.
func ParallelShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Parallel()
	}
}
