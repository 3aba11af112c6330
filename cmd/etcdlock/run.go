package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
)

const (
	defaultTTL = 10 * time.Second
	// maxKillGrace caps the default --kill-grace, a sixth of the TTL.
	maxKillGrace = 10 * time.Second
	// tryTimeout bounds --wait 0, which has no wait of its own to bound it.
	tryTimeout = 5 * time.Second
)

const runAbout = `Runs COMMAND while holding the lock NAME, like flock(1) across machines, and
stops COMMAND before the lock can pass to anyone else. With --lock NAME,
given several times instead of NAME, it holds every one of those locks at
once (a MultiMutex: one etcd transaction enters every queue, so runs that
name the same locks in any order cannot deadlock); ETCDLOCK_KEY is then the
first name's key (in sorted order), and the token is every key's.

By default the hold is exclusive: one run at a time, and it also excludes
etcdctl lock and etcd's concurrency.Mutex on NAME. --shared runs hold
together, as flock -s, but never beside an exclusive run. --limit N lets at
most N runs with --limit N hold at once, as consul lock -n N.

Waits for the lock (see --wait), then starts COMMAND in a process group of
its own (the terminal's foreground group while it runs, if stdin is a
terminal and etcdlock is its foreground job, so that COMMAND may read it),
with ETCDLOCK_KEY and ETCD_LOCK_KEY set to the lock's etcd key and
ETCDLOCK_TOKEN and ETCD_LOCK_REV to its fencing token (the key's create
revision), and ETCDLOCK_FENCE to the fence, which names the lock, the key
and the token in one word, such as etcdlock:1042:NAME:694d8f3a2b1c: pass it
with each write to what the lock guards (the etcdlock package's
ParseFence reads it; etcdlock check FENCE asks etcd whether it still
holds). ETCDLOCK_TOKEN stays a number, as ETCD_LOCK_REV, for scripts that
compare tokens. Exits with COMMAND's status (128+N if signal N killed it), and
releases the lock once COMMAND has exited.

Its key in etcd holds an identity, which etcdlock holders shows: by default
host=<hostname> pid=<pid>; --identity-cmd adds cmd=<COMMAND ARGS>
(shell-quoted, cut to 200 bytes); --identity sets another. It is stored in
clear in etcd, readable by anyone who can read the lock: with
--identity-cmd, keep secrets out of the command line. While it waits for more than 3s, etcdlock says on stderr who
holds the lock (its identity, and for how long at least), and again each time
the holder changes.

If the lock is lost, or about to be (its key deleted, its lease revoked or
expired, or etcd silent for 2/3 of --ttl), COMMAND's process group gets
SIGTERM, then SIGKILL after --kill-grace, and etcdlock exits 74. With the
default --kill-grace (a sixth of the TTL, at most 10s), cut off from etcd,
COMMAND's group is killed at 5/6 of the TTL after the last keep-alive etcd
acknowledged: before the lease can expire. A --kill-grace that would
send SIGKILL after that is warned about.
SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 are passed on to
COMMAND's process group while it runs; while waiting, they make etcdlock
give up, leave no key behind, and exit 128+N.

With --once-per SLOT, COMMAND runs at most once for SLOT across every run
of NAME: a run that finds the slot recorded done, before the lock or once it
holds it, exits 76 without running COMMAND; when COMMAND exits 0 with the
lock held throughout, the slot is recorded done in etcd for --retention. No
clock is read: name the slot from the schedule (date -u +%F for a nightly
run).

For scripts written for flock(1): --wait 0 is flock's -n, --wait 30s its
-w 30, --conflict-exit-code its -E, --quiet (-q) its -q. A busy lock's
message names its holder, unless --quiet.

Exit statuses: COMMAND's own; 64 usage; 69 etcd unreachable or refused us;
74 lock lost (also at --max-hold, or given up by --watchdog); 75 lock busy (--wait ran out; see
--conflict-exit-code); 76 slot done (--once-per: a run recorded the slot done, COMMAND did not run); 126
COMMAND could not be started; 127 COMMAND not found; 128+N signal N while
waiting.
`

// waitFlag is --wait: how long to wait for the lock, forever if not set.
type waitFlag struct {
	d   time.Duration
	set bool
}

func (w *waitFlag) String() string {
	if w == nil || !w.set {
		return "forever"
	}
	return w.d.String()
}

