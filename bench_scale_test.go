package etcdlock_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// benchScaleCounts are the numbers of sessions of BenchmarkWaitersAtScale;
// ETCDLOCK_WAITERS, a comma-separated list (such as 2048,4096,10000),
// replaces them.
func benchScaleCounts(b *testing.B) []int {
	return benchEnvCounts(b, "ETCDLOCK_WAITERS", []int{32, 1024}, 2)
}

// benchScalePerClient is how many sessions of BenchmarkWaitersAtScale share
// a client.
const benchScalePerClient = 64

// BenchmarkWaitersAtScale: BenchmarkWaiting with etcd in a child process
// (childServer), one for each library's half, so that the CPU time and
// memory of etcd's process are measured apart from the clients': n sessions,
// a lease each, a client per benchScalePerClient, all queued on one lock
// before the clock starts (benchQueued), benchScalePerClient at a time: a
// few thousand sessions that enqueue at once keep etcd's apply busy past its
// request timeout, since each enqueue reads the queue in the apply. One op is one acquisition. Besides
// benchContend's metrics (cpu-us/op and cpu-cores are then the clients'
// process only):
//
//	etcd-cpu-us/op, etcd-cores  etcd's process, from /proc/<pid>/stat
//	etcd-rss-MB                 its resident memory when the clock starts,
//	                            with the n sessions queued
//	etcd-rss-end-MB             the same at the b.N-th acquisition
//	etcd-peak-MB                its most resident memory during the run
//	etcd-base-MB                its resident memory before the sessions were made
//	setup-s                     wall time to make the n sessions (not to queue them)
//
// The sessions are made once for the runs of a sub-benchmark; once they are
// closed, it fails if etcd still has leases or the process more goroutines
// than before. Use -benchtime Nx: each run queues all n sessions again.
func BenchmarkWaitersAtScale(b *testing.B) {
	for _, n := range benchScaleCounts(b) {
		b.Run(fmt.Sprintf("sessions=%d", n), func(b *testing.B) {
			for _, impl := range benchImpls {
				benchScale(b, n, impl)
			}
		})
	}
}

// benchScale runs the half of impl with n sessions, on an etcd of its own.
func benchScale(b *testing.B, n int, impl benchImpl) {
	server := &benchScope{TB: b}
	defer server.close()
	endpoint, pid := childServer(server)
	plain, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		b.Fatalf("new client: %v", err)
	}
	server.Cleanup(func() { _ = plain.Close() })
	// Queueing n sessions reads the queue n times: allow for it (upstream
	// queued 10,000 in more than 4 minutes).
	e := &benchServer{endpoints: []string{endpoint}, plain: plain, child: pid,
		timeout: benchTimeout + time.Duration(n)*60*time.Millisecond, queueBatch: benchScalePerClient}
	e.revision(b) // plain's connection and its goroutines, before the count
	base := benchReadProc(pid)
	goroutines := runtime.NumGoroutine()

	sessions := &benchScope{TB: b}
	name := fmt.Sprintf("bench/%s_%s", strings.ReplaceAll(b.Name(), "/", "_"), impl.name)
	lockers := make([]benchLocker, n)
	var c *clientv3.Client
	t := time.Now()
	for i := range lockers {
		if i%benchScalePerClient == 0 {
			c = e.client(sessions)
		}
		lockers[i] = impl.newSession(sessions, c)(name)
	}
	setup := time.Since(t)
	b.Run(impl.name, func(b *testing.B) {
		benchContend(b, e, name, lockers, benchQueued)
		b.ReportMetric(setup.Seconds(), "setup-s")
		if base.ok {
			b.ReportMetric(float64(base.rss)/(1<<20), "etcd-base-MB")
		}
	})
	sessions.close()
	benchCheckClosed(b, plain, goroutines)
}

// benchCheckClosed fails b unless etcd has no lease left and the process
// is back to at most want goroutines, within a few seconds.
func benchCheckClosed(b *testing.B, plain *clientv3.Client, want int) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
	defer cancel()
	resp, err := plain.Leases(ctx)
	if err != nil {
		b.Fatalf("list leases: %v", err)
	}
	if len(resp.Leases) != 0 {
		b.Errorf("leases left in etcd after the sessions closed: got %d, want 0", len(resp.Leases))
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > want && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := runtime.NumGoroutine(); got > want {
		buf := make([]byte, 1<<20)
		b.Errorf("goroutines after the sessions closed: got %d, want at most %d\n%s", got, want, buf[:runtime.Stack(buf, true)])
	}
}

// benchProc is the CPU time and memory of a process, from /proc.
type benchProc struct {
	ok   bool
	cpu  time.Duration // user and system, every thread
	rss  uint64        // resident memory, bytes (VmRSS)
	peak uint64        // most resident memory since start or the last reset (VmHWM)
}

// benchClockTick is the unit of the CPU times of /proc/<pid>/stat: USER_HZ,
// 100 on Linux (getconf CLK_TCK).
const benchClockTick = 10 * time.Millisecond

// benchReadProc reads process pid's CPU time and memory; ok is false where
// there is no /proc.
func benchReadProc(pid int) benchProc {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return benchProc{}
	}
	// After the command's name, in parentheses: state is field 3, utime
	// and stime are fields 14 and 15.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return benchProc{}
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 13 {
		return benchProc{}
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	status, err3 := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err1 != nil || err2 != nil || err3 != nil {
		return benchProc{}
	}
	p := benchProc{ok: true, cpu: time.Duration(utime+stime) * benchClockTick}
	for line := range strings.Lines(string(status)) {
		k, v, _ := strings.Cut(line, ":")
		kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			p.rss = kb << 10
		case "VmHWM":
			p.peak = kb << 10
		}
	}
	return p
}

// benchResetPeak resets the peak resident memory (VmHWM) of process pid to
// its current one, where Linux allows; otherwise the peak counts from the
// process's start.
func benchResetPeak(pid int) {
	_ = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
}
