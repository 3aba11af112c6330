package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
)

const (
	demoTTL        = 5 * time.Second        // lease TTL of each worker's session
	demoTryWait    = 200 * time.Millisecond // the TryLockFor that times out
	demoLossWait   = 3 * time.Second        // bound on Done() after a revoke
	demoQueueWait  = 3 * time.Second        // bound on a waiter's key showing up
	demoSleep      = 5 * time.Millisecond   // between the counter's read and write
	demoOpTimeout  = 5 * time.Second        // bound on the demo's own etcd reads
	demoMinWorkers = 4                      // phase 2 needs a holder and three others
	demoPrefix     = "etcdlock-demo/"       // every run writes under demoPrefix<random id>/
)

const demoAbout = `Runs a short, self-checking demo of the etcdlock package. Several workers,
each with its own etcd client and session, contend for one lock:

  1. each takes it a few times, locks it again inside (HoldCount 2, no etcd
     call), and increments a shared counter: read, sleep, write;
  2. while one holds it, another's TryLock reports busy at once, a third's
     TryLockFor times out, and a fourth's LockContext is cancelled while it
     waits, leaving no key behind;
  3. the holder's lease is revoked: its Done() channel closes and a write
     guarded by IsOwner() is rejected; the next holder gets a higher token.

Then the rest of the family:

  4. read-write lock: all workers read at once; then two write while the
     others read: readers overlap, a writer is always alone;
  5. semaphore of limit 2: never more than 2 holders, each among the 2
     oldest keys in etcd (Inspect), and the limit is reached;
  6. failover: three candidates run etcdlock.Lead (TTL 2s); the leader dies,
     then the next leader is cut off from etcd (dies too, with --endpoints);
     a backup takes over each time, after the old leader's f was cancelled.

It prints a timeline (elapsed ms, who, event, fencing token), then PASS or
FAIL for each check, and exits 1 if any failed. It takes a few seconds,
most of them the two failovers, which wait for a lease to expire.

Without --endpoints it runs on an etcd embedded in this process, in a
temporary directory removed at exit. With --endpoints it uses that etcd,
under a random prefix etcdlock-demo/<id>/ that it deletes at the end. It
reads no ETCDCTL_ variable.

Exit statuses: 0 every check passed; 1 a check failed; 64 usage; 69 etcd
unreachable or refused us.
`

type demoOptions struct {
	conn    connFlags
	workers int
	rounds  int
}

func newDemoFlags() (*commandFlags, *demoOptions) {
	c := newCommandFlags("demo", "[flags]", demoAbout)
	o := &demoOptions{}
	c.IntVar(&o.workers, "workers", demoMinWorkers, "`number` of workers, each with its own client and session (4 to 16)")
	c.IntVar(&o.rounds, "rounds", 2, "`number` of times each worker takes the lock in phase 1, the read-write lock in phase 4 and a permit in phase 5 (1 to 100)")
	c.groups = append(c.groups, flagGroup{title: "Demo flags", names: []string{"workers", "rounds"}})
	o.conn.register(c, false)
	return c, o
}