func (w *waitFlag) Set(s string) error {
	if s == "forever" {
		*w = waitFlag{}
		return nil
	}
	d, err := parseDuration(s, "0, 30s or 5m, nor forever")
	if err != nil {
		return err
	}
	if d < 0 {
		return errors.New("must not be negative")
	}
	*w = waitFlag{d: d, set: true}
	return nil
}

// graceFlag is --kill-grace: the time between SIGTERM and SIGKILL, or, if
// not set, defaultGrace of the TTL.
type graceFlag struct {
	d   time.Duration
	set bool
}

func (g *graceFlag) String() string {
	if g == nil || !g.set {
		return "TTL/6, at most 10s"
	}
	return g.d.String()
}

func (g *graceFlag) Set(s string) error {
	d, err := parseDuration(s, "0, 2s or 500ms")
	if err != nil {
		return err
	}
	if d < 0 {
		return errors.New("must not be negative")
	}
	*g = graceFlag{d: d, set: true}
	return nil
}

// value returns the grace for a session of the given TTL.
func (g *graceFlag) value(ttl time.Duration) time.Duration {
	if g.set {
		return g.d
	}
	return defaultGrace(ttl)
}

// defaultGrace is the --kill-grace that keeps run's promise with a TTL:
// the lock's Done closes after a silence of 2/3 of the TTL, so SIGKILL at
// 2/3 + 1/6 leaves a sixth of the TTL before etcd can expire the lease.
func defaultGrace(ttl time.Duration) time.Duration {
	return min(maxKillGrace, (ttl / 6).Truncate(time.Millisecond))
}

// silentAt is how long after the last acknowledged keep-alive the lock's
// Done closes when etcd goes silent: the library's two thirds of the TTL.
func silentAt(ttl time.Duration) time.Duration { return ttl - ttl/3 }

// lateKill returns by how much SIGKILL, grace after the SIGTERM of a
// silence, comes after the earliest expiry of a lease of ttl counted from
// the same acknowledgement; zero or less if it comes before.
func lateKill(ttl, grace time.Duration) time.Duration {
	return silentAt(ttl) + grace - ttl
}

// roundTTL rounds ttl up to whole seconds, as the lease is granted.
func roundTTL(ttl time.Duration) time.Duration {
	return (ttl + time.Second - 1).Truncate(time.Second)
}

type runOptions struct {
	conn     connFlags
	obs      observeFlags
	ttl      time.Duration
	wait     waitFlag
	grace    graceFlag
	identity identityFlag
	withCmd  bool // --identity-cmd
	conflict int  // --conflict-exit-code
	quiet    bool // --quiet, -q
	shared   bool // --shared
	limit    int  // --limit; 0 if not given
	locks    locksFlag
	maxHold  time.Duration // --max-hold; 0: none
	delay    time.Duration // --lock-delay; 0: none
	watchdog time.Duration // --watchdog; 0: none
	once     onceFlags     // --once-per, --retention
}

// locksFlag is --lock, given once per lock.
type locksFlag []string

func (l *locksFlag) String() string { return strings.Join(*l, ",") }

func (l *locksFlag) Set(s string) error {
	if s == "" {
		return errors.New("must not be empty")
	}
	*l = append(*l, s)
	return nil
}

func (o *runOptions) mode() lockMode {
	switch {
	case o.shared:
		return shared
	case o.limit > 0:
		return counted
	}
	return exclusive
}

