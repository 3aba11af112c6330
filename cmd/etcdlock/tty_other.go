//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package main

import (
	"os"
	"syscall"
)

// foregroundTTY: COMMAND is never made the terminal's foreground job here.
func foregroundTTY(*os.File) (int, bool) { return 0, false }

func inForeground(*syscall.SysProcAttr, int) {}

func takeForeground(int) error { return nil }