func demoCommand(args []string, sio stdio) error {
	fs, o := newDemoFlags()
	rest, _, err := fs.parse(args)
	if fs.showHelp(err, sio) {
		return nil
	}
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usagef("demo", "unexpected argument %q", rest[0])
	}
	if o.workers < demoMinWorkers || o.workers > 16 {
		return usagef("demo", "--workers must be from %d to 16, got %d", demoMinWorkers, o.workers)
	}
	if o.rounds < 1 || o.rounds > 100 {
		return usagef("demo", "--rounds must be from 1 to 100, got %d", o.rounds)
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	conn := false
	for _, e := range connEnv {
		conn = conn || given[e.flag]
	}
	if conn && !given["endpoints"] {
		return usagef("demo", "connection flags need --endpoints; without it the demo runs on an embedded etcd")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	var dial func() (*clientv3.Client, error)
	var dialProxied func() (*clientv3.Client, *etcdtest.Proxy, error)
	var where string
	if given["endpoints"] {
		cfg, err := o.conn.config("demo")
		if err != nil {
			return err
		}
		where = "etcd at " + endpointList(cfg)
		dial = func() (*clientv3.Client, error) { return connect(ctx, cfg, demoPrefix) }
	} else {
		srv, err := etcdtest.New()
		if err != nil {
			return withStatus(exitUnavailable, err)
		}
		defer srv.Close()
		where = fmt.Sprintf("embedded etcd at %s, ready in %d ms", srv.Endpoints()[0], time.Since(start).Milliseconds())
		dial = func() (*clientv3.Client, error) {
			cli, err := srv.NewClient()
			if err != nil {
				return nil, withStatus(exitUnavailable, err)
			}
			return cli, nil
		}
		dialProxied = func() (*clientv3.Client, *etcdtest.Proxy, error) {
			cli, proxy, err := srv.NewProxiedClient()
			if err != nil {
				return nil, nil, withStatus(exitUnavailable, err)
			}
			return cli, proxy, nil
		}
	}

	d, err := newDemo(ctx, dial, dialProxied, o, sio.out, start)
	if err != nil {
		return err
	}
	fmt.Fprintf(sio.out, "etcdlock demo: %s\nlock %q: %d workers, each with its own client and session (TTL %v)\n",
		where, d.name, len(d.workers), demoTTL)
	failed := d.run(ctx)
	d.close()
	if failed > 0 {
		return withStatus(exitFailed, fmt.Errorf("demo: %d of %d checks failed", failed, len(d.checks)))
	}
	fmt.Fprintf(sio.out, "demo: all %d checks passed in %d ms\n", len(d.checks), time.Since(start).Milliseconds())
	return nil
}

// demo is one run of the demo.
type demo struct {
	out    io.Writer
	start  time.Time
	base   string // prefix of every key the demo writes
	name   string // the lock
	rounds int
	admin  *clientv3.Client // the operator: reads the keyspace, revokes a lease

	// dial connects a new client; dialProxied one through a proxy that can
	// cut it off, nil without the embedded etcd.
	dial        func() (*clientv3.Client, error)
	dialProxied func() (*clientv3.Client, *etcdtest.Proxy, error)

	workers []*worker

	// counter is incremented under the lock by a load, a sleep and a store:
	// only mutual exclusion keeps increments from being lost. It is atomic
	// so that the race detector, which cannot see the lock's ordering
	// through etcd, does not flag it.
	counter atomic.Int64

	mu     sync.Mutex // guards out and the fields below
	tokens []int64    // fencing tokens, in the order the lock was taken
	holds  []int      // HoldCount inside each nested section
	errs   []error    // unexpected errors
	checks []checkResult
}

type worker struct {
	id  string
	cli *clientv3.Client
	s   *etcdlock.Session
	m   *etcdlock.Mutex
}

type checkResult struct {
	ok  bool
	msg string
}

// newDemo connects the admin and the workers, each with a client of its own
// from dial, whose errors carry their exit status.
func newDemo(ctx context.Context, dial func() (*clientv3.Client, error), dialProxied func() (*clientv3.Client, *etcdtest.Proxy, error),
	o *demoOptions, out io.Writer, start time.Time) (*demo, error) {
	base := fmt.Sprintf("%s%08x", demoPrefix, rand.Uint32())
	d := &demo{out: out, start: start, base: base, name: base + "/lock", rounds: o.rounds, dial: dial, dialProxied: dialProxied}
	admin, err := dial()
	if err != nil {
		return nil, err
	}
	d.admin = admin
	for i := range o.workers {
		w := &worker{id: fmt.Sprintf("w%d", i+1)}
		if w.cli, err = dial(); err != nil {
			d.close()
			return nil, err
		}
		if err := d.newSession(ctx, w); err != nil {
			w.cli.Close()
			d.close()
			return nil, withStatus(exitUnavailable, err)
		}
		d.workers = append(d.workers, w)
	}
	return d, nil
}

// newSession gives w a new session, named by w's id, and its Mutex on the
// lock.
func (d *demo) newSession(ctx context.Context, w *worker) error {
	s, err := etcdlock.NewSession(w.cli, etcdlock.WithTTL(demoTTL), etcdlock.WithContext(ctx), etcdlock.WithIdentity(w.id))
	if err != nil {
		return fmt.Errorf("%s: new session: %w", w.id, err)
	}
	if w.s != nil {
		_ = w.s.Close() // its lease is gone already
	}
	w.s, w.m = s, etcdlock.NewMutex(s, d.name)
	return nil
}

// run runs the six phases and the final checks, prints the results and
// returns the number of failed checks.
func (d *demo) run(ctx context.Context) int {
	fmt.Fprintf(d.out, "\n%6s  %-6s %-64s %s\n", "ms", "who", "event", "token")
	for _, phase := range []func(context.Context){d.contend, d.nonBlocking, d.loss, d.readWrite, d.semaphore, d.failover} {
		if ctx.Err() == nil {
			phase(ctx)
		}
	}
	if err := ctx.Err(); err != nil {
		d.fail("demo", err)
	}

	d.mu.Lock()
	tokens := slices.Clone(d.tokens)
	d.mu.Unlock()
	d.check(len(tokens) > 1 && increasing(tokens), "fencing tokens of the lock strictly increase across all %d holds: %s", len(tokens), joinInts(tokens))
	keys, err := d.keys(ctx, d.base+"/")
	if err != nil {
		d.fail("admin", err)
	}
	d.check(err == nil && len(keys) == 0, "no key left under %q at the end (%d found)", d.base+"/", len(keys))
	d.mu.Lock()
	nerrs := len(d.errs)
	d.mu.Unlock()
	d.check(nerrs == 0, "no unexpected errors (%d)", nerrs)

	fmt.Fprintln(d.out)
	failed := 0
	for _, c := range d.checks {
		word := "PASS"
		if !c.ok {
			word = "FAIL"
			failed++
		}
		fmt.Fprintf(d.out, "%s  %s\n", word, c.msg)
	}
	return failed
}

// contend is phase 1: every worker takes the lock d.rounds times.
func (d *demo) contend(ctx context.Context) {
	d.phase("1. contention: %d workers × %d rounds; inside, a nested lock and a read-sleep-write of a counter", len(d.workers), d.rounds)
	var wg sync.WaitGroup
	for _, w := range d.workers {
		wg.Go(func() {
			for range d.rounds {
				if err := d.critical(ctx, w); err != nil {
					d.fail(w.id, err)
					return
				}
			}
		})
	}
	wg.Wait()

	want := int64(len(d.workers) * d.rounds)
	got := d.counter.Load()
	d.check(got == want, "mutual exclusion: counter is %d, want %d (%d workers × %d read-sleep-write rounds)", got, want, len(d.workers), d.rounds)
	d.mu.Lock()
	holds := slices.Clone(d.holds)
	d.mu.Unlock()
	all2 := int64(len(holds)) == want
	for _, h := range holds {
		all2 = all2 && h == 2
	}
	d.check(all2, "reentrancy: HoldCount was 2 in all %d nested sections (%d seen)", want, len(holds))
}

// critical takes the lock, then again through another handle (the same lock:
// same Session and name), and increments the counter.
func (d *demo) critical(ctx context.Context, w *worker) error {
	if err := w.m.LockContext(ctx); err != nil {
		return err
	}
	d.taken(w, "locked")
	inner := etcdlock.NewMutex(w.s, d.name)
	if err := inner.LockContext(ctx); err != nil {
		return errors.Join(err, w.m.UnlockContext(ctx))
	}
	holds := inner.HoldCount()
	n := d.counter.Load()
	time.Sleep(demoSleep)
	d.counter.Store(n + 1)
	d.mu.Lock()
	d.holds = append(d.holds, holds)
	d.mu.Unlock()
	d.event(w.id, 0, "nested lock: HoldCount %d; counter %d -> %d; nested unlock", holds, n, n+1)
	err := inner.UnlockContext(ctx)
	d.event(w.id, 0, "unlock")
	return errors.Join(err, w.m.UnlockContext(ctx))
}

// nonBlocking is phase 2: while the first worker holds the lock, the next
// three try, try with a bound, and wait until cancelled.
func (d *demo) nonBlocking(ctx context.Context) {
	h, b, t, c := d.workers[0], d.workers[1], d.workers[2], d.workers[3]
	d.phase("2. %s holds the lock; %s tries, %s tries for %v, %s waits and is cancelled", h.id, b.id, t.id, demoTryWait, c.id)
	if err := h.m.LockContext(ctx); err != nil {
		d.fail(h.id, err)
		return
	}
	d.taken(h, "locked; holds it through this phase")
	holderKey := h.m.Key()

	inGoroutine(func() {
		t0 := time.Now()
		ok := b.m.TryLock()
		ms := time.Since(t0).Milliseconds()
		if ok {
			b.m.Unlock()
		}
		d.event(b.id, 0, "TryLock() = %v in %d ms: busy, skip the work (non-blocking path)", ok, ms)
		keys, err := d.lockKeys(ctx)
		d.check(!ok && err == nil && len(keys) == 1, "TryLock while held: false in %d ms, no key written (%d key under the lock, the holder's)", ms, len(keys))
	})

	inGoroutine(func() {
		t0 := time.Now()
		ok, err := t.m.TryLockFor(ctx, demoTryWait)
		waited := time.Since(t0)
		if ok {
			d.unlock(t, ctx)
		}
		d.event(t.id, 0, "TryLockFor(%v) = (%v, %v) after %d ms: timed out", demoTryWait, ok, err, waited.Milliseconds())
		d.check(!ok && err == nil && waited >= demoTryWait, "TryLockFor(%v) while held: (false, nil) after %d ms", demoTryWait, waited.Milliseconds())
	})

	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		err := c.m.LockContext(cctx)
		if err == nil {
			d.unlock(c, ctx)
		}
		errc <- err
	})
	queued := d.waitQueue(ctx, d.name, 2)
	d.event(c.id, 0, "LockContext: waiting, its key queued behind %s's", h.id)
	cancel()
	wg.Wait()
	err := <-errc
	keys, kerr := d.lockKeys(ctx)
	d.event(c.id, 0, "LockContext cancelled: %v; keys under the lock now: %d", err, len(keys))
	d.check(queued && errors.Is(err, context.Canceled) && kerr == nil && len(keys) == 1 && keys[0] == holderKey,
		"cancelled LockContext: returned %v and left no key (right after: %d key, the holder's)", err, len(keys))

	d.unlock(h, ctx)
}

