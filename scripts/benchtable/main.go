// Command benchtable reads the output of go test -bench (from the files
// named as arguments, or stdin) for etcdlock's benchmarks and prints, as
// Markdown, the medians of each metric over the runs (-count), the ratios
// etcdlock/upstream of those medians, and whether each target is met.
// With -svg DIR it also draws, as SVG files in DIR, acquisitions/s against
// the number of waiting sessions (waiting.svg) and the hand-off latency
// percentiles (handoff.svg) of BenchmarkWaiting.
//
// Usage:
//
//	go test -run XXX -bench . -benchmem -count 3 . | go run ./scripts/benchtable
//	go run ./scripts/benchtable -svg docs/bench bench.txt
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

// results holds every value seen, by benchmark name (without the -GOMAXPROCS
// suffix) and unit.
type results map[string]map[string][]float64

func main() {
	svgDir := flag.String("svg", "", "also write waiting.svg and handoff.svg to this `directory`")
	flag.Parse()
	r := results{}
	if flag.NArg() == 0 {
		r.read(os.Stdin)
	}
	for _, path := range flag.Args() {
		f, err := os.Open(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "benchtable:", err)
			os.Exit(1)
		}
		r.read(f)
		f.Close()
	}
	if len(r) == 0 {
		fmt.Fprintln(os.Stderr, "benchtable: no benchmark results in the input")
		os.Exit(1)
	}
	r.print(os.Stdout)
	if *svgDir != "" {
		if err := r.writeSVGs(*svgDir); err != nil {
			fmt.Fprintln(os.Stderr, "benchtable:", err)
			os.Exit(1)
		}
	}
}

// read adds the results of the benchmark lines of in:
//
//	BenchmarkName-2   	 100	 123 ns/op	 4.5 acq/s	...
func (r results) read(in io.Reader) {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		name := f[0]
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i]
			}
		}
		if r[name] == nil {
			r[name] = map[string][]float64{}
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			r[name][f[i+1]] = append(r[name][f[i+1]], v)
		}
	}
}

// median returns the median of a metric over the runs, and false if there
// is none.
func (r results) median(name, unit string) (float64, bool) {
	vs := slices.Clone(r[name][unit])
	if len(vs) == 0 {
		return math.NaN(), false
	}
	slices.Sort(vs)
	n := len(vs)
	if n%2 == 1 {
		return vs[n/2], true
	}
	return (vs[n/2-1] + vs[n/2]) / 2, true
}

// runs returns how many runs a benchmark has.
func (r results) runs(name string) int { return len(r[name]["ns/op"]) }

func (r results) m(name, unit string) float64 {
	v, _ := r.median(name, unit)
	return v
}

// fmtNum formats v with about three significant figures, or "–" for NaN.
func fmtNum(v float64) string {
	switch {
	case math.IsNaN(v):
		return "–"
	case v == 0:
		return "0"
	case math.Abs(v) >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case math.Abs(v) >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case math.Abs(v) >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strconv.FormatFloat(v, 'g', 2, 64)
}

func ratio(a, b float64) string {
	if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
		return "–"
	}
	return fmtNum(a/b) + "×"
}

// verdict returns "yes" or "**no**", or "–" when the figures are missing.
func verdict(ok bool, vs ...float64) string {
	for _, v := range vs {
		if math.IsNaN(v) {
			return "–"
		}
	}
	if ok {
		return "yes"
	}
	return "**no**"
}

const (
	ours    = "/etcdlock"
	up      = "/upstream"
	handoff = "/etcdlock-handoff8"
)

