//go:build !unix

package main

import (
	"os"
	"syscall"
)

// forwardedSignals are those a non-Unix system delivers.
var forwardedSignals = []os.Signal{os.Interrupt, syscall.SIGTERM}

// childAttr: without process groups, only COMMAND itself is stopped.
func childAttr() *syscall.SysProcAttr { return nil }

// signalGroup kills the process pid: the only signal such systems deliver.
func signalGroup(pid int, _ os.Signal) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	return p.Kill()
}

func groupAlive(int) bool { return false }
