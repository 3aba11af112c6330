//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package main

import (
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// foregroundTTY returns the descriptor of in if it is a terminal whose
// foreground process group is etcdlock's: COMMAND may then read it, as the
// foreground job. A background etcdlock (cmd &) leaves the terminal alone.
func foregroundTTY(in *os.File) (fd int, ok bool) {
	if in == nil {
		return 0, false
	}
	fd = int(in.Fd())
	pgrp, err := unix.IoctlGetInt(fd, unix.TIOCGPGRP)
	return fd, err == nil && pgrp == syscall.Getpgrp()
}

// inForeground makes the child's new process group the terminal's
// foreground group as it starts: Ctty is the terminal's descriptor in
// etcdlock.
func inForeground(attr *syscall.SysProcAttr, tty int) {
	attr.Foreground = true
	attr.Ctty = tty
}

// takeForeground makes etcdlock's process group the foreground group of
// the terminal tty again. etcdlock is in the background until then, where
// that call would stop it with SIGTTOU: the signal is ignored meanwhile.
func takeForeground(tty int) error {
	signal.Ignore(syscall.SIGTTOU)
	defer signal.Reset(syscall.SIGTTOU)
	return unix.IoctlSetPointerInt(tty, unix.TIOCSPGRP, syscall.Getpgrp())
}