func (r results) print(w io.Writer) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	row := func(cells ...string) { p("| %s |\n", strings.Join(cells, " | ")) }

	p("Medians over the runs of each benchmark; ratios are etcdlock/upstream of the medians.\n\n")
	row("measure", "etcdlock", "upstream", "ratio", "target", "met")
	row("---", "---:", "---:", "---:", "---", "---")

	un, uu := r.m("BenchmarkUncontended"+ours, "ns/op"), r.m("BenchmarkUncontended"+up, "ns/op")
	row("uncontended LockContext + UnlockContext (µs/op)", fmtNum(un/1e3), fmtNum(uu/1e3), ratio(un, uu), "≤ 1.03×", verdict(un <= 1.03*uu, un, uu))
	pair := 1e9 / un

	fd, pd := r.m("BenchmarkFencedDelete/fenced-delete", "ns/op"), r.m("BenchmarkFencedDelete/delete", "ns/op")
	row("of which: put + fenced delete vs put + plain delete (µs/op)", fmtNum(fd/1e3), fmtNum(pd/1e3), ratio(fd, pd), "(the price of D6)", "–")

	rl := "BenchmarkRelock" + ours
	rn, rr, ra := r.m(rl, "ns/op"), r.m(rl, "rpcs/op"), r.m(rl, "allocs/op")
	row("re-lock + unlock by the holder (ns/op, RPCs/op, allocs/op)",
		fmtNum(rn)+" ns, "+fmtNum(rr)+" RPCs, "+fmtNum(ra)+" allocs", "n/a", "n/a",
		"≤ 100 ns, 0 RPCs, 0 allocs", verdict(rn <= 100 && rr == 0 && ra == 0, rn, rr, ra))

	tn, tu := r.m("BenchmarkTryLockHeld"+ours, "ns/op"), r.m("BenchmarkTryLockHeld"+up, "ns/op")
	wn, wu := r.m("BenchmarkTryLockHeld"+ours, "writes/op"), r.m("BenchmarkTryLockHeld"+up, "writes/op")
	row("TryLock on a lock held by another session: writes/op", fmtNum(wn), fmtNum(wu), "–", "0 writes", verdict(wn == 0, wn))
	row("TryLock on a lock held by another session: µs/op", fmtNum(tn/1e3), fmtNum(tu/1e3),
		ratio(tn, un)+" of the uncontended pair", "≤ 0.35× of the pair", verdict(tn <= 0.35*un, tn, un))
	tf := r.m("BenchmarkTryLockFree"+ours, "rpcs/op")
	row("TryLock that succeeds, then UnlockContext: RPCs/op", fmtNum(tf), fmtNum(r.m("BenchmarkTryLockFree"+up, "rpcs/op")),
		"–", "2 (the try is 1)", verdict(tf == 2, tf))

	c2 := "BenchmarkContended/sessions=2"
	an, au := r.m(c2+ours, "acq/s"), r.m(c2+up, "acq/s")
	row("2 sessions on one lock: acquisitions/s", fmtNum(an), fmtNum(au), ratio(an, au), "≥ 50×", verdict(an >= 50*au, an, au))
	row("2 sessions on one lock ÷ the uncontended pair rate", fmtNum(an), fmtNum(pair)+" (pair rate)", ratio(an, pair), "≥ 1.0×", verdict(an >= pair, an, pair))
	hn50, hn99 := r.m(c2+ours, "handoff-p50-ms"), r.m(c2+ours, "handoff-p99-ms")
	hu50, hu99 := r.m(c2+up, "handoff-p50-ms"), r.m(c2+up, "handoff-p99-ms")
	row("2 sessions on one lock: handoff p50 / p99 (ms)", fmtNum(hn50)+" / "+fmtNum(hn99), fmtNum(hu50)+" / "+fmtNum(hu99),
		ratio(hn99, hu99)+" (p99)", "p99 ≤ 2 ms", verdict(hn99 <= 2, hn99))

	c32 := "BenchmarkContended/sessions=32"
	an, au = r.m(c32+ours, "acq/s"), r.m(c32+up, "acq/s")
	row("32 sessions on one lock: acquisitions/s", fmtNum(an), fmtNum(au), ratio(an, au), "≥ 8×", verdict(an >= 8*au, an, au))

	for _, n := range []int{2, 8, 32} {
		name := fmt.Sprintf("BenchmarkOneProcess/goroutines=%d", n)
		kn, ku := r.m(name+ours, "max-keys"), r.m(name+up, "max-keys")
		an, au := r.m(name+ours, "acq/s"), r.m(name+up, "acq/s")
		row(fmt.Sprintf("%d goroutines, one process, one lock: max keys", n), fmtNum(kn), fmtNum(ku)+" (a Session each)", "–", "1 key", verdict(kn == 1, kn))
		row(fmt.Sprintf("%d goroutines, one process, one lock: acquisitions/s", n), fmtNum(an), fmtNum(au)+" (a Session each)",
			ratio(an, pair)+" of uncontended", fmt.Sprintf("≥ uncontended pair rate (%s/s)", fmtNum(pair)), verdict(an >= pair, an, pair))
	}

	i32 := "BenchmarkIndependent/locks=32"
	an, au = r.m(i32+ours, "acq/s"), r.m(i32+up, "acq/s")
	row("32 goroutines on 32 independent locks: pairs/s", fmtNum(an), fmtNum(au), ratio(an, au), "≥ 1.0×", verdict(an >= au, an, au))

	r.growthTargets(row)
	defer r.family(p, row)

	st := r.m("BenchmarkStart", "ms/start-median")
	row("etcdtest.Start to ready (ms, median)", fmtNum(st), "n/a", "n/a", "≤ 100 ms", verdict(st <= 100, st))

	scaling := func(title, what, bench, extra string, rpcs bool) {
		p("\n### Scaling: %s\n\n", title)
		row(what, "etcdlock acq/s", "upstream acq/s", "ratio", "etcdlock handoff p50 / p99 ms", "upstream handoff p50 / p99 ms",
			"etcdlock "+extra, "upstream "+extra)
		row("---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:")
		for _, n := range []int{2, 8, 32} {
			r.scaleRow(row, n, fmt.Sprintf("%s/%s=%d", bench, what, n), rpcs)
		}
	}
	scaling("sessions (one client each) contending for one lock", "sessions", "BenchmarkContended", "RPCs / watches per acq", true)
	scaling("goroutines of one process on one lock (etcdlock: one Session; upstream: a Session each)",
		"goroutines", "BenchmarkOneProcess", "max keys", false)
	p("\nThe same with WithLocalHandoff(8): at most 8 local hand-offs in a row keep the key.\n\n")
	row("goroutines", "acq/s", "× default etcdlock", "handoff p50 / p99 ms", "writes/op", "max keys")
	row("---:", "---:", "---:", "---:", "---:", "---:")
	for _, n := range []int{2, 8, 32} {
		name := fmt.Sprintf("BenchmarkOneProcess/goroutines=%d", n)
		hn := name + handoff
		ah := r.m(hn, "acq/s")
		row(strconv.Itoa(n), fmtNum(ah), ratio(ah, r.m(name+ours, "acq/s")),
			fmtNum(r.m(hn, "handoff-p50-ms"))+" / "+fmtNum(r.m(hn, "handoff-p99-ms")),
			fmtNum(r.m(hn, "writes/op")), fmtNum(r.m(hn, "max-keys")))
	}

	p("\n### Scaling: independent locks, a goroutine each, one Session\n\n")
	row("locks", "etcdlock pairs/s", "upstream pairs/s", "ratio", "etcdlock allocs/op", "upstream allocs/op")
	row("---:", "---:", "---:", "---:", "---:", "---:")
	for _, n := range []int{1, 8, 32} {
		name := fmt.Sprintf("BenchmarkIndependent/locks=%d", n)
		an, au := r.m(name+ours, "acq/s"), r.m(name+up, "acq/s")
		row(strconv.Itoa(n), fmtNum(an), fmtNum(au), ratio(an, au), fmtNum(r.m(name+ours, "allocs/op")), fmtNum(r.m(name+up, "allocs/op")))
	}

	r.printGrowth(w)

	p("\n### Runs per benchmark\n\n")
	names := make([]string, 0, len(r))
	for name := range r {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		p("- %s: %d\n", name, r.runs(name))
	}
}

