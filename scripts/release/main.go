// Command release keeps the project's releases as data and proves that
// they install: releases.txt, at the top of the repository, says which
// commit each version of each module is, since a git tag does not travel
// with what lands on main.
//
//	go run ./scripts/release tags          # make the tags releases.txt names
//	go run ./scripts/release proxy DIR     # a file-based module proxy of every release
//	go run ./scripts/release check         # both, then a program outside the repository
//	                                       # gets each module at its version, no replace
//
// check also serves the work tree's commit as the next version, the one
// the nested modules require of the root module (fence/go.mod), unless
// releases.txt has it already: the modules as they are install from a tag
// before the release is cut. A release is: CHANGELOG's section, the API
// record (go run ./scripts/apicheck -write api/vX.Y.Z.txt), a line per
// module in releases.txt naming the commit, then tags. docs/release.md has
// the steps.
package main

import (
	"archive/zip"
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// root is the module path of the repository's top directory.
const root = "github.com/etcdlock/etcdlock"

// releasesFile is where the releases are kept, from the top of the
// repository.
const releasesFile = "releases.txt"

// A release is one version of one module, at a commit.
type release struct {
	version string // vX.Y.Z
	dir     string // the module's directory: "." or "fence"
	commit  string // the full commit hash
}

// module returns the release's module path.
func (r release) module() string {
	if r.dir == "." {
		return root
	}
	return root + "/" + r.dir
}

// tag returns the release's git tag: vX.Y.Z, or dir/vX.Y.Z.
func (r release) tag() string {
	if r.dir == "." {
		return r.version
	}
	return r.dir + "/" + r.version
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return errors.New("usage: release tags | proxy DIR | check")
	}
	rels, err := readReleases(releasesFile)
	if err != nil {
		return err
	}
	switch {
	case args[0] == "tags" && len(args) == 1:
		return makeTags(rels)
	case args[0] == "proxy" && len(args) == 2:
		if err := makeTags(rels); err != nil {
			return err
		}
		return writeProxy(args[1], rels)
	case args[0] == "check" && len(args) == 1:
		return check(rels)
	}
	return fmt.Errorf("unknown arguments %q: usage: release tags | proxy DIR | check", args)
}

// readReleases reads the releases file: a release a line, "VERSION DIR
// COMMIT", with "#" beginning a comment.
func readReleases(name string) ([]release, error) {
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	var rels []release
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) != 3 || !strings.HasPrefix(f[0], "v") || len(f[2]) != 40 {
			return nil, fmt.Errorf("%s:%d: want VERSION DIR COMMIT (40 hex digits), got %q", name, n, sc.Text())
		}
		rels = append(rels, release{version: f[0], dir: f[1], commit: f[2]})
	}
	return rels, sc.Err()
}

// git runs git with args and returns its output, trimmed.
func git(args ...string) (string, error) {
	out, err := exec.Command("git", args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(ee.Stderr))
		}
		return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}

// makeTags makes the tag of each release where it is missing, and fails
// where a tag names another commit.
func makeTags(rels []release) error {
	for _, r := range rels {
		if _, err := git("cat-file", "-e", r.commit+"^{commit}"); err != nil {
			return fmt.Errorf("%s: commit %s is not in this repository: %w", r.tag(), r.commit, err)
		}
		at, err := git("rev-parse", "-q", "--verify", "refs/tags/"+r.tag()+"^{commit}")
		switch {
		case err != nil || at == "":
			if _, err := git("tag", r.tag(), r.commit); err != nil {
				return err
			}
		case at != r.commit:
			return fmt.Errorf("tag %s is %s, but %s says %s", r.tag(), at, releasesFile, r.commit)
		}
	}
	return nil
}