// loss is phase 3: the holder's lease is revoked under it.
func (d *demo) loss(ctx context.Context) {
	v, next := d.workers[1], d.workers[2]
	d.phase("3. %s holds the lock; an operator revokes its lease (as if it had expired)", v.id)
	if err := v.m.LockContext(ctx); err != nil {
		d.fail(v.id, err)
		return
	}
	d.taken(v, "locked")
	done := v.m.Done()
	t0 := time.Now()
	if _, err := d.admin.Revoke(ctx, v.s.Lease()); err != nil {
		d.fail("admin", err)
	}
	d.event("admin", 0, "revoked %s's lease %x", v.id, int64(v.s.Lease()))
	detected := false
	select {
	case <-done:
		detected = true
	case <-time.After(demoLossWait):
	}
	ms := time.Since(t0).Milliseconds()
	d.event(v.id, 0, "Done() closed=%v after %d ms: lock lost, stop working", detected, ms)
	rejected := false
	resp, err := v.cli.Txn(ctx).If(v.m.IsOwner()).Then(clientv3.OpPut(d.base+"/fenced", v.id)).Commit()
	if err != nil {
		d.fail(v.id, err)
	} else {
		rejected = !resp.Succeeded
	}
	d.event(v.id, 0, "write guarded by IsOwner(): rejected=%v", rejected)
	uerr := v.m.UnlockContext(ctx)
	d.event(v.id, 0, "UnlockContext: %v", uerr)
	d.check(detected && rejected && uerr != nil, "lock loss: Done() closed %d ms after the revoke, the fenced write was rejected, UnlockContext reported it", ms)

	if err := next.m.LockContext(ctx); err != nil {
		d.fail(next.id, err)
		return
	}
	d.taken(next, "locked")
	d.unlock(next, ctx)

	// The lost lease ended v's session: it starts another, as a process
	// that lost its lock would.
	if err := d.newSession(ctx, v); err != nil {
		d.fail(v.id, err)
		return
	}
	d.event(v.id, 0, "new session: lease %x", int64(v.s.Lease()))
}

