package etcdlock

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/etcdlock/etcdlock/internal/queue"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Followers: who holds a lock, and every change, for those that do not.

const (
	// followReread is how often an observer reads the queue again, watch or
	// no watch: the most a change whose watch event was lost waits.
	followReread = 5 * time.Second
	// followReadTimeout bounds each read of an observer.
	followReadTimeout = 2 * time.Second
)

// Follow sends the queue of name as Inspect reads it, now and at each change,
// never older or unchanged (a busy receiver gets the newest; slices are its
// own) until ctx ends or the client closes (bad input: at once), then closes
// the channel. It writes nothing; a lost event comes 5 s late at most.
func Follow(ctx context.Context, client *clientv3.Client, name string) <-chan []QueueEntry {
	return follow(ctx, client, name, slices.Clone, slices.Equal)
}

// LeaderOf reads the holder of name's Mutex queue (Lead's leader), else
// ErrNoLeader, wrapped, or Inspect's errors. It may be cut off: fence.
func LeaderOf(ctx context.Context, client *clientv3.Client, name string) (QueueEntry, error) {
	entries, err := Inspect(ctx, client, name)
	if err != nil {
		return QueueEntry{}, err
	}
	if l := leaderIn(entries); l.Key != "" {
		return l, nil
	}
	return QueueEntry{}, errorf("leader", name, ErrNoLeader)
}

// FollowLeader sends LeaderOf's answer (zero: none), now and at each change (a
// new term too), as Follow does; a candidate giving way to a hand-over too.
func FollowLeader(ctx context.Context, client *clientv3.Client, name string) <-chan QueueEntry {
	return follow(ctx, client, name, leaderIn, func(a, b []QueueEntry) bool { return leaderIn(a) == leaderIn(b) })
}

// leaderIn returns the holder of the Mutex queue among entries, or the zero
// QueueEntry.
func leaderIn(entries []QueueEntry) QueueEntry {
	for _, e := range entries {
		if e.Holds && e.Kind == KindMutex {
			return e
		}
	}
	return QueueEntry{}
}

// follow starts the goroutine that follows the queue of the lock name and
// sends view of each queue that is not the same as the last one sent; it
// returns its channel, closed when it ends. view must return a value of the
// receiver's own: the queue it is given is kept.
func follow[T any](ctx context.Context, client *clientv3.Client, name string, view func([]QueueEntry) T, same func(a, b []QueueEntry) bool) <-chan T {
	out := make(chan T)
	if ctx == nil || client == nil || name == "" {
		close(out)
		return out
	}
	f := &follower[T]{client: client, pfx: name + "/", name: name, keys: map[string]*mvccpb.KeyValue{}, view: view, same: same, out: out}
	go f.run(ctx)
	return out
}

// A follower keeps the keys of one lock's queues, as of a revision, from
// reads and a watch, and sends their views.
type follower[T any] struct {
	client *clientv3.Client
	pfx    string
	name   string
	keys   map[string]*mvccpb.KeyValue // the queues' keys, as of rev
	rec    *mvccpb.KeyValue            // a Semaphore's limit record, as of the last read (not watched); nil if none
	rev    int64                       // 0 before the first read
	// recRead: the last read read the record (its queue had permits);
	// stale: permits came by the watch with the record unread: read again.
	recRead, stale bool

	view func([]QueueEntry) T
	same func(a, b []QueueEntry) bool
	out  chan<- T

	sent, pending []QueueEntry // the queue last sent, and the one to send
	sentAny       bool
	next          T // view(pending), while pending is not nil
}

