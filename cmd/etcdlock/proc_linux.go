package main

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"syscall"
)

// groupAlive reports whether a process that is not a zombie is left in the
// group led by pid. Zombies do not count: they run nothing, and the orphans
// among them wait for an init process that may be slow to reap them (or, in
// some containers, never does).
func groupAlive(pid int) bool {
	if err := syscall.Kill(-pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	dir, err := os.ReadDir("/proc")
	if err != nil {
		return true
	}
	for _, e := range dir {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		// "pid (comm) state ppid pgrp ...": comm may hold any byte but
		// ends at the last ')'.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(stat[i+1:])
		if len(f) < 3 {
			continue
		}
		if pgrp, err := strconv.Atoi(string(f[2])); err == nil && pgrp == pid && string(f[0]) != "Z" {
			return true
		}
	}
	return false
}