func newRunFlags() (*commandFlags, *runOptions) {
	c := newCommandFlags("run", "[flags] NAME -- COMMAND [ARGS...]\n       etcdlock run [flags] --lock NAME --lock NAME... -- COMMAND [ARGS...]", runAbout)
	o := &runOptions{}
	c.durationVar(&o.ttl, "ttl", defaultTTL, "10s or 1m", "lease `TTL` of the session, rounded up to whole seconds: how long the lock outlives a crash of etcdlock")
	c.Var(&o.wait, "wait", "how long to wait for the lock: a `duration`; 0 tries once, as flock's -n")
	c.Var(&o.grace, "kill-grace", "`time` between SIGTERM and SIGKILL when the lock is lost; 0 sends SIGKILL at once; a time that lets COMMAND outlive the lease gets a warning")
	c.Var(&o.identity, "identity", "a `string` naming this run, stored in clear as the value of its lock key and shown by etcdlock holders: no secrets")
	c.BoolVar(&o.withCmd, "identity-cmd", false, "add cmd=<COMMAND ARGS> to the default identity: stored in clear in etcd, so only for command lines without secrets")
	c.BoolVar(&o.shared, "shared", false, "a shared hold, as flock's -s: many --shared runs at once, none beside a run without it")
	c.IntVar(&o.limit, "limit", 0, "at most `N` runs with --limit N at once, as consul lock's -n; every run on NAME must give the same N, unless etcdlock limit recorded one")
	c.Var(&o.locks, "lock", "a lock `NAME` to hold, instead of NAME; given several times, the run holds all those locks at once (not with --shared or --limit)")
	c.durationVar(&o.maxHold, "max-hold", 0, "1h or 90m", "stop COMMAND as a lost lock (exit 74) once the lock was held this `long`, and delete its key; 0: no cap. Safe only where the resource checks ETCDLOCK_TOKEN")
	c.durationVar(&o.delay, "lock-delay", 0, "5s or 30s", "once the lock is ours, wait this `long` before COMMAND starts if the holder before us may have crashed (its lease expired or was revoked); a holder that unlocked and then ended its lease at once, as a finished run does, counts as one; 0: no delay")
	c.durationVar(&o.watchdog, "watchdog", 0, "30s or 5m", "give up the lock as if lost (exit 74) when COMMAND has not touched the file $ETCDLOCK_PROGRESS for this `long`; 0: no watchdog")
	c.IntVar(&o.conflict, "conflict-exit-code", exitBusy, "exit `status` (0-255) when the lock is busy: held for the whole --wait, as flock's -E")
	c.BoolVar(&o.quiet, "quiet", false, "say nothing when the lock is busy, nor while waiting, as flock's -q; also -q")
	c.BoolVar(&o.quiet, "q", false, "the same as --quiet")
	o.once.register(c)
	c.groups = append(c.groups, flagGroup{title: "Lock flags", names: []string{"ttl", "wait", "lock", "shared", "limit", "max-hold", "lock-delay", "watchdog", "kill-grace", "identity", "identity-cmd", "conflict-exit-code", "quiet", "once-per", "retention"}})
	o.obs.register(c)
	o.conn.register(c, true)
	return c, o
}

func runCommand(args []string, sio stdio) error {
	fs, o := newRunFlags()
	names, command, err := parseLocks(fs, o, args)
	if fs.showHelp(err, sio) {
		return nil
	}
	if err != nil {
		return err
	}
	if len(command) == 0 || command[0] == "" {
		return usagef("run", "missing COMMAND: etcdlock run [flags] NAME -- COMMAND [ARGS...]")
	}
	if len(names) > 1 && (o.shared || o.limit != 0) {
		return usagef("run", "several --lock are held exclusively: not with --shared or --limit")
	}
	if o.ttl <= 0 {
		return usagef("run", "--ttl must be positive, got %v", o.ttl)
	}
	if o.maxHold < 0 || o.delay < 0 || o.watchdog < 0 {
		return usagef("run", "--max-hold, --lock-delay and --watchdog must not be negative, got %v, %v and %v", o.maxHold, o.delay, o.watchdog)
	}
	limitSet := false
	fs.Visit(func(f *flag.Flag) { limitSet = limitSet || f.Name == "limit" })
	switch {
	case limitSet && o.limit < 1:
		return usagef("run", "--limit must be at least 1, got %d", o.limit)
	case limitSet && o.shared:
		return usagef("run", "--shared and --limit are two kinds of lock: give one")
	}
	if err := o.once.check(names, o.mode()); err != nil {
		return err
	}
	if o.withCmd && o.identity.set {
		return usagef("run", "--identity-cmd adds the command to the default identity: not with --identity")
	}
	if o.conflict < 0 || o.conflict > 255 {
		return usagef("run", "--conflict-exit-code must be from 0 to 255, got %d", o.conflict)
	}
	if ttl := roundTTL(o.ttl); o.grace.set {
		if late := lateKill(ttl, o.grace.d); late >= 0 {
			fmt.Fprintf(sio.err, "etcdlock: warning: --kill-grace %v with --ttl %v: cut off from etcd, COMMAND gets SIGKILL %v after the lease can expire (SIGTERM %v after the last acknowledged keep-alive, SIGKILL at %v, expiry at %v); a --kill-grace below %v stops it in time\n",
				o.grace.d, ttl, late.Round(time.Millisecond), silentAt(ttl).Round(time.Millisecond), (silentAt(ttl) + o.grace.d).Round(time.Millisecond), ttl, (ttl - silentAt(ttl)).Truncate(time.Millisecond))
		}
	}
	if err := o.conn.fromEnv(fs, sio.getenv); err != nil {
		return err
	}
	cfg, err := o.conn.config("run")
	if err != nil {
		return err
	}
	obs, err := o.obs.start(sio)
	if err != nil {
		return err
	}
	defer obs.stop()

	sigs := make(chan os.Signal, 8)
	// A signal ignored at start (nohup, a script's background job) stays
	// ignored: catching it would let it stop a wait or COMMAND.
	var caught []os.Signal
	for _, sig := range forwardedSignals {
		if !signal.Ignored(sig) {
			caught = append(caught, sig)
		}
	}
	if len(caught) > 0 {
		signal.Notify(sigs, caught...)
		defer signal.Stop(sigs)
	}
	r := &runner{name: strings.Join(names, ","), names: names, command: command, opts: o, cfg: cfg, sio: sio, sigs: sigs, obs: obs, losses: make(chan etcdlock.LossReason, 2)}
	return r.run()
}

