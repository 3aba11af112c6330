package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// The sizes of the benchmarks of how cost grows (bench_waiting_test.go,
// bench_held_test.go).
var (
	waitingCounts = []int{2, 32, 256, 1024}
	heldCounts    = []int{1, 100, 10000}
	heldKinds     = []string{"etcdlock-idle", "etcdlock", "etcdlock-done", "upstream-idle", "upstream", "put"}
)

// waiting returns the name of BenchmarkWaiting's sub-benchmark for n
// sessions and the library impl ("/etcdlock" or "/upstream").
func waiting(n int, impl string) string {
	return fmt.Sprintf("BenchmarkWaiting/sessions=%d%s", n, impl)
}

// handoffUnits are the hand-off percentiles benchContend reports, with their
// names in the tables and pictures.
var handoffUnits = []struct{ unit, label string }{
	{"handoff-p50-ms", "p50"},
	{"handoff-p90-ms", "p90"},
	{"handoff-p99-ms", "p99"},
	{"handoff-max-ms", "max"},
}

// handoffs formats the hand-off percentiles of a benchmark as "p50 / p90 /
// p99 / max".
func (r results) handoffs(name string) string {
	vs := make([]string, len(handoffUnits))
	for i, h := range handoffUnits {
		vs[i] = fmtNum(r.m(name, h.unit))
	}
	return strings.Join(vs, " / ")
}

// cpu formats a benchmark's process CPU time per op, and the cores it kept
// busy, as "µs (cores)".
func (r results) cpu(name string) string {
	return fmtNum(r.m(name, "cpu-us/op")) + " (" + fmtNum(r.m(name, "cpu-cores")) + ")"
}

// printGrowth prints the tables of how cost grows: waiting sessions, held
// locks, fsync.
func (r results) printGrowth(w io.Writer) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	row := func(cells ...string) { p("| %s |\n", strings.Join(cells, " | ")) }

	p("\n### Growth: sessions waiting on one lock (a lease each, a client per 32 sessions)\n\n")
	row("sessions", "etcdlock acq/s", "upstream acq/s", "ratio",
		"etcdlock handoff p50 / p90 / p99 / max ms", "upstream handoff p50 / p90 / p99 / max ms",
		"etcdlock CPU µs/acq (cores)", "upstream CPU µs/acq (cores)", "etcdlock / upstream RPCs per acq")
	row("---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:")
	for _, n := range waitingCounts {
		on, un := waiting(n, ours), waiting(n, up)
		an, au := r.m(on, "acq/s"), r.m(un, "acq/s")
		row(strconv.Itoa(n), fmtNum(an), fmtNum(au), ratio(an, au), r.handoffs(on), r.handoffs(un),
			r.cpu(on), r.cpu(un), fmtNum(r.m(on, "rpcs/op"))+" / "+fmtNum(r.m(un, "rpcs/op")))
	}

	r.printScale(p, row)

	p("\n### Growth: locks of one Session (etcd in a child process: the client's cost only)\n\n")
	p("Per lock: live heap and goroutine stacks after runtime.GC, goroutines, allocations and wall time to take it\n")
	p("(8 goroutines taking locks at once); per run: keep-alive streams and leases, watch streams per take of all the locks.\n\n")
	row("locks", "kind", "heap B/lock", "stacks B/lock", "goroutines/lock", "allocs/lock", "µs/lock",
		"keep-alive streams / leases", "watch streams")
	row("---:", "---", "---:", "---:", "---:", "---:", "---:", "---:", "---:")
	for _, n := range heldCounts {
		for _, kind := range heldKinds {
			name := fmt.Sprintf("BenchmarkHeldLocks/locks=%d/%s", n, kind)
			row(strconv.Itoa(n), kind, fmtNum(r.m(name, "heap-B/lock")), fmtNum(r.m(name, "stack-B/lock")),
				fmtNum(r.m(name, "goroutines/lock")), fmtNum(r.m(name, "allocs/op")), fmtNum(r.m(name, "ns/op")/1e3),
				fmtNum(r.m(name, "keepalive-streams"))+" / "+fmtNum(r.m(name, "keepalive-leases")),
				fmtNum(r.m(name, "watch-streams")))
		}
	}

	p("\n### Growth: with fsync (etcdtest.WithFsync, data on TMPDIR's disk)\n\n")
	row("measure", "etcdlock", "upstream", "ratio", "etcdlock ÷ without fsync", "upstream ÷ without fsync")
	row("---", "---:", "---:", "---:", "---:", "---:")
	fsync := func(label, bench, plain, unit string, scale float64) {
		fn, fu := r.m(bench+ours, unit)/scale, r.m(bench+up, unit)/scale
		pn, pu := r.m(plain+ours, unit)/scale, r.m(plain+up, unit)/scale
		row(label, fmtNum(fn), fmtNum(fu), ratio(fn, fu), ratio(fn, pn), ratio(fu, pu))
	}
	fsync("uncontended LockContext + UnlockContext (µs/op)", "BenchmarkFsync/Uncontended", "BenchmarkUncontended", "ns/op", 1e3)
	fsync("2 sessions on one lock: acquisitions/s", "BenchmarkFsync/Contended/sessions=2", "BenchmarkContended/sessions=2", "acq/s", 1)
	fsync("2 sessions on one lock: handoff p50 (ms)", "BenchmarkFsync/Contended/sessions=2", "BenchmarkContended/sessions=2", "handoff-p50-ms", 1)
	fsync("2 sessions on one lock: handoff p99 (ms)", "BenchmarkFsync/Contended/sessions=2", "BenchmarkContended/sessions=2", "handoff-p99-ms", 1)
	fsync("uncontended: process CPU µs/op", "BenchmarkFsync/Uncontended", "BenchmarkUncontended", "cpu-us/op", 1)
}

