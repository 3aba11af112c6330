package etcdlock_test

import (
	"bytes"
	"runtime"
	"strconv"
	"sync"
	"testing"

	"github.com/petermattis/goid"
)

// stackGoid returns the calling goroutine's id from the "goroutine N [" header
// of runtime.Stack: slow, but the runtime's own word.
func stackGoid(t *testing.T) int64 {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	rest, ok := bytes.CutPrefix(buf, []byte("goroutine "))
	if !ok {
		t.Errorf("stack header: got %q, want \"goroutine N [\"", buf)
		return -1
	}
	n, _, ok := bytes.Cut(rest, []byte(" ["))
	if !ok {
		t.Errorf("stack header: got %q, want \"goroutine N [\"", buf)
		return -1
	}
	id, err := strconv.ParseInt(string(n), 10, 64)
	if err != nil {
		t.Errorf("goroutine id in %q: %v", buf, err)
		return -1
	}
	return id
}

// TestGoid: goid.Get, which reads the runtime's goroutine struct at an offset
// copied from the Go version it was written for, agrees with runtime.Stack in
// many goroutines, including ones running at the same time. The reentrant
// lock's holder is identified by it.
func TestGoid(t *testing.T) {
	if got, want := goid.Get(), stackGoid(t); got != want {
		t.Fatalf("goid.Get in the test goroutine: got %d, want %d", got, want)
	}
	const goroutines = 200
	ids := make(chan int64, goroutines)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			<-start
			for range 10 {
				if got, want := goid.Get(), stackGoid(t); got != want {
					t.Errorf("goid.Get: got %d, want %d", got, want)
					return
				}
				runtime.Gosched()
			}
			ids <- goid.Get()
		})
	}
	close(start)
	wg.Wait()
	close(ids)
	seen := make(map[int64]bool)
	for id := range ids {
		if seen[id] {
			t.Errorf("goid.Get: got id %d in two goroutines, want distinct ids", id)
		}
		seen[id] = true
	}
}
