package etcdtest_test

import (
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	"github.com/etcdlock/etcdlock/etcdtest"
)

// dirBytes returns the size of the files under dir.
func dirBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err == nil {
			n += info.Size()
		}
		return err
	})
	if err != nil {
		t.Fatalf("walk %s: got %v, want nil", dir, err)
	}
	return n
}

// TestDiskCost checks that a server's data costs a few MB, not the 128 MB of
// etcd's default write-ahead log, and that it keeps working once it has
// written more than a segment.
func TestDiskCost(t *testing.T) {
	embeddedOnly(t)
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp) // where New puts its data
	srv, err := etcdtest.New()
	if err != nil {
		t.Fatalf("new: got %v, want nil", err)
	}
	defer srv.Close()
	const most = 10 << 20
	if got := dirBytes(t, tmp); got > most {
		t.Fatalf("data after start: got %d bytes, want at most %d", got, most)
	}
	cli, err := srv.NewClient()
	if err != nil {
		t.Fatalf("client: got %v, want nil", err)
	}
	val := strings.Repeat("x", 100<<10)
	for i := range 100 { // 10 MB: more than two segments
		put(t, cli, t.Name()+"/"+string(rune('a'+i%26))+string(rune('a'+i/26)), val)
	}
	if got := get(t, cli, t.Name()+"/aa"); got != val {
		t.Fatalf("get after 10 MB of writes: got %d bytes, want %d", len(got), len(val))
	}
}
