package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
)

const (
	demoLeadTTL = 2 * time.Second // lease TTL of the candidates' sessions
	// demoFailoverWait bounds a backup's takeover: the contract's TTL + 1 s,
	// twice.
	demoFailoverWait = 2 * (demoLeadTTL + time.Second)
)

// A candidate runs etcdlock.Lead with a client of its own.
type candidate struct {
	id    string
	cli   *clientv3.Client
	proxy *etcdtest.Proxy    // between the client and etcd; nil with --endpoints
	stop  context.CancelFunc // ends its Lead
	// dead is set before its client is closed: its Lead may then return
	// an error (the Session gone with the client) before stop ends it.
	dead atomic.Bool
}

// A leadLog records the candidates' terms: when each f started and ended.
type leadLog struct {
	mu       sync.Mutex
	running  map[string]bool
	terms    []leadTerm
	overlaps []string      // f started while another ran
	changed  chan struct{} // closed and replaced on every start and end
}

type leadTerm struct {
	who        string
	token      int64
	start, end time.Time
}

// duty returns who's f for Lead: it records its term, and runs until its
// context is cancelled.
func (l *leadLog) duty(d *demo, who string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		h, _ := etcdlock.HoldFrom(ctx)
		l.mu.Lock()
		for other := range l.running {
			l.overlaps = append(l.overlaps, fmt.Sprintf("%s's f started while %s's ran", who, other))
		}
		l.running[who] = true
		l.terms = append(l.terms, leadTerm{who: who, token: h.Token, start: time.Now()})
		i := len(l.terms) - 1
		l.notify()
		l.mu.Unlock()
		d.event(who, h.Token, "leads: f starts (token from HoldFrom)")

		<-ctx.Done()
		l.mu.Lock()
		l.terms[i].end = time.Now()
		delete(l.running, who)
		l.notify()
		l.mu.Unlock()
		d.event(who, 0, "f's context is cancelled: f returns")
		return nil
	}
}

func (l *leadLog) notify() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// leader waits at most wait for the f of a candidate other than not to
// run, and returns its term.
func (l *leadLog) leader(ctx context.Context, not string, wait time.Duration) (leadTerm, bool) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		for i := len(l.terms) - 1; i >= 0; i-- {
			if t := l.terms[i]; t.who != not && t.end.IsZero() {
				l.mu.Unlock()
				return t, true
			}
		}
		ch := l.changed
		l.mu.Unlock()
		select {
		case <-ch:
		case <-deadline.C:
			return leadTerm{}, false
		case <-ctx.Done():
			return leadTerm{}, false
		}
	}
}

// last returns who's last term.
func (l *leadLog) last(who string) leadTerm {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.terms) - 1; i >= 0; i-- {
		if l.terms[i].who == who {
			return l.terms[i]
		}
	}
	return leadTerm{}
}

