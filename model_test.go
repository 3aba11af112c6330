package etcdlock_test

// The model-based test: random sequences of operations by several goroutines
// of several Sessions on every primitive (Mutex, RWMutex, Semaphore,
// MultiMutex, Do), interleaved with faults (a key deleted by hand, a lease
// revoked, a reply lost, a request applied after the caller gave up, a role
// that forbids writes and then allows them, a partition longer than the TTL,
// a client closed), on Sessions with and without WithRenewal. Each answer is
// judged against etcd when it is given (model_judge_test.go), and against
// what the goroutine holds by the model's count; between sequences of steps,
// once every fault is healed, what is in etcd must be what the goroutines
// hold: no key left by a failed call, no more than one fence per lease, and
// nothing under the lock's parent once all is released.
//
// The operations are random from a seed, printed with the last steps when a
// check fails; the timing of goroutines and etcd is not, so a seed replays
// the operations, not their interleaving. `go test` runs the sequences for a
// short budget; ETCDLOCK_MODEL_LONG=30m (or 1, for 10 minutes) runs them
// longer. Each sequence has a server of its own.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/queue"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

const (
	modelTTL     = 3 * time.Second
	modelActors  = 2 // goroutines per Session
	modelSteps   = 60
	modelCheckAt = 20 // steps between two checks of what etcd holds
)

// modelLimits are the limits the Sessions' Semaphores are made with, by
// turns: two, so that while no limit record is written the queue's keys
// come with either, and SetLimit's first write meets both.
var modelLimits = [...]int{2, 3}

// The Sessions of a sequence: one without WithRenewal, two with (one hands
// the Mutex from goroutine to goroutine).
var modelSessions = []struct {
	name    string
	renew   bool
	handoff int
}{{"plain", false, 0}, {"renewing", true, 0}, {"handing", true, 2}}

func TestModel(t *testing.T) {
	budget := faultsFor(t, "ETCDLOCK_MODEL_LONG", 8*time.Second)
	if !testflags.Long() && os.Getenv("ETCDLOCK_MODEL_LONG") == "" {
		budget = 3 * time.Second
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("ETCDLOCK_MODEL_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("ETCDLOCK_MODEL_SEED=%q: want a number", v)
		}
		seed, budget = n, 0
	}
	var stats modelStats
	start := time.Now()
	end := start.Add(budget)
	for i := 0; i == 0 || time.Now().Before(end); i++ {
		s := seed + uint64(i)
		ok := t.Run(fmt.Sprintf("seed=%d", s), func(t *testing.T) { runModel(t, s, end, &stats) })
		if !ok {
			t.Fatalf("sequence failed: rerun it with ETCDLOCK_MODEL_SEED=%d", s)
		}
	}
	t.Logf("%d sequences, %d steps (%d answers judged, %d faults; %d permits given, %d limits set, %d of them the first record, %d permits refused for another limit) in %v",
		stats.sequences.Load(), stats.steps.Load(), stats.judged.Load(), stats.faults.Load(),
		stats.permits.Load(), stats.limits.Load(), stats.firstLimits.Load(), stats.mismatches.Load(), time.Since(start).Round(time.Second))
}

// modelStats counts what the sequences did.
type modelStats struct {
	sequences, steps, judged, faults atomic.Int64
	permits, limits                  atomic.Int64 // Semaphore acquisitions given, SetLimit calls that wrote
	firstLimits, mismatches          atomic.Int64 // SetLimits that wrote the first record; acquisitions refused ErrLimitMismatch
}

// A world is one sequence's etcd, Sessions and goroutines.
type world struct {
	t      *testing.T
	rng    *rand.Rand
	stats  *modelStats
	root   *clientv3.Client // the judge's: sees etcd as it is
	prefix string           // every lock of the sequence is under it
	role   string

	sessions []*modelSession
	actors   []*goroutine
	log      *stepLog
	late     sync.WaitGroup // requests applied late
	writes   bool           // the role may write
	// writeEpoch counts the changes of the role's permissions (a forbid or
	// allow), so that an actor can tell whether the role had every
	// permission README gives through a whole call.
	writeEpoch atomic.Int64
}