// growthTargets prints the rows of the main table for the growth
// benchmarks.
func (r results) growthTargets(row func(...string)) {
	w32, w1024 := r.m(waiting(32, ours), "acq/s"), r.m(waiting(1024, ours), "acq/s")
	row("1,024 sessions waiting ÷ 32 sessions waiting: etcdlock acquisitions/s", fmtNum(w1024)+" / "+fmtNum(w32),
		fmtNum(r.m(waiting(1024, up), "acq/s"))+" / "+fmtNum(r.m(waiting(32, up), "acq/s")),
		ratio(w1024, w32)+" (etcdlock)", "≥ 0.5×", verdict(w1024 >= 0.5*w32, w1024, w32))

	idle := "BenchmarkHeldLocks/locks=10000/etcdlock-idle"
	gi := r.m(idle, "goroutines/lock")
	row("10,000 idle handles (NewMutex, never locked): goroutines per handle", fmtNum(gi),
		fmtNum(r.m("BenchmarkHeldLocks/locks=10000/upstream-idle", "goroutines/lock")), "–", "0", verdict(gi == 0, gi))

	held := "BenchmarkHeldLocks/locks=10000/etcdlock"
	ks, kl := r.m(held, "keepalive-streams"), r.m(held, "keepalive-leases")
	row("10,000 held locks on one Session: keep-alive streams / leases", fmtNum(ks)+" / "+fmtNum(kl),
		fmtNum(r.m("BenchmarkHeldLocks/locks=10000/upstream", "keepalive-streams"))+" / "+
			fmtNum(r.m("BenchmarkHeldLocks/locks=10000/upstream", "keepalive-leases")),
		"–", "1 / 1", verdict(ks == 1 && kl == 1, ks, kl))
}

// scaleCounts returns the numbers of sessions BenchmarkWaitersAtScale ran
// with (ETCDLOCK_WAITERS chooses them), smallest first.
func (r results) scaleCounts() []int {
	var counts []int
	for name := range r {
		rest, ok := strings.CutPrefix(name, "BenchmarkWaitersAtScale/sessions=")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSuffix(rest, ours), up))
		if err == nil && !slices.Contains(counts, n) {
			counts = append(counts, n)
		}
	}
	slices.Sort(counts)
	return counts
}

// printScale prints the table of BenchmarkWaitersAtScale, if it ran.
func (r results) printScale(p func(string, ...any), row func(...string)) {
	counts := r.scaleCounts()
	if len(counts) == 0 {
		return
	}
	p("\n### Growth: sessions waiting at scale (etcd in a child process, a client per 64 sessions)\n\n")
	p("etcd's own CPU time per acquisition (the cores it kept busy) and resident memory with the sessions queued.\n\n")
	row("sessions", "etcdlock acq/s", "upstream acq/s", "ratio",
		"etcdlock handoff p50 / p99 ms", "upstream handoff p50 / p99 ms",
		"etcdlock etcd CPU µs/acq (cores)", "upstream etcd CPU µs/acq (cores)",
		"etcdlock / upstream etcd RSS MB", "etcdlock / upstream RPCs per acq")
	row("---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:")
	for _, n := range counts {
		name := fmt.Sprintf("BenchmarkWaitersAtScale/sessions=%d", n)
		on, un := name+ours, name+up
		an, au := r.m(on, "acq/s"), r.m(un, "acq/s")
		h := func(b string) string {
			return fmtNum(r.m(b, "handoff-p50-ms")) + " / " + fmtNum(r.m(b, "handoff-p99-ms"))
		}
		etcd := func(b string) string {
			return fmtNum(r.m(b, "etcd-cpu-us/op")) + " (" + fmtNum(r.m(b, "etcd-cores")) + ")"
		}
		row(strconv.Itoa(n), fmtNum(an), fmtNum(au), ratio(an, au), h(on), h(un), etcd(on), etcd(un),
			fmtNum(r.m(on, "etcd-rss-MB"))+" / "+fmtNum(r.m(un, "etcd-rss-MB")),
			fmtNum(r.m(on, "rpcs/op"))+" / "+fmtNum(r.m(un, "rpcs/op")))
	}
}
