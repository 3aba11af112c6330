package etcdlockgocron_test

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
)

// interval is the period of the jobs of the replica tests: long enough
// that a run starts within it of its tick on a loaded machine, so that
// the tick a run is for is the whole intervals since the first.
const interval = 2 * time.Second

// A replica is one of the processes of a test: its own client (behind a
// proxy that can cut it off), Session and gocron.Scheduler.
type replica struct {
	i     int
	proxy *etcdtest.Proxy
	s     *etcdlock.Session
	sched gocron.Scheduler
}

// newReplicas makes n replicas on srv, each with a Session of a 2 s TTL,
// WithRenewal; the Sessions close at the test's end.
func newReplicas(t *testing.T, srv *etcdtest.Server, n int) []*replica {
	t.Helper()
	rs := make([]*replica, n)
	for i := range rs {
		client, proxy := srv.ProxiedClient(t)
		s, err := etcdlock.NewSession(client, etcdlock.WithTTL(2*time.Second), etcdlock.WithRenewal())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		rs[i] = &replica{i: i, proxy: proxy, s: s}
	}
	return rs
}

// A judge records the runs of a job in etcd, through a client of its own,
// and checks at each run that etcd shows the running replica as the
// holder of the lock it runs under.
type judge struct {
	t      *testing.T
	client *clientv3.Client
	runs   string    // the prefix of the records: runs/TICK/REPLICA
	held   string    // the prefix of the keys of the lock the runs need
	first  time.Time // the first tick

	mu       sync.Mutex
	problems []string
}

func newJudge(t *testing.T, srv *etcdtest.Server, held string, first time.Time) *judge {
	return &judge{t: t, client: srv.Client(t), runs: t.Name() + "/runs/", held: held, first: first}
}

// run is the job of replica r: it records the run under its tick, and
// the holder etcd shows if that is not r.
func (j *judge) run(r *replica) {
	tick := int(time.Since(j.first) / interval)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := j.client.Get(ctx, j.held, clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))
	switch {
	case err != nil:
		j.problem("tick %d: replica %d: read of the holder: %v", tick, r.i, err)
	case len(resp.Kvs) == 0:
		j.problem("tick %d: replica %d ran with no holder in etcd", tick, r.i)
	case clientv3.LeaseID(resp.Kvs[0].Lease) != r.s.Lease():
		j.problem("tick %d: replica %d ran; got holder %s in etcd, want its lease %x", tick, r.i, resp.Kvs[0].Key, r.s.Lease())
	}
	key := fmt.Sprintf("%s%06d/%d", j.runs, tick, r.i)
	if _, err := j.client.Put(ctx, key, ""); err != nil {
		j.problem("tick %d: replica %d: record of the run: %v", tick, r.i, err)
	}
}

func (j *judge) problem(format string, args ...any) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.problems = append(j.problems, fmt.Sprintf(format, args...))
}

// recorded returns the runs etcd has: the replicas that ran each tick.
func (j *judge) recorded() map[int][]int {
	j.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := j.client.Get(ctx, j.runs, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		j.t.Fatal(err)
	}
	runs := make(map[int][]int)
	for _, kv := range resp.Kvs {
		tick, r, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), j.runs), "/")
		tn, err1 := strconv.Atoi(tick)
		rn, err2 := strconv.Atoi(r)
		if !ok || err1 != nil || err2 != nil {
			j.t.Fatalf("record %q: not runs/TICK/REPLICA", kv.Key)
		}
		runs[tn] = append(runs[tn], rn)
	}
	return runs
}

// waitRuns waits, 60 s at most, until ok holds for the recorded runs.
func (j *judge) waitRuns(what string, ok func(map[int][]int) bool) map[int][]int {
	j.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		runs := j.recorded()
		if ok(runs) {
			return runs
		}
		if time.Now().After(deadline) {
			j.t.Fatalf("after 60 s, %s: got runs %v", what, runs)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// check fails the test for each tick run more than once, and for each
// problem seen by the runs.
func (j *judge) check(runs map[int][]int) {
	j.t.Helper()
	ticks := make([]int, 0, len(runs))
	for tick := range runs {
		ticks = append(ticks, tick)
	}
	sort.Ints(ticks)
	for _, tick := range ticks {
		if n := len(runs[tick]); n != 1 {
			j.t.Errorf("tick %d: got %d runs (replicas %v), want 1", tick, n, runs[tick])
		}
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, p := range j.problems {
		j.t.Error(p)
	}
}

// ticksBy counts the ticks after tick that a replica other than not ran.
func ticksBy(runs map[int][]int, after, not int) int {
	n := 0
	for tick, rs := range runs {
		for _, r := range rs {
			if tick > after && r != not {
				n++
			}
		}
	}
	return n
}

// lastRun returns the latest tick recorded, and a replica that ran it.
func lastRun(runs map[int][]int) (tick, r int) {
	tick = -1
	for tn, rs := range runs {
		if tn > tick {
			tick, r = tn, rs[0]
		}
	}
	return tick, r
}

// startJob starts r's scheduler, made with opt, with one job that runs
// j.run at each interval from j.first plus skew: a replica whose clock is
// behind, or whose runs start late.
func startJob(t *testing.T, r *replica, j *judge, skew time.Duration, opt gocron.SchedulerOption) {
	t.Helper()
	sched, err := gocron.NewScheduler(opt)
	if err != nil {
		t.Fatal(err)
	}
	r.sched = sched
	_, err = sched.NewJob(gocron.DurationJob(interval), gocron.NewTask(j.run, r),
		gocron.WithName("report"), gocron.WithStartAt(gocron.WithStartDateTime(j.first.Add(skew))))
	if err != nil {
		t.Fatal(err)
	}
	sched.Start()
}

// shutdown stops the replicas' schedulers, their proxies passing again so
// that the runs under way end.
func shutdown(t *testing.T, rs []*replica) {
	t.Helper()
	for _, r := range rs {
		r.proxy.Unblackhole()
	}
	for _, r := range rs {
		if r.sched != nil {
			if err := r.sched.Shutdown(); err != nil {
				t.Errorf("replica %d: shutdown: %v", r.i, err)
			}
		}
	}
}

// cutOneOfThree runs a job on three replicas of srv, each scheduler made
// with opt(r), 50 ms apart: after 3 ticks it cuts off the replica that ran
// the last, and once the others have run 3 more, it checks every tick in
// etcd (the runs judged by j, whose key under held the runner must hold).
// what names the replica that was cut off, in the log.
func cutOneOfThree(t *testing.T, srv *etcdtest.Server, held, what string, opt func(r *replica) gocron.SchedulerOption) {
	t.Helper()
	rs := newReplicas(t, srv, 3)
	first := time.Now().Truncate(interval).Add(2 * interval)
	j := newJudge(t, srv, held, first)
	defer shutdown(t, rs)
	for _, r := range rs {
		startJob(t, r, j, time.Duration(r.i)*skew, opt(r))
	}
	runs := j.waitRuns("3 ticks run", func(runs map[int][]int) bool { return len(runs) >= 3 })
	killed, cut := lastRun(runs)
	rs[cut].proxy.Blackhole()
	t.Logf("%s %d cut off after tick %d", what, cut, killed)
	runs = j.waitRuns("3 ticks run by the others", func(runs map[int][]int) bool { return ticksBy(runs, killed+1, cut) >= 3 })
	shutdown(t, rs)
	j.check(j.recorded())
	t.Logf("runs per tick: %v", runs)
}
