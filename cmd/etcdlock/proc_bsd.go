//go:build unix && !linux

package main

import (
	"errors"
	"syscall"
)

// groupAlive reports whether a process is left in the group led by pid,
// zombies included.
func groupAlive(pid int) bool {
	err := syscall.Kill(-pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
