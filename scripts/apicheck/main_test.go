package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCompare: a line of the record that the API lost fails the check; a
// line the API gained does not.
func TestCompare(t *testing.T) {
	record := filepath.Join(t.TempDir(), "v1.txt")
	lines := []string{"pkg p, func A()", "pkg p, type T interface { M() }"}
	if err := os.WriteFile(record, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		what string
		now  []string
		want int
	}{
		{"the same API", lines, 0},
		{"a function added", append([]string{"pkg p, func B()"}, lines...), 0},
		{"a function removed", lines[1:], 1},
		{"a method added to an interface", []string{lines[0], "pkg p, type T interface { M(); N() }"}, 1},
	}
	for _, c := range cases {
		if got := compare(record, c.now); got != c.want {
			t.Errorf("%s: exit status %d, want %d", c.what, got, c.want)
		}
	}
}

// TestRecordIsCurrent: the tree's API still has every line of the last
// release's record, as .ci/run checks; and the record is sorted, one line
// per name, as -write writes it.
func TestRecordIsCurrent(t *testing.T) {
	lines, err := apiLines()
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) < 100 {
		t.Fatalf("API lines: got %d, want the module's (more than 100)", len(lines))
	}
	if got := compare("../../api/v1.0.0.txt", lines); got != 0 {
		t.Errorf("compare with api/v1.0.0.txt: exit status %d, want 0", got)
	}
}