// A modelSession is one Session of the sequence, with the client it uses
// and the faults that act on that client.
type modelSession struct {
	i       int
	renew   bool
	handoff int
	proxy   *etcdtest.Proxy
	faults  *modelFaults

	mu     sync.Mutex
	client *clientv3.Client
	s      *etcdlock.Session
	old    []*etcdlock.Session // replaced, to close at the end
	cutTil time.Time           // partitioned until
	sem    *etcdlock.Semaphore // on semOn
	semOn  *etcdlock.Session
}

func (ms *modelSession) session() *etcdlock.Session {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return ms.s
}

// semaphore returns the Session's Semaphore of name: one per Session, so
// that its acquisitions share what it keeps (a wait near the head opens the
// next one's watch before its enqueue).
func (ms *modelSession) semaphore(name string) *etcdlock.Semaphore {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.sem == nil || ms.sem.Name() != name || ms.semOn != ms.s {
		ms.sem, ms.semOn = etcdlock.NewSemaphore(ms.s, name, modelLimits[ms.i%len(modelLimits)]), ms.s
	}
	return ms.sem
}

// The lock names of a sequence, under its prefix.
func (w *world) mutexName() string { return w.prefix + "/m" }
func (w *world) rwName() string    { return w.prefix + "/rw" }
func (w *world) semName() string   { return w.prefix + "/sem" }
func (w *world) multiNames() []string {
	return []string{w.prefix + "/m", w.prefix + "/x"}
}

// runModel runs the sequence of seed: its steps, until end if it comes
// first (the first sequence runs them all), and its checks.
func runModel(t *testing.T, seed uint64, end time.Time, stats *modelStats) {
	w := &world{t: t, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), stats: stats, log: newStepLog(seed), writes: true}
	defer func() {
		if t.Failed() {
			t.Logf("the last steps of seed %d:\n%s", seed, w.log.String())
		}
	}()
	w.prefix = "model/" + strconv.FormatUint(seed, 36)
	perm := clientv3.PermissionType(clientv3.PermReadWrite)
	env := authServer(t, w.permissions(perm)...)
	w.root, w.role = env.root, env.role
	defer w.close() // before the setup: a failed connect still closes the clients made, or the proxies' cleanup waits for them
	for i, spec := range modelSessions {
		ms := &modelSession{i: i, renew: spec.renew, handoff: spec.handoff}
		_, ms.proxy = env.srv.ProxiedClient(t)
		ms.faults = &modelFaults{w: w}
		w.sessions = append(w.sessions, ms)
		w.connect(ms)
		for range modelActors {
			w.actors = append(w.actors, newGoroutine(w, ms, len(w.actors)))
		}
	}
	stats.sequences.Add(1)

	for step := 1; step <= modelSteps && !t.Failed() && (stats.sequences.Load() == 1 || time.Now().Before(end)); step++ {
		stats.steps.Add(1)
		if w.rng.IntN(6) == 0 {
			w.fault()
		} else {
			w.operate()
		}
		w.healDue()
		if step%modelCheckAt == 0 {
			w.checkpoint(false)
		}
	}
	if !t.Failed() {
		w.checkpoint(true)
	}
}

// connect gives ms a new client and a new Session on it.
func (w *world) connect(ms *modelSession) {
	// The login is a request: on a loaded machine under -race it may take
	// more than one dial timeout. Try for testTimeout.
	var c *clientv3.Client
	err := waitUntil(testContext(w.t), func() bool {
		var err error
		c, err = clientv3.New(clientv3.Config{
			Endpoints: ms.proxy.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
			Username: "locker", Password: "lockerpw",
			DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(ms.faults.intercept)},
		})
		return err == nil
	})
	if err != nil {
		w.t.Fatalf("client: no login within %v", testTimeout)
	}
	opts := []etcdlock.SessionOption{etcdlock.WithTTL(modelTTL), etcdlock.WithLocalHandoff(ms.handoff)}
	if ms.renew {
		opts = append(opts, etcdlock.WithRenewal())
	}
	s, err := etcdlock.NewSession(c, opts...)
	if err != nil {
		_ = c.Close()
		w.t.Fatalf("NewSession: %v", err)
	}
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.s != nil {
		ms.old = append(ms.old, ms.s)
	}
	ms.client, ms.s = c, s
}

