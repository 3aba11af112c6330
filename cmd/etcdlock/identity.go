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
		return "host=<hostname> pid=<pid>"
	}
	return f.s
}

func (f *identityFlag) Set(s string) error {
	*f = identityFlag{s: s, set: true}
	return nil
}

// value returns the identity run stores for command: --identity if set,
// else the default, with the command line if withCmd (--identity-cmd).
func (f *identityFlag) value(command []string, withCmd bool) string {
	switch {
	case f.set:
		return f.s
	case withCmd:
		return defaultIdentity() + " cmd=" + truncate(shellJoin(command), maxIdentityCommand)
	}
	return defaultIdentity()
}

// defaultIdentity names this process for whoever reads the lock's keys:
// host and pid. Not the command line, whose arguments may hold secrets
// that anyone who can read the lock would see.
func defaultIdentity() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return fmt.Sprintf("host=%s pid=%d", host, os.Getpid())
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