// parseLocks parses run's arguments: flags, then NAME and flags again,
// unless --lock gave the names (COMMAND then comes after --). It returns the
// names, sorted and distinct, and COMMAND with its arguments.
func parseLocks(fs *commandFlags, o *runOptions, args []string) ([]string, []string, error) {
	rest, dashdash, err := fs.parse(args)
	if err != nil || len(o.locks) == 0 {
		name, command, err := fs.parseName(args)
		if err == nil && len(o.locks) > 0 {
			return nil, nil, usagef("run", "NAME %q and --lock: give the names one way", name)
		}
		return []string{name}, command, err
	}
	if !dashdash && len(rest) > 0 {
		return nil, nil, usagef("run", "with --lock, COMMAND comes after --: etcdlock run --lock NAME... -- COMMAND [ARGS...]")
	}
	return slices.Compact(slices.Sorted(slices.Values(o.locks))), rest, nil
}

// runner is one etcdlock run. Its lock is taken and released by the
// goroutine that calls run, as a Mutex requires.
type runner struct {
	name    string   // names, joined by commas: for messages
	names   []string // NAME, or the names of --lock
	command []string
	opts    *runOptions
	cfg     clientv3.Config
	sio     stdio
	sigs    chan os.Signal
	obs     *observing

	cli   *clientv3.Client
	s     *etcdlock.Session
	l     *runLock
	grace time.Duration // --kill-grace, or its default for the lease's TTL
	// losses gets the reason of each hold lost, from the Session's
	// observer, which learns it at most a read after Done closes.
	losses chan etcdlock.LossReason
}

func (r *runner) run() error {
	sig, err := r.acquire()
	defer r.close()
	switch {
	case sig != nil:
		r.unlock()
		return withStatus(128+signalNumber(sig), fmt.Errorf("%v (signal %d) while waiting for the lock %q: withdrew", sig, signalNumber(sig), r.name))
	case err != nil:
		return err
	}
	// A signal between the lock and the start of COMMAND: do not start it.
	select {
	case sig := <-r.sigs:
		r.unlock()
		return withStatus(128+signalNumber(sig), fmt.Errorf("%v (signal %d) before %s started: released the lock %q", sig, signalNumber(sig), r.command[0], r.name))
	default:
	}
	return r.runHeld()
}

// acquire connects to etcd and takes the lock. If one of the signals arrives
// first, it gives up and returns the signal; run then releases what was
// taken, so that no key of its own is left.
func (r *runner) acquire() (sig os.Signal, err error) {
	ctx, cancel := context.WithCancel(context.Background())
	caught := make(chan os.Signal, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case s := <-r.sigs:
			caught <- s
			cancel()
		case <-ctx.Done():
		}
	})
	err = r.lock(ctx)
	cancel()
	wg.Wait()
	select {
	case sig = <-caught:
	default:
	}
	return sig, err
}