func (r results) scaleRow(row func(...string), n int, name string, rpcs bool) {
	an, au := r.m(name+ours, "acq/s"), r.m(name+up, "acq/s")
	h := func(impl string) string {
		return fmtNum(r.m(name+impl, "handoff-p50-ms")) + " / " + fmtNum(r.m(name+impl, "handoff-p99-ms"))
	}
	extra := func(impl string) string {
		if rpcs {
			return fmtNum(r.m(name+impl, "rpcs/op")) + " / " + fmtNum(r.m(name+impl, "watches/op"))
		}
		return fmtNum(r.m(name+impl, "max-keys"))
	}
	row(strconv.Itoa(n), fmtNum(an), fmtNum(au), ratio(an, au), h(ours), h(up), extra(ours), extra(up))
}

// family prints the tables of RWMutex, Semaphore and the observers.
func (r results) family(p func(string, ...any), row func(...string)) {
	if math.IsNaN(r.m("BenchmarkRWMutex/readers=4"+ours, "acq/s")) {
		return
	}
	p("\n### The family: RWMutex beside etcd's recipe RWMutex\n\n")
	row("sessions", "etcdlock acq/s", "recipe acq/s", "ratio", "etcdlock RPCs / watches per acq", "recipe RPCs / watches per acq")
	row("---", "---:", "---:", "---:", "---:", "---:")
	for _, n := range []string{"readers=4", "writers=2", "readers=8,writers=2"} {
		b := "BenchmarkRWMutex/" + n
		an, ar := r.m(b+ours, "acq/s"), r.m(b+"/recipe", "acq/s")
		row(n, fmtNum(an), fmtNum(ar), ratio(an, ar),
			fmtNum(r.m(b+ours, "rpcs/op"))+" / "+fmtNum(r.m(b+ours, "watches/op")),
			fmtNum(r.m(b+"/recipe", "rpcs/op"))+" / "+fmtNum(r.m(b+"/recipe", "watches/op")))
	}
	mutex := r.m("BenchmarkContended/sessions=2"+ours, "acq/s")
	p("\n### The family: Semaphore, twice limit sessions (at least 2), one permit each at a time\n\n")
	row("limit", "acq/s", "÷ Mutex, 2 sessions", "most holders at once", "RPCs / watches / writes per acq")
	row("---:", "---:", "---:", "---:", "---:")
	for _, limit := range []int{1, 4, 16} {
		b := fmt.Sprintf("BenchmarkSemaphore/limit=%d", limit) + ours
		a := r.m(b, "acq/s")
		row(strconv.Itoa(limit), fmtNum(a), ratio(a, mutex), fmtNum(r.m(b, "max-inside")),
			fmtNum(r.m(b, "rpcs/op"))+" / "+fmtNum(r.m(b, "watches/op"))+" / "+fmtNum(r.m(b, "writes/op")))
	}
	none := r.m("BenchmarkObserver/none", "ns/op")
	p("\n### Observing: the uncontended pair\n\n")
	row("observers", "µs/op", "÷ none", "allocs/op")
	row("---", "---:", "---:", "---:")
	for _, o := range []string{"none", "observer", "logger"} {
		b := "BenchmarkObserver/" + o
		v := r.m(b, "ns/op")
		row(o, fmtNum(v/1e3), ratio(v, none), fmtNum(r.m(b, "allocs/op")))
	}
}
