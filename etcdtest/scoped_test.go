package etcdtest_test

import (
	"os"
	"testing"
)

// scopedTB is a testing.TB whose cleanups and temporary directories end with
// its own cleanup call rather than with the test. BenchmarkStart uses one per
// iteration so that servers and data directories do not pile up.
type scopedTB struct {
	testing.TB
	cleanups []func()
}

func (t *scopedTB) Cleanup(f func()) { t.cleanups = append(t.cleanups, f) }

func (t *scopedTB) TempDir() string {
	dir, err := os.MkdirTemp("", "etcdtest")
	if err != nil {
		t.Fatalf("temp dir: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// cleanup runs the cleanups, last registered first, like testing does.
func (t *scopedTB) cleanup() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
	t.cleanups = nil
}