// lock takes the lock as --wait says, step by step. ctx ends only on a
// signal, which acquire reports; run then looks only at what is held, not
// at the error (nil if ctx ended the wait, ctx.Err() if it ended the
// connect). On any other failure, lock releases what it took.
func (r *runner) lock(ctx context.Context) error {
	cli, err := connect(ctx, r.cfg, r.names[0]+"/")
	if err != nil {
		return err
	}
	r.cli = cli
	opts := []etcdlock.SessionOption{
		etcdlock.WithTTL(r.opts.ttl),
		etcdlock.WithIdentity(r.opts.identity.value(r.command, r.opts.withCmd)),
		etcdlock.WithObserver(etcdlock.ObserverFunc(r.noteLoss)),
	}
	if r.opts.maxHold > 0 {
		opts = append(opts, etcdlock.WithMaxHold(r.opts.maxHold))
	}
	if r.opts.delay > 0 {
		opts = append(opts, etcdlock.WithLockDelay(r.opts.delay))
	}
	s, err := etcdlock.NewSession(cli, append(opts, r.obs.opts...)...)
	if err != nil {
		return unavailable(r.cfg, err)
	}
	r.s = s
	r.l = newRunLock(s, r.names, r.opts.mode(), r.opts.limit)
	r.grace = r.opts.grace.value(s.TTL())
	if err := r.slotDone(ctx); err != nil {
		return err
	}

	var deadline time.Time
	if r.opts.wait.set {
		deadline = time.Now().Add(r.opts.wait.d)
	}
	for _, st := range r.l.steps() {
		held, err := r.take(ctx, st, deadline)
		switch {
		case ctx.Err() != nil:
			return nil
		case err == nil && held:
			continue
		case errors.Is(err, etcdlock.ErrSessionExpired):
			err = withStatus(exitUnavailable, fmt.Errorf("lease lost while waiting for the lock %q (etcd unreachable for the whole --ttl %v, or the lease was revoked)", r.name, r.s.TTL()))
		case errors.Is(err, etcdlock.ErrLimitMismatch):
			err = withStatus(exitUsage, fmt.Errorf("--limit %d: %w", r.opts.limit, err))
		case err != nil:
			err = unavailable(r.cfg, err)
		default:
			err = r.busy(st)
		}
		r.unlock()
		return err
	}
	// A run may have recorded the slot while we waited.
	if err := r.slotDone(ctx); err != nil {
		r.unlock()
		return err
	}
	return nil
}

// take runs one step as --wait says: wait as long as it takes, try once,
// or wait until deadline.
func (r *runner) take(ctx context.Context, st step, deadline time.Time) (bool, error) {
	wait := r.opts.wait
	switch {
	case !wait.set:
		defer r.reportHolders(st)()
		err := st.lock(ctx)
		return err == nil, err
	case wait.d == 0:
		tctx, cancel := context.WithTimeout(ctx, tryTimeout)
		defer cancel()
		return st.try(tctx, 0)
	}
	defer r.reportHolders(st)()
	return st.try(ctx, max(0, time.Until(deadline)))
}

// busy is the error of a lock held for the whole --wait: silent with
// --quiet, else naming the holder that st waits for, if it can be read.
func (r *runner) busy(st step) error {
	if r.opts.quiet {
		return withStatus(r.opts.conflict, nil)
	}
	who := "someone else"
	for _, name := range st.names {
		ctx, cancel := context.WithTimeout(context.Background(), holderReadTimeout)
		entries, err := etcdlock.Inspect(ctx, r.cli, name)
		cancel()
		if h, ok := st.blocker(entries, r.s.Lease()); err == nil && ok {
			who = describeHolder(h)
			break
		}
	}
	held := "holds it"
	if r.opts.wait.d > 0 {
		held = fmt.Sprintf("still held it after --wait %v", r.opts.wait.d)
	}
	var msg string
	switch r.opts.mode() {
	case counted:
		msg = fmt.Sprintf("lock %q is busy: all its %d permits are taken; the oldest holder, %s, %s", r.name, r.opts.limit, who, held)
	case shared:
		msg = fmt.Sprintf("lock %q is busy for a shared hold: %s %s", r.name, who, held)
	default:
		msg = fmt.Sprintf("lock %q is busy: %s %s", r.name, who, held)
	}
	return withStatus(r.opts.conflict, errors.New(msg))
}

// reportHolders says who holds what st waits for while run waits, unless
// --quiet.
func (r *runner) reportHolders(st step) (stop func()) {
	if r.opts.quiet {
		return func() {}
	}
	stops := make([]func(), len(st.names))
	for i, name := range st.names {
		stops[i] = reportHolders(r.s, name, st.blocker, r.sio.err)
	}
	return func() {
		for _, stop := range stops {
			stop()
		}
	}
}

