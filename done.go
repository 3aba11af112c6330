package etcdlock

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// closed is the channel Done returns when nothing is held.
var closed = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// hold is the loss signal of one hold: its channel closes when the hold ends
// or is lost. Its fields are guarded by the lock record's mu.
type hold struct {
	done     chan struct{}
	signaled bool
	stop     context.CancelFunc // stops the monitor goroutine; nil until Done is called
}

// signal closes the hold's channel, once.
func (h *hold) signal() {
	if !h.signaled {
		h.signaled = true
		close(h.done)
	}
}

// end is called when the last hold is released.
func (h *hold) end() {
	h.signal()
	if h.stop != nil {
		h.stop()
	}
}

// Done returns a channel that is closed when this process's current hold
// ends or is lost, whichever goroutine asks. It is already closed when
// nothing is held. Each new hold gets a new channel, which stays open through
// re-locks and non-final unlocks and closes on the last unlock.
//
// While the lock is held, the channel closes:
//   - within about 100 ms of our key being deleted, by anyone, or of the
//     lease being revoked (which deletes the key);
//   - when keep-alive acknowledgements have stopped for two thirds of the
//     TTL, which is before etcd can expire the lease unless a reply was
//     delayed by more than a third of the TTL; it never closes while
//     keep-alives are acknowledged on time (every TTL/3);
//   - when the Session ends.
//
// A closed channel means: stop touching the guarded resource. It does not
// release the lock: call Unlock as usual. Watching costs one etcd watch and
// one goroutine per hold, started on the first call to Done.
func (m *Mutex) Done() <-chan struct{} {
	st := m.peek()
	if st == nil {
		return closed
	}
	defer st.mu.Unlock()
	h := st.hold
	if h == nil {
		return closed
	}
	if h.stop == nil && !h.signaled {
		ctx, cancel := context.WithCancel(m.s.cs.Ctx())
		h.stop = cancel
		rev := st.rev
		if !m.s.goBackground(func() { m.monitor(ctx, st, h, rev) }) {
			h.signal()
		}
	}
	return h.done
}

// monitor closes h's channel when the hold at rev is lost, and returns when
// it is, or when ctx ends (the hold ended or the Session ended).
func (m *Mutex) monitor(ctx context.Context, st *lockState, h *hold, rev int64) {
	for from := rev + 1; from != 0; {
		from = m.watchLoss(ctx, rev, from)
	}
	st.mu.Lock()
	h.signal()
	st.mu.Unlock()
}

// watchLoss watches our key at rev from revision from. It returns 0 when the
// hold is lost, keep-alives went silent or ctx ended, and the revision to
// watch from again when the history it needed was compacted.
func (m *Mutex) watchLoss(ctx context.Context, rev, from int64) int64 {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := m.s.client.Watch(wctx, m.key, clientv3.WithRev(from), clientv3.WithFilterPut())
	timer := time.NewTimer(m.s.untilSilent())
	defer timer.Stop()
	for {
		select {
		case wr, ok := <-wch:
			if ok && wr.CompactRevision != 0 {
				// Read the key instead, and watch again from now.
				resp, err := m.s.client.Get(ctx, m.key)
				if err != nil || resp == nil || resp.Header == nil || len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != rev {
					return 0
				}
				return resp.Header.Revision + 1
			}
			if !ok || wr.Err() != nil || len(wr.Events) > 0 {
				// Deleted, or we can no longer tell: either way, stop.
				return 0
			}
		case <-timer.C:
			d := m.s.untilSilent()
			if d <= 0 {
				return 0
			}
			timer.Reset(d)
		}
	}
}

// untilSilent returns how long until keep-alives have gone unacknowledged
// for two thirds of the TTL: the point where the lease may expire soon.
func (s *Session) untilSilent() time.Duration {
	last := time.Unix(0, s.lastAck.Load())
	return time.Until(last.Add(s.ttl - s.ttl/3))
}