// close ends the sequence: the goroutines stop, the Sessions close, the
// requests applied late land, and the clients close.
func (w *world) close() {
	for _, a := range w.actors {
		a.stop()
	}
	w.late.Wait()
	for _, ms := range w.sessions {
		ms.proxy.Unblackhole()
		ms.mu.Lock()
		all, c := append(ms.old, ms.s), ms.client
		ms.mu.Unlock()
		for _, s := range all {
			if s != nil {
				_ = s.Close()
				_ = s.Client().Close()
			}
		}
		if c != nil {
			_ = c.Close()
		}
	}
}

// operate gives a random idle goroutine a random operation, and waits for
// it a little: a call that waits for another holder goes on while the next
// steps run.
func (w *world) operate() {
	idle := make([]*goroutine, 0, len(w.actors))
	for _, a := range w.actors {
		if !a.busy.Load() {
			idle = append(idle, a)
		}
	}
	if len(idle) == 0 {
		time.Sleep(20 * time.Millisecond)
		return
	}
	a := idle[w.rng.IntN(len(idle))]
	op := a.pick(w.rng)
	w.log.add("g%d (%s) %s", a.i, modelSessions[a.ms.i].name, op.name)
	done := a.run(op)
	select {
	case <-done:
	case <-time.After(time.Duration(w.rng.IntN(100)) * time.Millisecond):
	}
}

// A modelFault is one fault of the sequence.
type modelFault struct {
	name string
	do   func(w *world, ms *modelSession) bool // false: not done (nothing to do it to)
}

var modelFaultList = []modelFault{
	{"delete a held key by hand", (*world).deleteHeld},
	{"revoke the lease", (*world).revoke},
	{"lose the next reply", func(w *world, ms *modelSession) bool { ms.faults.arm(modelLose); return true }},
	{"apply the next request late", func(w *world, ms *modelSession) bool { ms.faults.arm(modelLate); return true }},
	{"forbid writes", (*world).forbid},
	{"allow writes", (*world).allow},
	{"partition for longer than the TTL", (*world).partition},
	{"close the client", (*world).closeClient},
	{"replace an ended Session", (*world).replace},
}

// fault injects a random fault into a random Session's world.
func (w *world) fault() {
	f := modelFaultList[w.rng.IntN(len(modelFaultList))]
	ms := w.sessions[w.rng.IntN(len(w.sessions))]
	if f.do(w, ms) {
		w.stats.faults.Add(1)
		w.log.add("fault: %s (%s)", f.name, modelSessions[ms.i].name)
	}
}

// deleteHeld deletes the key of a hold of one of ms's goroutines.
func (w *world) deleteHeld(ms *modelSession) bool {
	var keys []string
	for _, a := range w.actors {
		if a.ms == ms {
			keys = append(keys, a.heldKeys()...)
		}
	}
	if len(keys) == 0 {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	key := keys[w.rng.IntN(len(keys))]
	if _, err := w.root.Delete(ctx, key); err != nil {
		w.t.Fatalf("delete %q: %v", key, err)
	}
	return true
}

// revoke revokes ms's lease in use.
func (w *world) revoke(ms *modelSession) bool {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	_, err := w.root.Revoke(ctx, ms.session().Lease())
	return err == nil
}

// forbid takes the role's write permission away: every write is refused.
func (w *world) forbid(*modelSession) bool {
	if !w.writes {
		return false
	}
	w.setWrites(false)
	return true
}

// allow gives the role its write permission back.
func (w *world) allow(*modelSession) bool {
	if w.writes {
		return false
	}
	w.setWrites(true)
	return true
}

func (w *world) setWrites(on bool) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	perm := clientv3.PermissionType(clientv3.PermRead)
	if on {
		perm = clientv3.PermissionType(clientv3.PermReadWrite)
	} else {
		// Odd before the first revoke: a call that starts while the role
		// loses its writes is not judged as one under every permission.
		w.writeEpoch.Add(1)
	}
	for _, p := range w.permissions(perm) {
		if _, err := w.root.RoleRevokePermission(ctx, w.role, p.key, p.end); err != nil {
			w.t.Fatalf("revoke permission: %v", err)
		}
		if _, err := w.root.RoleGrantPermission(ctx, w.role, p.key, p.end, p.perm); err != nil {
			w.t.Fatalf("grant permission: %v", err)
		}
	}
	w.writes = on
	if on {
		w.writeEpoch.Add(1) // even once every grant is in
	}
}