// runHeld runs COMMAND under the held lock, stops it if the lock is lost,
// then releases the lock.
func (r *runner) runHeld() error {
	key, token := r.l.key(), r.l.token()
	// An exclusive run holds two locks (or more, with --lock): the loss of
	// any is the loss.
	dones := r.l.done()
	lost, stopLost := anyClosed(dones)
	defer stopLost()
	cmd := exec.Command(r.command[0], r.command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = r.sio.in, r.sio.out, r.sio.err
	cmd.Env = append(os.Environ(),
		"ETCDLOCK_KEY="+key,
		fmt.Sprintf("ETCDLOCK_TOKEN=%d", token),
		"ETCD_LOCK_KEY="+key,
		fmt.Sprintf("ETCD_LOCK_REV=%d", token),
		"ETCDLOCK_FENCE="+r.l.fence().String(),
	)
	var stalled <-chan struct{} // closed when --watchdog found no progress
	if r.opts.watchdog > 0 {
		pw, err := watchProgress(r.opts.watchdog)
		if err != nil {
			r.unlock()
			return withStatus(exitCannotRun, err)
		}
		defer pw.close()
		stalled = pw.stalled
		cmd.Env = append(cmd.Env, "ETCDLOCK_PROGRESS="+pw.path)
	}
	cmd.SysProcAttr = childAttr()
	// An interactive COMMAND reads the terminal as its foreground job; it
	// has the terminal's signals (Ctrl-C) to itself until it exits.
	tty, fg := foregroundTTY(r.sio.in)
	if fg {
		inForeground(cmd.SysProcAttr, tty)
	}
	if err := cmd.Start(); err != nil {
		if fg {
			// The child may have taken the terminal before its exec failed.
			r.warn(takeForeground(tty))
		}
		r.unlock()
		code := exitCannotRun
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			code = exitNotFound
		}
		return withStatus(code, err)
	}
	pid := cmd.Process.Pid
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		_ = cmd.Wait() // the status is in cmd.ProcessState
	}()

	var (
		lostAt time.Time
		gaveUp bool // --watchdog: no progress
		kill   <-chan time.Time
	)
wait:
	for {
		select {
		case <-exited:
			if fg {
				r.warn(takeForeground(tty))
			}
			break wait
		case sig := <-r.sigs:
			r.warn(signalGroup(pid, sig))
		case <-lost:
			lost, lostAt = nil, time.Now()
			kill = r.stop(pid, fmt.Sprintf("lost the lock %q (%s)", r.name, r.lossReason(0)))
		case <-stalled:
			select {
			case <-exited:
				// It exited as the period ran out: in time, not stalled.
				if fg {
					r.warn(takeForeground(tty))
				}
				break wait
			default:
			}
			stalled, lost, lostAt, gaveUp = nil, nil, time.Now(), true
			kill = r.stop(pid, fmt.Sprintf("giving up the lock %q: %s did not touch $ETCDLOCK_PROGRESS for --watchdog %v", r.name, r.command[0], r.opts.watchdog))
		case <-kill:
			kill = nil
			r.warn(signalGroup(pid, syscall.SIGKILL))
		}
	}
	if lostAt.IsZero() {
		// Lost as COMMAND exited: its work may not have been exclusive.
		for _, ch := range dones {
			select {
			case <-ch:
				lostAt = time.Now()
			default:
			}
		}
	} else {
		r.stopGroup(pid, lostAt.Add(r.grace))
	}

	status := exitStatus(cmd.ProcessState)
	var recordErr error
	// recorded: --once-per's record, guarded by the hold, was put after
	// COMMAND exited, so the hold lasted until then.
	recorded := false
	if status == 0 && lostAt.IsZero() && !gaveUp && r.opts.once.slot != "" {
		recordErr = r.recordSlot()
		recorded = recordErr == nil
	}
	unlockErr := r.l.release(context.Background())
	switch {
	case gaveUp:
		return withStatus(exitLost, fmt.Errorf("gave up the lock %q: %s reported no progress for --watchdog %v (it exited with status %d)", r.name, r.command[0], r.opts.watchdog, status))
	case !lostAt.IsZero():
		return withStatus(exitLost, fmt.Errorf("lost the lock %q while %s ran (it exited with status %d): %s", r.name, r.command[0], status, r.lossReason(time.Second)))
	case recordErr != nil:
		return recordErr
	case recorded:
	case errors.Is(unlockErr, etcdlock.ErrLockLost), errors.Is(unlockErr, etcdlock.ErrSessionExpired):
		return withStatus(exitLost, fmt.Errorf("lock %q was gone when %s exited (with status %d): %v", r.name, r.command[0], status, unlockErr))
	case unlockErr != nil:
		r.warn(fmt.Errorf("%w; the key expires with the lease within %v", unlockErr, r.s.TTL()))
	}
	if status == 0 {
		return nil
	}
	return withStatus(status, nil)
}

