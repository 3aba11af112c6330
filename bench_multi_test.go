package etcdlock_test

// Benchmarks of MultiMutex beside the same names taken one by one with
// Mutexes, in sorted order (the order that keeps lock-by-lock from waiting
// in a cycle), released in reverse: each pair, …/multi and …/one-by-one,
// runs on the same embedded etcd. The metrics are bench_test.go's.

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/etcdlock/etcdlock"
)

// multiNameCounts are the numbers of names a benchmark takes at once.
var multiNameCounts = []int{2, 4, 8}

// A multiTaker takes and releases a fixed set of names: at once, or one by
// one.
type multiTaker interface {
	Lock(ctx context.Context) error
	Unlock(ctx context.Context) error
}

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

type multiTakerOf struct{ m *etcdlock.MultiMutex }

func (t multiTakerOf) Lock(ctx context.Context) error   { return t.m.LockContext(ctx) }
func (t multiTakerOf) Unlock(ctx context.Context) error { return t.m.UnlockContext(ctx) }

// multiImpls are the two ways to take names, by sub-benchmark name.
var multiImpls = []struct {
	name string
	open func(s *etcdlock.Session, names []string) multiTaker
}{
	{"multi", func(s *etcdlock.Session, names []string) multiTaker {
		return multiTakerOf{etcdlock.NewMultiMutex(s, names...)}
	}},
	{"one-by-one", func(s *etcdlock.Session, names []string) multiTaker {
		o := make(oneByOne, len(names))
		for i, name := range slices.Sorted(slices.Values(names)) {
			o[i] = etcdlock.NewMutex(s, name)
		}
		return o
	}},
}

// benchMultiNames returns n lock names of the benchmark's own.
func benchMultiNames(b *testing.B, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s/%d", benchName(b), i)
	}
	return names
}

// BenchmarkMultiUncontended: one holder takes names nobody else wants, and
// releases them. One op is one lock of all names and one unlock.
func BenchmarkMultiUncontended(b *testing.B) {
	e := startBench(b)
	for _, n := range multiNameCounts {
		for _, impl := range multiImpls {
			b.Run(fmt.Sprintf("names=%d/%s", n, impl.name), func(b *testing.B) {
				s, err := etcdlock.NewSession(e.client(b))
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				l := impl.open(s, benchMultiNames(b, n))
				ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
				defer cancel()
				m := e.startMeter(b)
				for b.Loop() {
					if err := l.Lock(ctx); err != nil {
						b.Fatalf("Lock: %v", err)
					}
					if err := l.Unlock(ctx); err != nil {
						b.Fatalf("Unlock: %v", err)
					}
				}
				m.report(b, b.N)
			})
		}
	}
}

// BenchmarkMultiContended: 4 Sessions, each on a client of its own, take
// turns on the same names. One op is one acquisition of all names.
func BenchmarkMultiContended(b *testing.B) {
	const sessions = 4
	e := startBench(b)
	for _, n := range multiNameCounts {
		for _, impl := range multiImpls {
			b.Run(fmt.Sprintf("names=%d/%s", n, impl.name), func(b *testing.B) {
				names := benchMultiNames(b, n)
				takers := make([]multiTaker, sessions)
				for i := range takers {
					s, err := etcdlock.NewSession(e.client(b))
					if err != nil {
						b.Fatal(err)
					}
					defer s.Close()
					takers[i] = impl.open(s, names)
				}
				ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
				defer cancel()
				m := e.startMeter(b)
				ops := make(chan struct{}, b.N)
				for range b.N {
					ops <- struct{}{}
				}
				close(ops)
				b.ResetTimer()
				var wg sync.WaitGroup
				for _, l := range takers {
					wg.Go(func() {
						for range ops {
							if err := l.Lock(ctx); err != nil {
								b.Errorf("Lock: %v", err)
								return
							}
							if err := l.Unlock(ctx); err != nil {
								b.Errorf("Unlock: %v", err)
								return
							}
						}
					})
				}
				wg.Wait()
				b.StopTimer()
				m.report(b, b.N)
			})
		}
	}
}
