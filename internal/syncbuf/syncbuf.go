// Package syncbuf has the buffer that tests of several packages read while
// a process or goroutine writes to it.
package syncbuf

import (
	"bytes"
	"sync"
)

// A Buffer is a bytes.Buffer that one goroutine may write to while others
// read it. The zero Buffer is ready to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p, as bytes.Buffer.Write does.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
