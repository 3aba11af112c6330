package etcdlock

import (
	"context"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// closed is the channel Done returns when nothing is held.
var closed = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// A hold is one hold of a key in etcd, from its acquisition to its release:
// its fencing token and its loss signal, whose channel closes when the hold
// ends or is lost.
type hold struct {
	rev int64 // our key's create revision: the fencing token

	mu       sync.Mutex
	done     chan struct{}
	signaled bool
	stop     context.CancelFunc // stops the monitor goroutine; nil until lost is called
}

func newHold(rev int64) *hold {
	return &hold{rev: rev, done: make(chan struct{})}
}

// again returns a new hold of the same key: a local hand-off keeps the key
// and token but gives the next goroutine a loss signal of its own.
func (h *hold) again() *hold { return newHold(h.rev) }

// signal closes the hold's channel, once.
func (h *hold) signal() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.signaled {
		h.signaled = true
		close(h.done)
	}
}

// end is called when the hold is released: it closes the channel and stops
// the monitor.
func (h *hold) end() {
	h.signal()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stop != nil {
		h.stop()
	}
}

// lost returns the hold's loss signal for our key, starting on the first
// call a goroutine of the Session that closes it when the hold is lost.
//
// The channel closes:
//   - within about 100 ms of our key being deleted, by anyone, or of the
//     lease being revoked (which deletes the key);
//   - when keep-alive acknowledgements have stopped for two thirds of the
//     TTL, which is before etcd can expire the lease unless a reply was
//     delayed by more than a third of the TTL; never while keep-alives are
//     acknowledged on time (every TTL/3);
//   - when the Session ends, and when the hold ends.
func (h *hold) lost(s *Session, key string) <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stop == nil && !h.signaled {
		ctx, cancel := context.WithCancel(s.cs.Ctx())
		h.stop = cancel
		if !s.goBackground(func() { h.monitor(ctx, s, key) }) {
			h.signaled = true
			close(h.done)
		}
	}
	return h.done
}

// monitor closes the channel when the hold is lost, and returns when it is,
// or when ctx ends (the hold ended or the Session ended).
func (h *hold) monitor(ctx context.Context, s *Session, key string) {
	for from := h.rev + 1; from != 0; {
		from = h.watchLoss(ctx, s, key, from)
	}
	h.signal()
}

// watchLoss watches our key from revision from. It returns 0 when the hold is
// lost, keep-alives went silent or ctx ended, and the revision to watch from
// again when the history it needed was compacted.
func (h *hold) watchLoss(ctx context.Context, s *Session, key string, from int64) int64 {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := s.client.Watch(wctx, key, clientv3.WithRev(from), clientv3.WithFilterPut())
	timer := time.NewTimer(s.untilSilent())
	defer timer.Stop()
	for {
		select {
		case wr, ok := <-wch:
			if ok && wr.CompactRevision != 0 {
				// Read the key instead, and watch again from now.
				resp, err := s.client.Get(ctx, key)
				if err != nil || resp == nil || resp.Header == nil || len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != h.rev {
					return 0
				}
				return resp.Header.Revision + 1
			}
			if !ok || wr.Err() != nil || len(wr.Events) > 0 {
				// Deleted, or we can no longer tell: either way, stop.
				return 0
			}
		case <-timer.C:
			d := s.untilSilent()
			if d <= 0 {
				return 0
			}
			timer.Reset(d)
		}
	}
}