// permissions are the role's, as README gives them for the sequence's
// locks: its prefix, the fence keys, and the Semaphore's limit record
// (written by SetLimit).
func (w *world) permissions(perm clientv3.PermissionType) []permission {
	return []permission{
		prefixPermission(w.prefix+"/", perm),
		prefixPermission("etcdlock.fence.", perm),
		{queue.LimitKey(w.semName()), "", perm},
	}
}

// partition cuts ms off from etcd for longer than the TTL: its lease
// expires.
func (w *world) partition(ms *modelSession) bool {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if !ms.cutTil.IsZero() {
		return false
	}
	ms.cutTil = time.Now().Add(modelTTL + time.Second)
	ms.proxy.Blackhole()
	return true
}

// healDue ends the partitions whose time is up.
func (w *world) healDue() {
	for _, ms := range w.sessions {
		ms.mu.Lock()
		if !ms.cutTil.IsZero() && time.Now().After(ms.cutTil) {
			ms.cutTil = time.Time{}
			ms.proxy.Unblackhole()
		}
		ms.mu.Unlock()
	}
}

// closeClient closes ms's client: its Session ends, with or without
// WithRenewal.
func (w *world) closeClient(ms *modelSession) bool {
	ms.mu.Lock()
	c := ms.client
	ms.mu.Unlock()
	if c.Ctx().Err() != nil {
		return false
	}
	_ = c.Close()
	return true
}

// replace gives ms a new client and Session once its Session ended: its
// goroutines forget their holds of the old one.
func (w *world) replace(ms *modelSession) bool {
	ms.mu.Lock()
	cut := !ms.cutTil.IsZero()
	ms.mu.Unlock()
	if cut || !isClosed(ms.session().Done()) {
		return false // a new client logs in, a new Session grants: etcd must answer
	}
	for _, a := range w.actors {
		if a.ms == ms && a.busy.Load() {
			return false
		}
	}
	w.connect(ms)
	for _, a := range w.actors {
		if a.ms == ms {
			a.forget()
		}
	}
	return true
}

// heal ends every fault: partitions, the forbidden writes, armed faults.
func (w *world) heal() {
	for _, ms := range w.sessions {
		ms.faults.arm(modelNoFault)
		ms.mu.Lock()
		ms.cutTil = time.Time{}
		ms.mu.Unlock()
		ms.proxy.Unblackhole()
	}
	if !w.writes {
		w.setWrites(true)
	}
	w.late.Wait()
}

// Faults on the calls of one client.
const (
	modelNoFault = iota
	modelLose    // the next Txn is applied and its reply lost
	modelLate    // the next Txn is applied a while after the caller gave up
)

// modelFaults acts on the next Txn of a client, once armed.
type modelFaults struct {
	w     *world
	armed atomic.Int32
}

func (f *modelFaults) arm(kind int32) { f.armed.Store(kind) }

func (f *modelFaults) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if method != txnMethod {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	switch f.armed.Swap(modelNoFault) {
	case modelLose:
		if err := invoker(ctx, method, req, reply, cc, opts...); err != nil {
			return err
		}
		return status.Error(codes.Unavailable, "model: reply lost")
	case modelLate:
		delay := time.Duration(100+rand.IntN(1400)) * time.Millisecond
		f.w.late.Go(func() {
			time.Sleep(delay)
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			_ = invoker(ctx, method, req, reply, cc, opts...)
		})
		return status.Error(codes.Unavailable, "model: request held up in the network")
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// stepLog keeps the last steps of a sequence, for a failure's report.
type stepLog struct {
	mu    sync.Mutex
	start time.Time
	lines []string
}

func newStepLog(uint64) *stepLog { return &stepLog{start: time.Now()} }

func (l *stepLog) add(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf("%8v  ", time.Since(l.start).Round(time.Millisecond))+fmt.Sprintf(format, args...))
	if len(l.lines) > 300 {
		l.lines = l.lines[len(l.lines)-300:]
	}
}

func (l *stepLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}