// failover is phase 6: three candidates lead in turn; the leader dies, then
// the next leader is cut off from etcd (or, without the embedded etcd's
// proxies, dies too).
func (d *demo) failover(ctx context.Context) {
	name := d.base + "/leader"
	cands, err := d.candidates()
	if err != nil {
		d.fail("admin", err)
		return
	}
	defer func() {
		for _, c := range cands {
			c.cli.Close()
		}
	}()
	first, second := cands[0], cands[1]
	how := "is cut off from etcd"
	if second.proxy == nil {
		how = "dies too"
	}
	d.phase("6. failover: %d candidates run etcdlock.Lead (TTL %v); the leader dies, then the next leader %s", len(cands), demoLeadTTL, how)

	log := &leadLog{running: map[string]bool{}, changed: make(chan struct{})}
	lctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		stop()
		wg.Wait()
	}()
	for i, c := range cands {
		cctx, cancel := context.WithCancel(lctx)
		c.stop = cancel
		wg.Go(func() {
			err := etcdlock.Lead(cctx, c.cli, name, log.duty(d, c.id), etcdlock.WithTTL(demoLeadTTL), etcdlock.WithIdentity(c.id))
			if cctx.Err() == nil && !c.dead.Load() {
				d.fail(c.id, fmt.Errorf("etcdlock.Lead returned before it was stopped: %v", err))
			}
		})
		// Queue them in order: the first leads, the others wait behind.
		if i == 0 {
			if _, ok := log.leader(ctx, "", demoFailoverWait); !ok {
				d.fail(c.id, fmt.Errorf("did not lead within %v", demoFailoverWait))
				return
			}
		} else if !d.waitQueue(ctx, name, i+1) {
			d.fail(c.id, fmt.Errorf("not queued within %v", demoQueueWait))
			return
		}
	}
	d.event("admin", 0, "queue in etcd: %s", d.leadQueue(ctx, name))

	// The dead one's Lead takes longest to return (its release and revoke
	// run to their bounds): it dies first.
	d.takeover(ctx, log, first, false)
	d.takeover(ctx, log, second, second.proxy != nil)
	d.event("admin", 0, "stop: every Lead's context is cancelled")
	stop()
	wg.Wait()
	d.event("admin", 0, "every Lead returned")

	log.mu.Lock()
	terms, overlaps := append([]leadTerm(nil), log.terms...), log.overlaps
	log.mu.Unlock()
	tokens := make([]int64, len(terms))
	for i, t := range terms {
		tokens[i] = t.token
	}
	d.check(len(terms) >= 3 && increasing(tokens) && len(overlaps) == 0,
		"failover: one leader at a time: tokens from HoldFrom strictly increase over %d terms (%s), no two f ran at once (%d overlaps%s)",
		len(terms), joinInts(tokens), len(overlaps), firstOf(overlaps))
}

// takeover makes the leader c fail, cut off from etcd or dead, and checks
// that a backup took over, after c's f was cancelled.
func (d *demo) takeover(ctx context.Context, log *leadLog, c *candidate, cut bool) {
	if ctx.Err() != nil {
		return
	}
	t0 := time.Now()
	what := "cut off"
	if cut {
		c.proxy.Blackhole()
		d.event("admin", 0, "cut %s off from etcd: its proxy drops all traffic", c.id)
	} else {
		what = "died"
		// Nothing more reaches etcd from it: no release, no revoke.
		if c.proxy != nil {
			c.proxy.Blackhole()
		}
		d.event("admin", 0, "%s dies: its client is closed; its key stays until its lease expires", c.id)
		c.dead.Store(true)
		c.cli.Close()
		c.stop()
	}
	next, ok := log.leader(ctx, c.id, demoFailoverWait)
	if cut {
		c.proxy.Unblackhole()
		d.event("admin", 0, "%s's proxy forwards again", c.id)
	}
	old := log.last(c.id)
	if !ok {
		d.check(false, "failover: %s %s: no backup led within %v", c.id, what, demoFailoverWait)
		return
	}
	cancelled, led := old.end.Sub(t0), next.start.Sub(t0)
	d.check(!old.end.IsZero() && old.end.Before(next.start),
		"failover: %s %s: its f was cancelled %d ms after, before %s's f started, %d ms after (bound %v)",
		c.id, what, cancelled.Milliseconds(), next.who, led.Milliseconds(), demoFailoverWait)
}

// candidates connects three candidates, each through a proxy of its own
// with the embedded etcd.
func (d *demo) candidates() ([]*candidate, error) {
	var cands []*candidate
	for i := range 3 {
		c := &candidate{id: fmt.Sprintf("c%d", i+1)}
		var err error
		if d.dialProxied != nil {
			c.cli, c.proxy, err = d.dialProxied()
		} else {
			c.cli, err = d.dial()
		}
		if err != nil {
			for _, c := range cands {
				c.cli.Close()
			}
			return nil, err
		}
		cands = append(cands, c)
	}
	return cands, nil
}

// leadQueue describes the queue of name: who leads, who waits.
func (d *demo) leadQueue(ctx context.Context, name string) string {
	ctx, cancel := context.WithTimeout(ctx, demoOpTimeout)
	defer cancel()
	entries, err := etcdlock.Inspect(ctx, d.admin, name)
	if err != nil {
		return err.Error()
	}
	holders, waiters := queueIdentities(entries)
	return fmt.Sprintf("%s leads; %s wait", holders, waiters)
}