// writeProxy writes a module proxy in dir, as GOPROXY=file://DIR serves
// it, with every release: for each module, @v/list, and for each version
// its .info, .mod and .zip.
func writeProxy(dir string, rels []release) error {
	lists := map[string][]string{}
	for _, r := range rels {
		vdir := filepath.Join(dir, r.module(), "@v")
		if err := os.MkdirAll(vdir, 0o755); err != nil {
			return err
		}
		when, err := git("show", "-s", "--format=%cI", r.commit)
		if err != nil {
			return err
		}
		t, err := time.Parse(time.RFC3339, when)
		if err != nil {
			return err
		}
		info, _ := json.Marshal(struct {
			Version string
			Time    time.Time
		}{r.version, t.UTC()})
		gomod, err := git("show", r.commit+":"+path.Join(r.dir, "go.mod"))
		if err != nil {
			return err
		}
		if first, _, _ := strings.Cut(gomod, "\n"); first != "module "+r.module() {
			return fmt.Errorf("%s: %s/go.mod at %s begins %q, want module %s", r.tag(), r.dir, r.commit, first, r.module())
		}
		files := map[string][]byte{".info": info, ".mod": []byte(gomod + "\n")}
		if files[".zip"], err = moduleZip(r); err != nil {
			return err
		}
		for ext, data := range files {
			if err := os.WriteFile(filepath.Join(vdir, r.version+ext), data, 0o644); err != nil {
				return err
			}
		}
		lists[r.module()] = append(lists[r.module()], r.version)
	}
	for mod, versions := range lists {
		list := strings.Join(versions, "\n") + "\n"
		if err := os.WriteFile(filepath.Join(dir, mod, "@v", "list"), []byte(list), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// moduleZip returns the module zip of r, as the go command makes it from
// a repository: every file of the module's directory at the commit, under
// MODULE@VERSION/, less the directories of nested modules (those with a
// go.mod of their own) and what is not a regular file.
func moduleZip(r release) ([]byte, error) {
	tree := r.commit
	if r.dir != "." {
		tree += ":" + r.dir
	}
	ls, err := git("ls-tree", "-r", "-z", "--full-tree", tree)
	if err != nil {
		return nil, err
	}
	type entry struct{ mode, object, name string }
	var entries []entry
	var nested []string
	for rec := range strings.SplitSeq(ls, "\x00") {
		meta, name, ok := strings.Cut(rec, "\t")
		f := strings.Fields(meta)
		if !ok || len(f) != 3 {
			continue
		}
		if f[1] != "blob" || (f[0] != "100644" && f[0] != "100755") {
			continue // a link or a submodule: not in a module zip
		}
		if path.Base(name) == "go.mod" && name != "go.mod" {
			nested = append(nested, path.Dir(name)+"/")
		}
		entries = append(entries, entry{f[0], f[2], name})
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	prefix := r.module() + "@" + r.version + "/"
	for _, e := range entries {
		if slices.ContainsFunc(nested, func(n string) bool { return strings.HasPrefix(e.name, n) }) {
			continue
		}
		data, err := exec.Command("git", "cat-file", "blob", e.object).Output()
		if err != nil {
			return nil, fmt.Errorf("read %s of %s: %w", e.name, r.tag(), err)
		}
		w, err := zw.Create(prefix + e.name)
		if err != nil {
			return nil, err
		}
		if _, err := w.Write(data); err != nil {
			return nil, err
		}
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// check makes the tags and a proxy of every release, and of the next
// version at HEAD where releases.txt lacks it, then builds and runs, in a
// directory outside the repository, a program that requires each module
// at its newest version and imports its package: with GOPROXY the file
// proxy first, no replace, the checksum database off for this project's
// modules alone, and a module cache of its own.
func check(rels []release) error {
	next, err := candidates(rels)
	if err != nil {
		return err
	}
	if err := makeTags(rels); err != nil {
		return err
	}
	all := append(slices.Clone(rels), next...)
	tmp, err := os.MkdirTemp("", "etcdlock-release-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	proxy, consumer := filepath.Join(tmp, "proxy"), filepath.Join(tmp, "consumer")
	if err := writeProxy(proxy, all); err != nil {
		return err
	}
	newest := map[string]release{}
	for _, r := range all {
		newest[r.module()] = r // releases.txt lists them oldest first; the candidates come last
	}
	mods := slices.Sorted(func(yield func(string) bool) {
		for m := range newest {
			if !yield(m) {
				return
			}
		}
	})
	var src strings.Builder
	src.WriteString("package main\n\nimport (\n\t\"fmt\"\n\n")
	for _, m := range mods {
		if m != root {
			fmt.Fprintf(&src, "\t_ %q\n", m)
		}
	}
	fmt.Fprintf(&src, "\t%q\n)\n\nfunc main() { fmt.Println(\"installed:\", etcdlock.ErrNotHeld) }\n", root)
	if err := os.MkdirAll(consumer, 0o755); err != nil {
		return err
	}
	files := map[string]string{"go.mod": "module example.com/consumer\n\ngo 1.26.0\n", "main.go": src.String()}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(consumer, name), []byte(text), 0o644); err != nil {
			return err
		}
	}
	upstream, err := exec.Command("go", "env", "GOPROXY").Output()
	if err != nil {
		return err
	}
	// A module cache of its own: the machine's may hold a version of this
	// project's modules served before from another commit (an earlier
	// check's next version), which the go command would take as it is.
	env := append(os.Environ(),
		"GOPROXY=file://"+filepath.ToSlash(proxy)+","+strings.TrimSpace(string(upstream)),
		"GONOSUMDB="+root, "GOFLAGS=-mod=mod -modcacherw", "GOWORK=off", "GOMODCACHE="+filepath.Join(tmp, "modcache"))
	gets := []string{"get"}
	for _, m := range mods {
		gets = append(gets, m+"@"+newest[m].version)
	}
	for _, args := range [][]string{gets, {"run", "."}} {
		cmd := exec.Command("go", args...)
		cmd.Dir, cmd.Env = consumer, env
		out, err := cmd.CombinedOutput()
		fmt.Printf("$ go %s\n%s", strings.Join(args, " "), out)
		if err != nil {
			return fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
		}
	}
	for _, m := range mods {
		fmt.Printf("%s@%s (%s)\n", m, newest[m].version, newest[m].commit[:12])
	}
	return nil
}

// candidates returns the next release at HEAD, where releases.txt lacks
// it: the version of the root module that the nested modules require,
// for the root module and each module that requires it at that version.
func candidates(rels []release) ([]release, error) {
	head, err := git("rev-parse", "HEAD")
	if err != nil {
		return nil, err
	}
	mods, err := git("ls-tree", "-r", "--name-only", "HEAD")
	if err != nil {
		return nil, err
	}
	next := ""
	var dirs []string
	for name := range strings.SplitSeq(mods, "\n") {
		if path.Base(name) != "go.mod" || name == "go.mod" {
			continue
		}
		gomod, err := git("show", "HEAD:"+name)
		if err != nil {
			return nil, err
		}
		v := required(gomod, root)
		if v == "" {
			continue
		}
		if next != "" && v != next {
			return nil, fmt.Errorf("%s requires %s %s, another module %s", name, root, v, next)
		}
		next = v
		dirs = append(dirs, path.Dir(name))
	}
	if next == "" || slices.ContainsFunc(rels, func(r release) bool { return r.dir == "." && r.version == next }) {
		return nil, nil
	}
	out := []release{{version: next, dir: ".", commit: head}}
	for _, d := range dirs {
		out = append(out, release{version: next, dir: d, commit: head})
	}
	return out, nil
}

// required returns the version of module that the go.mod text requires,
// "" if none.
func required(gomod, module string) string {
	for line := range strings.SplitSeq(gomod, "\n") {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require "))
		if len(f) >= 2 && f[0] == module {
			return f[1]
		}
	}
	return ""
}