// taken records and prints a new hold of w, with its fencing token. It is
// called under the lock, so the tokens are recorded in the lock's order.
func (d *demo) taken(w *worker, what string) {
	token := w.m.Token()
	d.mu.Lock()
	d.tokens = append(d.tokens, token)
	d.mu.Unlock()
	d.event(w.id, token, "%s", what)
}

// unlock releases w's lock; the event comes first, so that the timeline
// never shows the next holder before it.
func (d *demo) unlock(w *worker, ctx context.Context) {
	d.event(w.id, 0, "unlock")
	if err := w.m.UnlockContext(ctx); err != nil {
		d.fail(w.id, err)
	}
}

// lockKeys returns the keys under the lock's prefix.
func (d *demo) lockKeys(ctx context.Context) ([]string, error) {
	return d.keys(ctx, d.name+"/")
}

// keys returns the keys under prefix.
func (d *demo) keys(ctx context.Context, prefix string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), demoOpTimeout)
	defer cancel()
	resp, err := d.admin.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, err
	}
	keys := make([]string, len(resp.Kvs))
	for i, kv := range resp.Kvs {
		keys[i] = string(kv.Key)
	}
	return keys, nil
}

// waitQueue waits until the queue of name has n entries, and reports
// whether it did.
func (d *demo) waitQueue(ctx context.Context, name string, n int) bool {
	deadline := time.Now().Add(demoQueueWait)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		qctx, cancel := context.WithTimeout(ctx, demoOpTimeout)
		entries, err := etcdlock.Inspect(qctx, d.admin, name)
		cancel()
		if err == nil && len(entries) >= n {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return false
}

// queueIdentities returns the identities of the holders and of the waiters in
// entries, each list joined with spaces, or "none".
func queueIdentities(entries []etcdlock.QueueEntry) (holders, waiters string) {
	var h, w []string
	for _, e := range entries {
		if e.Holds {
			h = append(h, e.Identity)
		} else {
			w = append(w, e.Identity)
		}
	}
	return orNone(h), orNone(w)
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, " ")
}

