// Command apicheck records the exported API of the module's public packages
// as sorted text lines, one per exported name, field and method, and checks
// that a later tree still has every line of a release's record: the way Go
// itself keeps its promise (api/go1.*.txt, checked by cmd/api).
//
//	go run ./scripts/apicheck                    # print the API of the tree
//	go run ./scripts/apicheck -write api/v1.txt  # record it at a release
//	go run ./scripts/apicheck -check api/v1.txt  # fail on any line lost
//
// A line lost is an incompatible change: a name removed, a signature, field
// type, receiver or constant value changed, or a method added to an
// interface (an interface is one line with all its methods). A line gained
// is an addition, allowed between releases. Parameter names are not part of
// the API and are left out.
//
// It reads the compiler's export data of the packages (go list -export), so
// it needs nothing beyond the Go toolchain.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
)

// packages are the public packages whose API the module promises.
var packages = []string{
	"github.com/etcdlock/etcdlock",
	"github.com/etcdlock/etcdlock/etcdtest",
	"github.com/etcdlock/etcdlock/prometheus",
}

func main() {
	write := flag.String("write", "", "record the API in this file")
	check := flag.String("check", "", "fail if the API lost a line of this record")
	flag.Parse()
	lines, err := apiLines()
	if err != nil {
		fmt.Fprintln(os.Stderr, "apicheck:", err)
		os.Exit(2)
	}
	switch {
	case *write != "":
		if err := os.WriteFile(*write, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "apicheck:", err)
			os.Exit(2)
		}
	case *check != "":
		os.Exit(compare(*check, lines))
	default:
		for _, l := range lines {
			fmt.Println(l)
		}
	}
}

// compare reports the lines of the record file that the API lost (and
// fails) and those it gained; it returns the exit status.
func compare(file string, lines []string) int {
	data, err := os.ReadFile(file)
	if err != nil {
		fmt.Fprintln(os.Stderr, "apicheck:", err)
		return 2
	}
	var want []string
	for l := range strings.SplitSeq(strings.TrimSpace(string(data)), "\n") {
		want = append(want, l)
	}
	have := make(map[string]bool, len(lines))
	for _, l := range lines {
		have[l] = true
	}
	recorded := make(map[string]bool, len(want))
	lost := 0
	for _, l := range want {
		recorded[l] = true
		if !have[l] {
			fmt.Println("incompatible: lost", l)
			lost++
		}
	}
	for _, l := range lines {
		if !recorded[l] {
			fmt.Println("added:", l)
		}
	}
	if lost > 0 {
		fmt.Printf("apicheck: %d lines of %s lost: an incompatible change to the API of the release\n", lost, file)
		return 1
	}
	fmt.Printf("apicheck: compatible with %s (%d lines)\n", file, len(want))
	return 0
}

// apiLines returns the API of packages, sorted.
func apiLines() ([]string, error) {
	exports, err := exportData()
	if err != nil {
		return nil, err
	}
	imp := importer.ForCompiler(token.NewFileSet(), "gc", func(path string) (io.ReadCloser, error) {
		f, ok := exports[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})
	var lines []string
	for _, path := range packages {
		pkg, err := imp.Import(path)
		if err != nil {
			return nil, err
		}
		lines = append(lines, describe(pkg)...)
	}
	slices.Sort(lines)
	return lines, nil
}

// exportData returns the export data file of every package packages need.
func exportData() (map[string]string, error) {
	cmd := exec.Command("go", append([]string{"list", "-export", "-deps", "-json=ImportPath,Export"}, packages...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w", err)
	}
	files := make(map[string]string)
	dec := json.NewDecoder(bufio.NewReader(bytes.NewReader(out)))
	for dec.More() {
		var p struct{ ImportPath, Export string }
		if err := dec.Decode(&p); err != nil {
			return nil, err
		}
		files[p.ImportPath] = p.Export
	}
	return files, nil
}

// describe returns a line per exported name of pkg, per exported field of
// its exported structs, and per exported method of its exported types.
func describe(pkg *types.Package) []string {
	prefix := "pkg " + pkg.Path() + ", "
	q := func(p *types.Package) string {
		if p == pkg {
			return ""
		}
		return p.Name()
	}
	var lines []string
	add := func(format string, args ...any) { lines = append(lines, prefix+fmt.Sprintf(format, args...)) }
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		switch obj := obj.(type) {
		case *types.Const:
			add("const %s %s = %s", name, types.TypeString(obj.Type(), q), obj.Val().ExactString())
		case *types.Var:
			add("var %s %s", name, types.TypeString(obj.Type(), q))
		case *types.Func:
			add("func %s%s", name, signature(obj.Type().(*types.Signature), q))
		case *types.TypeName:
			lines = append(lines, describeType(prefix, obj, q)...)
		}
	}
	return lines
}

// describeType returns the lines of the exported type obj: its kind (an
// interface with all its methods, a func type with its signature), its
// exported fields, and its exported methods with their receivers.
func describeType(prefix string, obj *types.TypeName, q types.Qualifier) []string {
	name := obj.Name()
	var lines []string
	add := func(format string, args ...any) { lines = append(lines, prefix+fmt.Sprintf(format, args...)) }
	if obj.IsAlias() {
		add("type %s = %s", name, types.TypeString(obj.Type(), q))
		return lines
	}
	switch u := obj.Type().Underlying().(type) {
	case *types.Struct:
		add("type %s struct", name)
		for f := range u.Fields() {
			if f.Exported() {
				add("type %s struct, %s %s", name, f.Name(), types.TypeString(f.Type(), q))
			}
		}
	case *types.Interface:
		var ms []string
		for m := range u.Methods() {
			ms = append(ms, m.Name()+signature(m.Type().(*types.Signature), q))
		}
		slices.Sort(ms)
		add("type %s interface { %s }", name, strings.Join(ms, "; "))
	case *types.Signature:
		add("type %s func%s", name, signature(u, q))
	default:
		add("type %s %s", name, types.TypeString(u, q))
	}
	named, ok := obj.Type().(*types.Named)
	if !ok {
		return lines
	}
	for m := range named.Methods() {
		if !m.Exported() {
			continue
		}
		sig := m.Type().(*types.Signature)
		recv := name
		if _, ptr := sig.Recv().Type().(*types.Pointer); ptr {
			recv = "*" + name
		}
		add("method (%s) %s%s", recv, m.Name(), signature(sig, q))
	}
	return lines
}

// signature returns sig without parameter names: "(T1, T2) (R1, error)".
func signature(sig *types.Signature, q types.Qualifier) string {
	list := func(t *types.Tuple, variadic bool) []string {
		var s []string
		for i := range t.Len() {
			ts := types.TypeString(t.At(i).Type(), q)
			if variadic && i == t.Len()-1 {
				ts = "..." + strings.TrimPrefix(ts, "[]")
			}
			s = append(s, ts)
		}
		return s
	}
	out := "(" + strings.Join(list(sig.Params(), sig.Variadic()), ", ") + ")"
	switch res := list(sig.Results(), false); len(res) {
	case 0:
	case 1:
		out += " " + res[0]
	default:
		out += " (" + strings.Join(res, ", ") + ")"
	}
	return out
}
