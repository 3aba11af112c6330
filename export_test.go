package etcdlock

import (
	"context"

	"github.com/etcdlock/etcdlock/internal/queue"
)

// Queued returns how many goroutines of this process wait for their turn on
// the lock name of s.
func Queued(s *Session, name string) int {
	st := mutexState(s, name, false)
	if st == nil {
		return 0
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.queue)
}

// ReleaseFenced deletes m's key if its create revision is rev, as the
// release of the hold with token rev does, and reports whether it deleted a
// key.
func ReleaseFenced(ctx context.Context, m *Mutex, rev int64) (bool, error) {
	return ticketAt(m, rev).release(ctx, unlockTimeout)
}

// ReleaseLater starts the background retry of that delete, as an unlock
// that etcd did not confirm does; then runs when the retry ends.
func ReleaseLater(m *Mutex, rev int64, then func()) {
	ticketAt(m, rev).releaseLater(nil, then)
}

// ticketAt returns m's key as held with token rev.
func ticketAt(m *Mutex, rev int64) *ticket {
	tm := m.s.term.Load()
	t := m.ticket(tm)
	t.Ticket = queue.Held(tm.conn, m.rule, t.Key(), rev)
	return t
}

// FollowReread is how often Follow reads the queue again: the most a lost
// watch event delays a change.
const FollowReread = followReread

// InspectAt is Inspect with the revision of its read, which Follow watches
// from.
var InspectAt = inspectAt
