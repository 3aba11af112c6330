//go:build unix

package main

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// forwardedSignals are passed on to COMMAND's process group while it runs;
// while etcdlock waits for the lock, they make it give up.
var forwardedSignals = []os.Signal{
	syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2,
}

// childAttr starts COMMAND as the leader of a new process group, so that
// signals reach the processes it starts too.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// signalGroup sends sig to the process group led by pid. A group with no
// process left is not an error.
func signalGroup(pid int, sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return fmt.Errorf("cannot forward signal %v", sig)
	}
	err := syscall.Kill(-pid, s)
	if err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal %v to process group %d: %w", sig, pid, err)
	}
	return nil
}