func (d *demo) phase(format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	fmt.Fprintf(d.out, "%6s  %s\n", "", fmt.Sprintf(format, args...))
}

// event prints one line of the timeline; token 0 prints no token.
func (d *demo) event(who string, token int64, format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	tok := ""
	if token != 0 {
		tok = strconv.FormatInt(token, 10)
	}
	line := fmt.Sprintf("%6d  %-6s %-64s %s", time.Since(d.start).Milliseconds(), who, fmt.Sprintf(format, args...), tok)
	fmt.Fprintln(d.out, strings.TrimRight(line, " "))
}

func (d *demo) fail(who string, err error) {
	d.mu.Lock()
	d.errs = append(d.errs, err)
	d.mu.Unlock()
	d.event(who, 0, "error: %v", err)
}

func (d *demo) check(ok bool, format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.checks = append(d.checks, checkResult{ok: ok, msg: fmt.Sprintf(format, args...)})
}

// close ends the sessions, which revokes their leases, deletes what the demo
// wrote, and closes every client.
func (d *demo) close() {
	for _, w := range d.workers {
		if err := w.s.Close(); err != nil {
			d.fail(w.id, err)
		}
		w.cli.Close()
	}
	if d.admin != nil {
		ctx, cancel := context.WithTimeout(context.Background(), demoOpTimeout)
		defer cancel()
		if _, err := d.admin.Delete(ctx, d.base+"/", clientv3.WithPrefix()); err != nil {
			d.fail("admin", err)
		}
		d.admin.Close()
	}
}

// inGoroutine runs f in a goroutine of its own, as another process would,
// and waits for it.
func inGoroutine(f func()) {
	var wg sync.WaitGroup
	wg.Go(f)
	wg.Wait()
}

func increasing(s []int64) bool {
	for i := 1; i < len(s); i++ {
		if s[i] <= s[i-1] {
			return false
		}
	}
	return true
}

func joinInts(s []int64) string {
	parts := make([]string, len(s))
	for i, v := range s {
		parts[i] = strconv.FormatInt(v, 10)
	}
	return strings.Join(parts, " ")
}