// anyClosed returns a channel that is closed once any of chs is, and the
// function that stops its goroutines.
func anyClosed(chs []<-chan struct{}) (<-chan struct{}, func()) {
	if len(chs) == 1 {
		return chs[0], func() {}
	}
	out, stop := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for _, ch := range chs {
		wg.Go(func() {
			select {
			case <-ch:
				once.Do(func() { close(out) })
			case <-stop:
			}
		})
	}
	return out, func() {
		close(stop)
		wg.Wait()
	}
}

// stop starts stopping COMMAND's process group after the lock was lost (or
// given up by --watchdog), says so with why, and returns when to kill it,
// or nil if it was killed at once. why gives the reason of a loss if it has
// come already: the signal does not wait.
func (r *runner) stop(pid int, why string) <-chan time.Time {
	if r.grace == 0 {
		r.warn(signalGroup(pid, syscall.SIGKILL))
		fmt.Fprintf(r.sio.err, "etcdlock: %s: killed %s\n", why, r.command[0])
		return nil
	}
	r.warn(signalGroup(pid, syscall.SIGTERM))
	fmt.Fprintf(r.sio.err, "etcdlock: %s: sent SIGTERM to %s, SIGKILL in %v\n", why, r.command[0], r.grace)
	return time.After(r.grace)
}

// noteLoss is the Session's observer: it passes on why a hold was lost.
func (r *runner) noteLoss(e etcdlock.Event) {
	if e.Kind != etcdlock.HoldLost {
		return
	}
	select {
	case r.losses <- e.Reason:
	default: // an exclusive run's second hold: the first reason tells
	}
}

// lossReason says why the lock was lost, waiting at most wait for the
// Session's observer to say it.
func (r *runner) lossReason(wait time.Duration) string {
	var why etcdlock.LossReason
	select {
	case why = <-r.losses:
	default:
		if wait > 0 {
			select {
			case why = <-r.losses:
			case <-time.After(wait):
			}
		}
	}
	if why != "" {
		select {
		case r.losses <- why: // for a later call
		default:
		}
	}
	switch why {
	case etcdlock.LossKeyDeleted:
		return "its key was deleted while its lease lived: by an operator or another client"
	case etcdlock.LossLeaseGone:
		return "its lease was revoked, or expired"
	case etcdlock.LossKeepAliveSilent:
		return fmt.Sprintf("etcd acknowledged no keep-alive for 2/3 of the TTL %v: the lease could expire", r.s.TTL())
	case etcdlock.LossSessionClosed:
		return "the session ended"
	case etcdlock.LossMaxHold:
		return fmt.Sprintf("it was held for --max-hold %v", r.opts.maxHold)
	}
	return "reason not known yet: key deleted, lease revoked or expired, or etcd silent"
}

// stopGroup waits until no process is left in COMMAND's process group,
// which the lost lock no longer covers, and kills those left at deadline.
func (r *runner) stopGroup(pid int, deadline time.Time) {
	for groupAlive(pid) {
		if !time.Now().Before(deadline) {
			r.warn(signalGroup(pid, syscall.SIGKILL))
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// unlock releases what this goroutine holds of the lock, if anything, on
// bounded contexts.
func (r *runner) unlock() {
	if r.l.held() {
		r.warn(r.l.release(context.Background()))
	}
}

// close ends the session, which revokes its lease, then closes the client.
func (r *runner) close() {
	if r.s != nil {
		r.warn(r.s.Close())
	}
	if r.cli != nil {
		r.cli.Close()
	}
}

func (r *runner) warn(err error) {
	if err != nil {
		fmt.Fprintf(r.sio.err, "etcdlock: warning: %v\n", err)
	}
}

// exitStatus returns the status a shell would report for ps.
func exitStatus(ps *os.ProcessState) int {
	if ps == nil {
		return exitFailed
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

func signalNumber(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return int(s)
	}
	return int(syscall.SIGTERM)
}
