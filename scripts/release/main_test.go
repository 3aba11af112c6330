package main

import (
	"archive/zip"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestModuleZip: the root module's zip at HEAD has its files under
// MODULE@VERSION/, and none of a nested module's (fence/, gocron/,
// scripts/etcdserver/v3.N/), which are modules of their own.
func TestModuleZip(t *testing.T) {
	head, err := git("rev-parse", "HEAD")
	if err != nil {
		t.Skipf("no git repository: %v", err)
	}
	data, err := moduleZip(release{version: "v9.9.9", dir: ".", commit: head})
	if err != nil {
		t.Fatal(err)
	}
	zr, err := zip.NewReader(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range zr.File {
		rest, ok := strings.CutPrefix(f.Name, root+"@v9.9.9/")
		if !ok {
			t.Fatalf("%s: not under the module's prefix", f.Name)
		}
		names[rest] = true
		for _, nested := range []string{"fence/", "gocron/", "scripts/etcdserver/v3.7/"} {
			if strings.HasPrefix(rest, nested) {
				t.Errorf("%s: a file of the nested module %s", rest, nested)
			}
		}
	}
	for _, want := range []string{"go.mod", "LICENSE", "mutex.go", "scripts/release/main.go"} {
		if !names[want] {
			t.Errorf("%s missing from the zip (%d files)", want, len(names))
		}
	}
}

// TestReadReleases: the file's lines, its comments, and a line that is
// not a release.
func TestReadReleases(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	commit := strings.Repeat("a", 40)
	if err := os.WriteFile(good, []byte("# c\n\nv1.0.0 . "+commit+"  # x\nv1.1.0 fence "+commit+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rels, err := readReleases(good)
	if err != nil || len(rels) != 2 || rels[1].module() != root+"/fence" || rels[1].tag() != "fence/v1.1.0" || rels[0].tag() != "v1.0.0" {
		t.Fatalf("got %+v, %v", rels, err)
	}
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("v1.0.0 . abc\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readReleases(bad); err == nil || !strings.Contains(err.Error(), "bad:1") {
		t.Fatalf("a short commit: got %v, want an error naming the line", err)
	}
}

func TestRequired(t *testing.T) {
	gomod := "module x\n\nrequire (\n\t" + root + " v1.1.0\n\tother v2.0.0\n)\n"
	if v := required(gomod, root); v != "v1.1.0" {
		t.Errorf("got %q, want v1.1.0", v)
	}
	if v := required("module x\nrequire "+root+" v1.2.0\n", root); v != "v1.2.0" {
		t.Errorf("one-line require: got %q, want v1.2.0", v)
	}
	if v := required(gomod, root+"/fence"); v != "" {
		t.Errorf("a module not required: got %q", v)
	}
}
