package etcdlock_test

// Benchmarks of MultiMutex beside the same names taken one by one with
// Mutexes, in sorted order (the order that keeps lock-by-lock from waiting
// in a cycle), released in reverse: each pair, …/multi and …/one-by-one,
// runs on the same embedded etcd. The metrics are bench_test.go's.

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/etcdlock/etcdlock"
)

// multiNameCounts are the numbers of names a benchmark takes at once.
var multiNameCounts = []int{2, 4, 8}

// oneByOne takes Mutexes one after the other, and releases them in reverse.
type oneByOne []*etcdlock.Mutex

func (o oneByOne) Lock(ctx context.Context) error {
	for _, m := range o {
		if err := m.LockContext(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (o oneByOne) Unlock(ctx context.Context) error {
	for _, m := range slices.Backward(o) {
		if err := m.UnlockContext(ctx); err != nil {
			return err
		}
	}
	return nil
}

type multiBench struct{ m *etcdlock.MultiMutex }

func (l multiBench) Lock(ctx context.Context) error   { return l.m.LockContext(ctx) }
func (l multiBench) Unlock(ctx context.Context) error { return l.m.UnlockContext(ctx) }

// multiImpls are the two ways to take names, by sub-benchmark name.
var multiImpls = []struct {
	name string
	open func(s *etcdlock.Session, names []string) benchLocker
}{
	{"multi", func(s *etcdlock.Session, names []string) benchLocker {
		return multiBench{etcdlock.NewMultiMutex(s, names...)}
	}},
	{"one-by-one", func(s *etcdlock.Session, names []string) benchLocker {
		o := make(oneByOne, len(names))
		for i, name := range slices.Sorted(slices.Values(names)) {
			o[i] = etcdlock.NewMutex(s, name)
		}
		return o
	}},
}

// forEachMulti runs body for each number of names and each way to take
// them, on one etcd, with n lock names of the sub-benchmark's own.
func forEachMulti(b *testing.B, body func(b *testing.B, e *benchServer, names []string, open func(*etcdlock.Session, []string) benchLocker)) {
	e := startBench(b)
	for _, n := range multiNameCounts {
		for _, impl := range multiImpls {
			b.Run(fmt.Sprintf("names=%d/%s", n, impl.name), func(b *testing.B) {
				names := make([]string, n)
				for i := range names {
					names[i] = fmt.Sprintf("%s/%d", benchName(b), i)
				}
				body(b, e, names, impl.open)
			})
		}
	}
}

// BenchmarkMultiUncontended: one holder takes names nobody else wants, and
// releases them. One op is one lock of all names and one unlock.
func BenchmarkMultiUncontended(b *testing.B) {
	forEachMulti(b, func(b *testing.B, e *benchServer, names []string, open func(*etcdlock.Session, []string) benchLocker) {
		benchLockUnlock(b, e, open(benchSession(b, e.client(b)), names))
	})
}

// BenchmarkMultiContended: 4 Sessions, each on a client of its own, take
// turns on the same names. One op is one acquisition of all names; max-keys
// is the first name's.
func BenchmarkMultiContended(b *testing.B) {
	forEachMulti(b, func(b *testing.B, e *benchServer, names []string, open func(*etcdlock.Session, []string) benchLocker) {
		lockers := make([]benchLocker, 4)
		for i := range lockers {
			lockers[i] = open(benchSession(b, e.client(b)), names)
		}
		benchContend(b, e, names[0], lockers, benchOneLock)
	})
}
