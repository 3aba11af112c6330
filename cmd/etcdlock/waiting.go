package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
)

const (
	// holderReportAfter is how long run waits for the lock before it says
	// who holds it.
	holderReportAfter = 3 * time.Second
	// holderReadTimeout bounds each read of the lock's queue.
	holderReadTimeout = 2 * time.Second
	// holderRewatch is the pause before watching again when the watch ends.
	holderRewatch = time.Second
)

// A holderReport tells, while run waits for the lock, who holds it: once
// the wait has lasted holderReportAfter, then again each time the holder
// changes. It reads the queue when its watch starts and after each delete
// under the lock's name (a new key cannot change the holder), and says for
// how long the holder has held the lock at least: since it first saw it.
type holderReport struct {
	cli   *clientv3.Client
	name  string
	lease clientv3.LeaseID // ours: our own key is no one to wait for
	pick  func([]etcdlock.QueueEntry, clientv3.LeaseID) (etcdlock.QueueEntry, bool)
	out   io.Writer
	start time.Time // when the wait began

	holder   etcdlock.QueueEntry // the holder last read; Key "" if none
	since    time.Time           // when holder was first read
	due      bool                // the wait has lasted holderReportAfter
	reported string              // key of the holder last reported
}

// reportHolders starts a holderReport of the lock name for the Session s,
// writing to out the holder pick finds, and returns the function that stops
// it and waits for it.
func reportHolders(s *etcdlock.Session, name string, pick func([]etcdlock.QueueEntry, clientv3.LeaseID) (etcdlock.QueueEntry, bool), out io.Writer) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	h := &holderReport{cli: s.Client(), name: name, lease: s.Lease(), pick: pick, out: out, start: time.Now()}
	var wg sync.WaitGroup
	wg.Go(func() { h.run(ctx) })
	return func() {
		cancel()
		wg.Wait()
	}
}

func (h *holderReport) run(ctx context.Context) {
	due := time.NewTimer(holderReportAfter)
	defer due.Stop()
	var retry <-chan time.Time
	events, stopWatch := h.watch(ctx)
	defer func() { stopWatch() }()
	for {
		select {
		case <-ctx.Done():
			return
		case <-due.C:
			h.due = true
			h.report()
		case <-retry:
			retry = nil
			events, stopWatch = h.watch(ctx)
		case resp, ok := <-events:
			if !ok || resp.Canceled || resp.Err() != nil {
				stopWatch()
				events, retry = nil, time.After(holderRewatch)
				continue
			}
			// The watch's created notice, or deletes.
			h.read(ctx)
			h.report()
		}
	}
}

// watch watches the deletes under the lock's name, with a created notice.
func (h *holderReport) watch(ctx context.Context) (clientv3.WatchChan, context.CancelFunc) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	return h.cli.Watch(wctx, h.name+"/", clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithCreatedNotify()), cancel
}

// read reads the queue and notes its holder; on failure it keeps what it
// knew.
func (h *holderReport) read(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, holderReadTimeout)
	defer cancel()
	entries, err := etcdlock.Inspect(ctx, h.cli, h.name)
	if err != nil {
		return
	}
	holder, _ := h.pick(entries, h.lease)
	if holder.Key != h.holder.Key {
		h.holder, h.since = holder, time.Now()
	}
}

// report prints the holder, if the wait has lasted long enough and it was
// not printed already.
func (h *holderReport) report() {
	if !h.due || h.holder.Key == "" || h.holder.Key == h.reported {
		return
	}
	h.reported = h.holder.Key
	now := time.Now()
	// A holder seen for less than a second has just taken the lock, as far
	// as we know: say so rather than "for at least 0s".
	held := "now held"
	if d := now.Sub(h.since); d >= time.Second {
		held = fmt.Sprintf("held for at least %v", d.Truncate(time.Second))
	}
	fmt.Fprintf(h.out, "etcdlock: waiting for the lock %q (%v so far): %s by %s\n",
		h.name, now.Sub(h.start).Truncate(time.Second), held, describeHolder(h.holder))
}

// describeHolder names a holder for a message: its identity, key and token.
func describeHolder(e etcdlock.QueueEntry) string {
	who := "a holder that stored no identity"
	if e.Identity != "" {
		who = printable(e.Identity)
	}
	return fmt.Sprintf("%s (key %s, token %d)", who, printable(e.Key), e.Token)
}