// run follows the queue until ctx ends or the client is closed, then closes
// the channel. It sends while it waits for anything else, so that a slow
// receiver never holds up the watch: only the newest queue waits.
func (f *follower[T]) run(ctx context.Context) {
	defer close(f.out)
	retry := newBackoff()
	var (
		w       *followWatch // nil while a read must come first
		opened  <-chan clientv3.WatchChan
		events  clientv3.WatchChan
		retryAt <-chan time.Time
	)
	defer func() {
		if w != nil {
			w.stop()
		}
	}()
	// start reads, then watches from the read; or, if the read fails, sets
	// the time of the next try. The pauses grow until a watch is created:
	// a read that works and a watch that etcd cancels at once (compacted
	// again, a member without a leader) do not loop.
	start := func() {
		if f.read(ctx) != nil {
			retryAt = time.After(retry.next())
			return
		}
		w = f.watch(ctx)
		opened = w.opened
	}
	reread := time.NewTicker(followReread)
	defer reread.Stop()
	start()
	for {
		var send chan<- T
		if f.pending != nil {
			send = f.out
		}
		select {
		case send <- f.next:
			f.sent, f.sentAny, f.pending = f.pending, true, nil
			var zero T
			f.next = zero
		case events = <-opened:
			opened = nil
		case wr, ok := <-events:
			if ok && !wr.Canceled && wr.Err() == nil && wr.CompactRevision == 0 {
				if wr.Created {
					retry.reset()
				}
				f.apply(wr.Events)
				if f.stale {
					// A Semaphore's first permits: read its limit record
					// with its keys (on failure, the next re-read).
					f.stale = false
					_ = f.read(ctx)
				}
				continue
			}
			// Broken, cancelled (a member without a leader) or compacted:
			// read again, and watch from that read.
			w.stop()
			w, opened, events = nil, nil, nil
			if ctx.Err() != nil || f.client.Ctx().Err() != nil {
				return
			}
			retryAt = time.After(retry.next())
		case <-retryAt:
			retryAt = nil
			if f.client.Ctx().Err() != nil {
				return
			}
			start()
		case <-reread.C:
			if w != nil {
				_ = f.read(ctx) // on failure, the watch may still be sound
			}
		case <-ctx.Done():
			return
		}
	}
}

// read reads the queues' keys. A read older than what is known changes
// nothing (a watch served by a member ahead of the one that read).
func (f *follower[T]) read(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, followReadTimeout)
	defer cancel()
	kvs, rec, rev, err := readKeys(rctx, f.client, f.name, false)
	switch {
	case err != nil:
		return err
	case rev < f.rev:
		return nil
	}
	f.rev, f.rec = rev, rec
	f.recRead = hasPermits(f.pfx, kvs) // readKeys read the record then
	clear(f.keys)
	for _, kv := range kvs {
		if inQueue(f.pfx, kv.Key) {
			f.keys[string(kv.Key)] = kv
		}
	}
	f.changed()
	return nil
}

// apply applies the events of a watch response that came after what is
// known: a watch can deliver older ones (etcd #20221), which the read has
// seen. Events come in revision order, a revision's all in one response.
func (f *follower[T]) apply(events []*clientv3.Event) {
	events = queue.After(events, f.rev)
	if len(events) == 0 {
		return
	}
	touched := false
	for _, ev := range events {
		if ev.Kv == nil {
			continue
		}
		f.rev = max(f.rev, ev.Kv.ModRevision)
		switch {
		case !inQueue(f.pfx, ev.Kv.Key):
			continue // a nested lock's
		case ev.Type == clientv3.EventTypeDelete:
			delete(f.keys, string(ev.Kv.Key))
		default:
			f.keys[string(ev.Kv.Key)] = ev.Kv
			f.stale = f.stale || (!f.recRead && hasPermits(f.pfx, []*mvccpb.KeyValue{ev.Kv}))
		}
		touched = true
	}
	if touched {
		f.changed()
	}
}

// changed makes the queue of the keys the next to send, unless it is the
// same as the last one sent.
func (f *follower[T]) changed() {
	kvs := make([]*mvccpb.KeyValue, 0, len(f.keys))
	for _, kv := range f.keys {
		kvs = append(kvs, kv)
	}
	q := queueOf(f.pfx, kvs, f.rec)
	var zero T
	if f.sentAny && f.same(q, f.sent) {
		f.pending, f.next = nil, zero
		return
	}
	f.pending, f.next = q, f.view(q)
}

// A followWatch is the watch of a follower, from one revision.
type followWatch struct {
	opened <-chan clientv3.WatchChan // the watch, once open
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// watch starts watching the lock's prefix from the revision after the keys
// known. Opening a watch blocks while etcd is unreachable (the client dials
// a new stream), so a goroutine of its own opens it, and stop waits for it.
// A member that loses its raft leader cancels the watch (WithRequireLeader)
// rather than serve it from a state that no longer moves.
func (f *follower[T]) watch(ctx context.Context) *followWatch {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	opened := make(chan clientv3.WatchChan, 1)
	w := &followWatch{opened: opened, cancel: cancel}
	from := f.rev + 1
	w.wg.Go(func() {
		opened <- f.client.Watch(wctx, f.pfx, clientv3.WithPrefix(), clientv3.WithRev(from), clientv3.WithCreatedNotify())
	})
	return w
}

// stop ends the watch, and waits for its opening to return.
func (w *followWatch) stop() {
	w.cancel()
	w.wg.Wait()
}
