package etcdlock

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/etcdlock/etcdlock/internal/queue"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Someone is waiting: a hold learns that another acquisition queues behind
// it, from a watch of its lock's queue that starts on the first ask and
// stops at the first waiter, at the hold's end, or at its lease term's end.

const (
	// waitingRetry is the pause before a failed read or watch of the queue
	// is tried again.
	waitingRetry = 500 * time.Millisecond
	// waitingReadTimeout bounds a read of the queue.
	waitingReadTimeout = 3 * time.Second
)

// errWatchEnded: a watch of the queue failed or was closed.
var errWatchEnded = errors.New("etcdlock: watch of the queue ended")

// errHoldGone: a read of the queue found a key of the hold gone (released,
// capped, expired): nobody waits behind it any more.
var errHoldGone = errors.New("etcdlock: the hold's key is gone")

// Waiting returns a channel closed once an acquisition of another Session
// waits behind this hold (a MultiMutex's: on any name), even if it gave up
// since; not at the hold's end (select on Done too). One read, then a watch:
// an event etcd lost delays it a TTL at most. The zero Hold's is nil.
func (h Hold) Waiting() <-chan struct{} {
	if h.h == nil {
		return nil
	}
	return h.h.waiters()
}

// Waiting returns Hold.Waiting's channel for p; nil for a nil Permit.
func (p *Permit) Waiting() <-chan struct{} {
	if p == nil {
		return nil
	}
	return p.h.waiters()
}

// waiters returns the hold's waiting signal, starting on the first call the
// goroutine that closes it.
func (h *keyHold) waiters() <-chan struct{} {
	s := h.t.s
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.waiting == nil {
		h.waiting = make(chan struct{})
		if !h.ended {
			ctx, cancel := context.WithCancel(h.t.term.ctx())
			h.stopWaiting = cancel
			if !s.goBackground(func() { h.watchWaiters(ctx) }) {
				cancel()
			}
		}
	}
	return h.waiting
}

// watchWaiters closes the waiting signal once a queue of the hold has a key
// that does not hold, or returns when ctx ends (the hold or its term
// ended). It reads the queues, then watches them for puts from that read
// on, reading again after each put of a queue's key.
func (h *keyHold) watchWaiters(ctx context.Context) {
	for ctx.Err() == nil {
		rev, waits, err := h.readWaiters(ctx)
		switch {
		case waits:
			close(h.waiting)
			return
		case errors.Is(err, errHoldGone):
			return
		case err == nil:
			err = h.awaitPut(ctx, rev)
		}
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(waitingRetry):
			}
		}
	}
}

// readWaiters reads the hold's queues, in one Txn, and reports whether one
// of them has a key of another Session that does not hold, and the revision
// of the read; errHoldGone if a key of the hold is not there, at its token.
func (h *keyHold) readWaiters(ctx context.Context) (int64, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, waitingReadTimeout)
	defer cancel()
	names := queueNames(h.t.kind, h.t.lock, h.t.Keys())
	// Each queue, and a permit's limit record (a lock's hold needs no
	// permission on it; a role that may not read it counts the holders as
	// Inspect then does).
	permit := h.t.kind == KindSemaphore
	var ops []clientv3.Op
	read := func() (*clientv3.TxnResponse, error) {
		ops = make([]clientv3.Op, 0, 2*len(names))
		for _, name := range names {
			ops = append(ops, clientv3.OpGet(name+"/", clientv3.WithPrefix()))
			if permit {
				ops = append(ops, clientv3.OpGet(queue.LimitKey(name)))
			}
		}
		return h.t.s.client.Txn(ctx).Then(ops...).Commit()
	}
	resp, err := read()
	if permit && errors.Is(err, rpctypes.ErrPermissionDenied) {
		permit = false
		resp, err = read()
	}
	switch {
	case err != nil:
		return 0, false, err
	case resp == nil || resp.Header == nil || len(resp.Responses) != len(ops):
		return 0, false, errMalformed
	}
	ours, token := h.t.Keys(), h.token()
	found, waits := 0, false
	replies := resp.Responses
	for _, name := range names {
		r := replies[0].GetResponseRange()
		if r == nil {
			return 0, false, errMalformed
		}
		var rec *mvccpb.KeyValue
		if permit {
			var err error
			if _, rec, err = queueReply(&clientv3.TxnResponse{Header: resp.Header, Responses: replies[:2]}); err != nil {
				return 0, false, err
			}
			replies = replies[1:]
		}
		replies = replies[1:]
		for _, e := range queueOf(name+"/", r.Kvs, rec) {
			switch {
			case slices.Contains(ours, e.Key):
				if e.Token == token {
					found++
				}
			case !e.Holds && e.Lease != h.t.term.id:
				waits = true
			}
		}
	}
	if found < len(ours) {
		return 0, false, errHoldGone
	}
	return resp.Header.Revision, waits, nil
}

// awaitPut watches the hold's queues for puts after revision rev, and
// returns nil at the first put of a queue's key or after a TTL, or an error
// when the watch fails or ctx ends.
func (h *keyHold) awaitPut(ctx context.Context, rev int64) error {
	names := queueNames(h.t.kind, h.t.lock, h.t.Keys())
	wctx, cancel := context.WithCancel(ctx)
	responses := make(chan watched)
	var wg sync.WaitGroup
	for _, name := range names {
		wg.Go(func() {
			forward(wctx, h.t.s.client.Watch(wctx, name+"/", clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithFilterDelete()), responses, func(w watched) watched { return w })
		})
	}
	defer wg.Wait()
	defer cancel()
	reread := time.NewTimer(h.t.term.ttl)
	defer reread.Stop()
	for {
		select {
		case <-reread.C:
			return nil
		case w := <-responses:
			if !w.ok || w.wr.Err() != nil {
				return errWatchEnded
			}
			for _, ev := range w.wr.Events {
				if inQueues(names, ev.Kv.Key) {
					return nil
				}
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
