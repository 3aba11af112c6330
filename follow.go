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

// Follow sends the queue of the lock called name, as Inspect reads and
// orders it, now and after every change, until ctx ends; then it closes the
// channel. Any kind of key Inspect reads is seen: Mutex, Lead, RWMutex,
// Semaphore, concurrency.Mutex and Election, etcdctl lock, etcd's recipe
// RWMutex. Keys of locks nested under the name are not.
//
// It reads the queue once, then watches the lock's prefix from the revision
// of that read, so that no change in between is missed, and keeps the queue
// from the watch's events. It never sends a queue older than one it sent,
// and sends nothing when a change leaves the queue as it was (a nested
// lock's key, a Semaphore's wake-up). A receiver that is busy when the
// queue changes gets the newest queue when it next receives, not each one in
// between: a queue that lasted less than that may never be seen. Each queue
// sent is a new slice, the receiver's to keep.
//
// Faults cost time, never a wrong queue: when the watch fails, is cancelled
// or its history was compacted, Follow reads again and watches from that
// read; while etcd is unreachable, or a new watch is cancelled again, it
// retries, 50 ms doubling to 1 s apart, each read bounded by 2 s; and it reads the queue again every 5 s, so that
// a change whose watch event etcd lost (etcd #17529, #18089, #19179, #20221)
// is sent at most 5 s late. Nothing is sent before the first read succeeds.
// A watch on a member that has lost its raft leader is cancelled, and read
// again elsewhere.
//
// Follow writes nothing to etcd; it costs one watch and a read every 5 s.
// Its goroutine ends, and the channel is closed, when ctx ends or the client
// is closed. Given a nil context, a nil client or the empty name, it returns
// a closed channel and sends nothing: Inspect says what is wrong.
func Follow(ctx context.Context, client *clientv3.Client, name string) <-chan []QueueEntry {
	return follow(ctx, client, name, slices.Clone, slices.Equal)
}

// LeaderOf returns the holder of the Mutex queue of name: the leader of
// Lead, or the holder of a Mutex, concurrency.Mutex or etcdctl lock, or the
// leader of etcd's concurrency.Election (its Identity is then the
// Election's value). It returns an error wrapping ErrNoLeader when nobody
// holds that queue (an RWMutex's or Semaphore's holders lead nothing), and
// Inspect's errors. It is one read, and writes nothing.
//
// The leader it returns may have lost the lead since; Held.IsOwner,
// for the leader itself, and fencing tokens are what make that safe. A
// leader cut off from etcd stays the holder until its lease expires,
// although its f has been cancelled before: LeaderOf names whoever holds
// the key.
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

// FollowLeader sends the leader of name, as LeaderOf finds it, now and
// each time it changes, until ctx ends; then it closes the channel. The
// zero QueueEntry (Key "") says that nobody leads. A new term of the same
// process is a change (a new key, with a new token).
//
// It is how every candidate of Lead, and every follower, learns who leads
// (client-go's OnNewLeader, etcd's Election.Observe): run it beside Lead,
// with the same client and name. It is Follow, with its guarantees: it
// writes nothing, never goes back to an older leader, sends a leader once,
// and a busy receiver gets the newest leader when it next receives.
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
	f := &follower[T]{client: client, pfx: name + "/", keys: map[string]*mvccpb.KeyValue{}, view: view, same: same, out: out}
	go f.run(ctx)
	return out
}

// A follower keeps the keys of one lock's queues, as of a revision, from
// reads and a watch, and sends their views.
type follower[T any] struct {
	client *clientv3.Client
	pfx    string
	keys   map[string]*mvccpb.KeyValue // the queues' keys, as of rev
	rev    int64                       // 0 before the first read

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
	resp, err := f.client.Get(rctx, f.pfx, clientv3.WithPrefix())
	switch {
	case err != nil:
		return err
	case resp == nil || resp.Header == nil:
		return errMalformed
	case resp.Header.Revision < f.rev:
		return nil
	}
	f.rev = resp.Header.Revision
	clear(f.keys)
	for _, kv := range resp.Kvs {
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
	q := queueOf(f.pfx, kvs)
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
