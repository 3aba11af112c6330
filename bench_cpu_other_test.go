//go:build !unix

package etcdlock_test

import "time"

// benchCPU reports that the process's CPU time is not measured on this
// system: the benchmarks then leave out cpu-us/op and cpu-cores.
func benchCPU() (time.Duration, bool) { return 0, false }
