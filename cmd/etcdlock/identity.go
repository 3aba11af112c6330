package main

import (
	"fmt"
	"os"
	"strings"
	"unicode/utf8"
)

// maxIdentityCommand bounds the command line in run's default identity, in
// bytes: the identity is the value of a key every holders call reads.
const maxIdentityCommand = 200

// identityFlag is run's --identity: the value of its lock key, or, if not
// set, defaultIdentity.
type identityFlag struct {
	s   string
	set bool
}

func (f *identityFlag) String() string {
	if f == nil || !f.set {
		return "host=<hostname> pid=<pid> cmd=<COMMAND ARGS>"
	}
	return f.s
}

func (f *identityFlag) Set(s string) error {
	*f = identityFlag{s: s, set: true}
	return nil
}

// value returns the identity run stores for command.
func (f *identityFlag) value(command []string) string {
	if f.set {
		return f.s
	}
	return defaultIdentity(command)
}

// defaultIdentity names this process for whoever reads the lock's keys:
// host, pid, and command as a shell would take it, truncated to
// maxIdentityCommand bytes.
func defaultIdentity(command []string) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return fmt.Sprintf("host=%s pid=%d cmd=%s", host, os.Getpid(), truncate(shellJoin(command), maxIdentityCommand))
}

// shellJoin returns args as one command line that a POSIX shell splits back
// into args.
func shellJoin(args []string) string {
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = shellQuote(a)
	}
	return strings.Join(quoted, " ")
}

// shellQuote returns s as one word of a POSIX shell: unchanged if it needs
// no quoting, else in single quotes.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool { return !shellSafe(r) }) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func shellSafe(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=+,@%", r)
}

// truncate returns s cut to at most n bytes, on a character boundary, with
// "..." in place of what was cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("...")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}
