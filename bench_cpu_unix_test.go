//go:build unix

package etcdlock_test

import (
	"syscall"
	"time"
)

// benchCPU returns the CPU time the process has used so far, user and
// system, over all its threads: with etcd embedded, the server's and every
// client's together.
func benchCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
