//go:build unix

package main

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestShellQuote(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"make", "make"},
		{"-j4", "-j4"},
		{"./a/b.sh", "./a/b.sh"},
		{"x=1,y=2:z@h%", "x=1,y=2:z@h%"},
		{"", "''"},
		{"a b", "'a b'"},
		{"$HOME", "'$HOME'"},
		{"it's", `'it'\''s'`},
		{"*", "'*'"},
		{"été", "'été'"},
		{"line\nbreak", "'line\nbreak'"},
	} {
		if got := shellQuote(tc.in); got != tc.want {
			t.Errorf("shellQuote(%q): got %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestShellJoin: a shell splits the joined command line back into the
// arguments.
func TestShellJoin(t *testing.T) {
	args := []string{"sh", "-c", `echo "$1" 'x'; exit 3`, "", "it's", "a  b", "$(touch /nonexistent)", "*", "\\", "tab\there"}
	out, err := exec.Command("sh", "-c", `for a in `+shellJoin(args)+`; do printf '[%s]\n' "$a"; done`).Output()
	if err != nil {
		t.Fatalf("sh: %v", err)
	}
	var got []string
	for line := range strings.SplitSeq(strings.TrimSuffix(string(out), "\n"), "\n") {
		got = append(got, strings.TrimSuffix(strings.TrimPrefix(line, "["), "]"))
	}
	if !slices.Equal(got, args) {
		t.Fatalf("sh split %s into %q, want %q", shellJoin(args), got, args)
	}
}

func TestTruncate(t *testing.T) {
	if got := truncate("short", 10); got != "short" {
		t.Errorf("truncate(short, 10): got %q", got)
	}
	if got := truncate("0123456789", 10); got != "0123456789" {
		t.Errorf("truncate at exactly the bound: got %q", got)
	}
	if got := truncate("0123456789a", 10); got != "0123456..." {
		t.Errorf("truncate(0123456789a, 10): got %q, want %q", got, "0123456...")
	}
	// "é" is two bytes: a cut inside it moves back before it.
	s := strings.Repeat("é", 10)
	for n := 4; n < len(s); n++ {
		got := truncate(s, n)
		if len(got) > n || !utf8.ValidString(got) || !strings.HasSuffix(got, "...") {
			t.Errorf("truncate(%q, %d): got %q, want at most %d bytes of valid UTF-8 ending in ...", s, n, got, n)
		}
	}
}

func TestDefaultIdentity(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	plain := fmt.Sprintf("host=%s pid=%d", host, os.Getpid())
	var f identityFlag
	secret := []string{"mysqldump", "-pS3CRET", "db"}
	if got := f.value(secret, false); got != plain {
		t.Errorf("default: got %q, want %q, without the command", got, plain)
	}
	if got, want := f.value([]string{"sh", "-c", "sleep 1"}, true), plain+" cmd=sh -c 'sleep 1'"; got != want {
		t.Errorf("--identity-cmd: got %q, want %q", got, want)
	}
	long := f.value([]string{"echo", strings.Repeat("x", 1000)}, true)
	cmd, ok := strings.CutPrefix(long, plain+" cmd=")
	if !ok || len(cmd) > maxIdentityCommand || !strings.HasPrefix(cmd, "echo xxx") || !strings.HasSuffix(cmd, "...") {
		t.Errorf("--identity-cmd, long command: got %q, want %q then at most %d bytes of the command, ending in ...", long, plain+" cmd=", maxIdentityCommand)
	}
	for _, id := range []string{"nightly report", ""} {
		if err := f.Set(id); err != nil {
			t.Fatal(err)
		}
		if got := f.value([]string{"true"}, false); got != id {
			t.Errorf("--identity %q: got %q", id, got)
		}
	}
}
