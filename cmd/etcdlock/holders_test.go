//go:build unix

package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

func TestPrintQueue(t *testing.T) {
	var free strings.Builder
	printQueue(&free, nil)
	if free.String() != "no holder\n" {
		t.Fatalf("free lock: got %q, want %q", free.String(), "no holder\n")
	}
	var out strings.Builder
	printQueue(&out, []queued{
		{QueueEntry: etcdlock.QueueEntry{Key: "a/read/694d7f3c2a1b4e05", Token: 12, Lease: 0x694d7f3c2a1b4e05, Holds: true, Identity: "host=h pid=1 cmd=sleep 60", Kind: etcdlock.KindRead}, ttl: 7},
		{QueueEntry: etcdlock.QueueEntry{Key: "a/read/694d7f3c2a1b4e07", Token: 14, Lease: 0x694d7f3c2a1b4e07, Holds: true, Kind: etcdlock.KindRead}, ttl: 9},
		{QueueEntry: etcdlock.QueueEntry{Key: "a/write/x", Token: 15, Identity: "line\nbreak", Kind: etcdlock.KindWrite}},
		{QueueEntry: etcdlock.QueueEntry{Key: "a/read/694d7f3c2a1b4e09", Token: 17, Lease: 0x694d7f3c2a1b4e09, Identity: "late", Kind: etcdlock.KindRead}, ttl: -1},
	})
	want := `ROLE      KIND   KEY                      TOKEN  LEASE             TTL      IDENTITY
holder    read   a/read/694d7f3c2a1b4e05  12     694d7f3c2a1b4e05  7s       host=h pid=1 cmd=sleep 60
holder    read   a/read/694d7f3c2a1b4e07  14     694d7f3c2a1b4e07  9s       -
waiter 1  write  a/write/x                15     -                 -        "line\nbreak"
waiter 2  read   a/read/694d7f3c2a1b4e09  17     694d7f3c2a1b4e09  expired  late
`
	if out.String() != want {
		t.Fatalf("got:\n%s\nwant:\n%s", out.String(), want)
	}

	// holders --watch, when a TTL could not be read.
	var unknown strings.Builder
	printQueue(&unknown, []queued{{QueueEntry: etcdlock.QueueEntry{Key: "a/1", Token: 3, Lease: 1, Holds: true, Kind: etcdlock.KindMutex}, ttl: ttlUnknown}})
	if rows := parseHolders(t, unknown.String()); len(rows) != 1 || rows[0][5] != "?" {
		t.Fatalf("TTL not read: got %q, want ?", unknown.String())
	}
}

// holdersColumns are the columns of etcdlock holders, in order.
var holdersColumns = []string{"ROLE", "KIND", "KEY", "TOKEN", "LEASE", "TTL", "IDENTITY"}

// parseHolders cuts the table etcdlock holders printed into cells, at the
// columns of its header: cells may contain spaces ("waiter 1", identities).
func parseHolders(t *testing.T, out string) [][]string {
	t.Helper()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if got := strings.Join(strings.Fields(lines[0]), " "); got != strings.Join(holdersColumns, " ") {
		t.Fatalf("header: got %q, want the columns %q", lines[0], holdersColumns)
	}
	starts := make([]int, len(holdersColumns))
	for i, col := range holdersColumns {
		starts[i] = strings.Index(lines[0], col)
	}
	var rows [][]string
	for _, line := range lines[1:] {
		row := make([]string, len(starts))
		for i, start := range starts {
			end := len(line)
			if i+1 < len(starts) {
				end = min(starts[i+1], len(line))
			}
			row[i] = strings.TrimSpace(line[min(start, end):end])
		}
		rows = append(rows, row)
	}
	return rows
}

// A holdersQueue is the contenders of one lock, each in a goroutine of its
// own, in the order they queued, with the row holders must show for each.
type holdersQueue struct {
	t      *testing.T
	cli    *clientv3.Client
	name   string
	ctx    context.Context // ends at stop: waiters give up, holders release
	cancel context.CancelFunc
	wg     sync.WaitGroup
	want   []wantRow
}

type wantRow struct {
	role, kind, identity string
	lease                clientv3.LeaseID
	key                  string // the key's prefix: NAME/, NAME/read/...
}

func newHoldersQueue(t *testing.T, cli *clientv3.Client, name string) *holdersQueue {
	ctx, cancel := context.WithCancel(t.Context())
	return &holdersQueue{t: t, cli: cli, name: name, ctx: ctx, cancel: cancel}
}

// stop ends every contender and waits for them.
func (q *holdersQueue) stop() {
	q.cancel()
	q.wg.Wait()
}

// add queues a contender with the Session s (closed when it ends): lock
// takes the lock, waiting, and returns its release. add returns once the
// contender's key is in etcd.
func (q *holdersQueue) add(w wantRow, s *etcdlock.Session, lock func(ctx context.Context) (func(context.Context) error, error)) {
	q.t.Helper()
	w.lease = s.Lease()
	q.start(w, s.Close, lock)
}

func (q *holdersQueue) start(w wantRow, closeSession func() error, lock func(ctx context.Context) (func(context.Context) error, error)) {
	q.t.Helper()
	q.want = append(q.want, w)
	q.wg.Go(func() {
		defer closeSession()
		release, err := lock(q.ctx)
		if err != nil {
			return // a waiter, stopped
		}
		<-q.ctx.Done()
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if err := release(ctx); err != nil {
			q.t.Errorf("%s: release: %v", w.identity, err)
		}
	})
	q.waitKey(w.lease)
}

// waitKey waits until a key of the lease is under the lock's name.
func (q *holdersQueue) waitKey(lease clientv3.LeaseID) {
	q.t.Helper()
	deadline := time.Now().Add(opTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		resp, err := q.cli.Get(ctx, q.name+"/", clientv3.WithPrefix())
		cancel()
		if err != nil {
			q.t.Fatalf("get %s/: %v", q.name, err)
		}
		for _, kv := range resp.Kvs {
			if clientv3.LeaseID(kv.Lease) == lease {
				return
			}
		}
		if time.Now().After(deadline) {
			q.t.Fatalf("no key of lease %x under %s/ after %v", lease, q.name, opTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// check runs etcdlock holders and compares its rows with the contenders,
// and their tokens with the keys' create revisions in etcd.
func (q *holdersQueue) check(ep string) {
	t := q.t
	t.Helper()
	r := runCLI(t, nil, "holders", "--endpoints", ep, q.name)
	r.want(t, 0)
	rows := parseHolders(t, r.stdout)
	if len(rows) != len(q.want) {
		t.Fatalf("holders: got %d rows, want %d:\n%s", len(rows), len(q.want), r.stdout)
	}
	for i, w := range q.want {
		row := rows[i]
		role, kind, key, token, lease, ttl, identity := row[0], row[1], row[2], row[3], row[4], row[5], row[6]
		if role != w.role || kind != w.kind || identity != w.identity || lease != fmt.Sprintf("%x", int64(w.lease)) || !strings.HasPrefix(key, w.key) {
			t.Errorf("row %d: got %q, want role %q, kind %q, a key under %s, lease %x, identity %q", i+1, row, w.role, w.kind, w.key, int64(w.lease), w.identity)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		resp, err := q.cli.Get(ctx, key)
		cancel()
		if err != nil || len(resp.Kvs) != 1 || token != strconv.FormatInt(resp.Kvs[0].CreateRevision, 10) {
			t.Errorf("row %d: token %s of %s, want that key's create revision (%v)", i+1, token, key, err)
		}
		if n, err := strconv.Atoi(strings.TrimSuffix(ttl, "s")); err != nil || !strings.HasSuffix(ttl, "s") || n < 1 || n > 10 {
			t.Errorf("row %d: TTL %q, want 1s to 10s", i+1, ttl)
		}
	}
	if t.Failed() {
		t.Logf("holders:\n%s", r.stdout)
	}
}

// TestHolders: etcdlock holders shows every kind of lock, holders first,
// then waiters in serving order, with their identities.
func TestHolders(t *testing.T) {
	testflags.Parallel(t)
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	ep := srv.Endpoints()[0]
	as := func(t *testing.T, id string) *etcdlock.Session {
		t.Helper()
		s, err := etcdlock.NewSession(cli, etcdlock.WithTTL(10*time.Second), etcdlock.WithIdentity(id))
		if err != nil {
			t.Fatalf("NewSession: %v", err)
		}
		return s
	}
	mutex := func(s *etcdlock.Session, name string) func(context.Context) (func(context.Context) error, error) {
		return func(ctx context.Context) (func(context.Context) error, error) {
			m := etcdlock.NewMutex(s, name)
			return m.UnlockContext, m.LockContext(ctx)
		}
	}
	rw := func(s *etcdlock.Session, name string, write bool) func(context.Context) (func(context.Context) error, error) {
		return func(ctx context.Context) (func(context.Context) error, error) {
			l := etcdlock.NewRWMutex(s, name)
			if write {
				return l.UnlockContext, l.LockContext(ctx)
			}
			return l.RUnlockContext, l.RLockContext(ctx)
		}
	}
	semaphore := func(s *etcdlock.Session, name string) func(context.Context) (func(context.Context) error, error) {
		return func(ctx context.Context) (func(context.Context) error, error) {
			p, err := etcdlock.NewSemaphore(s, name, 2).Acquire(ctx)
			return p.Release, err
		}
	}

	t.Run("free", func(t *testing.T) {
		name := lockName(t)
		// A key of the lock name+"/1": not part of name.
		if _, err := cli.Put(t.Context(), name+"/1/nested", ""); err != nil {
			t.Fatal(err)
		}
		r := runCLI(t, nil, "holders", "--endpoints", ep, name)
		r.want(t, 0)
		if got := strings.TrimSpace(r.stdout); got != "no holder" {
			t.Fatalf("holders of a free lock: got %q, want %q", got, "no holder")
		}
	})

	t.Run("mutex", func(t *testing.T) {
		name := lockName(t)
		// A key of the lock name+"/1", older than all: not part of name.
		if _, err := cli.Put(t.Context(), name+"/1/nested", "nested"); err != nil {
			t.Fatal(err)
		}
		q := newHoldersQueue(t, cli, name)
		defer q.stop()
		pfx := name + "/"
		s := as(t, "mutex holder")
		q.add(wantRow{role: "holder", kind: "mutex", identity: "mutex holder", key: pfx}, s, mutex(s, name))
		s = as(t, "tab\tin it")
		q.add(wantRow{role: "waiter 1", kind: "mutex", identity: `"tab\tin it"`, key: pfx}, s, mutex(s, name))
		// etcdctl lock and concurrency.Mutex store no identity.
		up, err := concurrency.NewSession(cli, concurrency.WithTTL(10))
		if err != nil {
			t.Fatal(err)
		}
		q.start(wantRow{role: "waiter 2", kind: "mutex", identity: "-", key: pfx, lease: up.Lease()}, up.Close,
			func(ctx context.Context) (func(context.Context) error, error) {
				m := concurrency.NewMutex(up, name)
				return m.Unlock, m.Lock(ctx)
			})
		q.check(ep)
	})

	t.Run("rwmutex", func(t *testing.T) {
		name := lockName(t)
		q := newHoldersQueue(t, cli, name)
		defer q.stop()
		reads, writes := name+"/read/", name+"/write/"
		s := as(t, "reader a")
		q.add(wantRow{role: "holder", kind: "read", identity: "reader a", key: reads}, s, rw(s, name, false))
		s = as(t, "reader b")
		q.add(wantRow{role: "holder", kind: "read", identity: "reader b", key: reads}, s, rw(s, name, false))
		s = as(t, "writer")
		q.add(wantRow{role: "waiter 1", kind: "write", identity: "writer", key: writes}, s, rw(s, name, true))
		// A reader behind a queued writer waits for it.
		s = as(t, "reader c")
		q.add(wantRow{role: "waiter 2", kind: "read", identity: "reader c", key: reads}, s, rw(s, name, false))
		q.check(ep)
	})

	t.Run("semaphore", func(t *testing.T) {
		name := lockName(t)
		q := newHoldersQueue(t, cli, name)
		defer q.stop()
		pfx := name + "/"
		for i, role := range []string{"holder", "holder", "waiter 1"} {
			id := fmt.Sprintf("permit %d", i+1)
			s := as(t, id)
			q.add(wantRow{role: role, kind: "semaphore", identity: id, key: pfx}, s, semaphore(s, name))
		}
		q.check(ep)
	})
}

// TestHoldersWatch: etcdlock holders --watch prints the queue, then again
// after every change, each after an empty line and in the format of
// holders, until interrupted; it exits 0.
func TestHoldersWatch(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	ctx := t.Context()
	name := lockName(t)
	p := startCLI(t, nil, "holders", "--watch", "--endpoints", srv.Endpoints()[0], name)
	// blocks waits until the output has n queues, and returns them.
	blocks := func(n int) []string {
		t.Helper()
		deadline := time.Now().Add(opTimeout)
		for {
			out := p.stdout.String()
			if got := strings.Split(strings.TrimSuffix(out, "\n"), "\n\n"); strings.HasSuffix(out, "\n") && len(got) >= n {
				return got
			}
			if time.Now().After(deadline) {
				t.Fatalf("holders --watch: want %d queues, got:\n%s\nstderr:\n%s", n, out, p.stderr.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	blocks(1)

	a := etcdlock.NewMutex(newSession(t, cli, etcdlock.WithIdentity("a")), name)
	if err := a.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	blocks(2)
	b := etcdlock.NewMutex(newSession(t, cli, etcdlock.WithIdentity("b")), name)
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	locked := make(chan error, 1)
	go func() {
		err := b.LockContext(bctx)
		if err == nil {
			// Ours to release: Mutex holds are per goroutine.
			<-bctx.Done()
			_ = b.UnlockContext(context.Background())
		}
		locked <- err
	}()
	blocks(3)
	if err := a.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
	got := blocks(4)

	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	r := p.wait(t)
	r.want(t, 0)
	if len(got) != 4 || got[0] != "no holder" {
		t.Fatalf("holders --watch: got %d queues, the first %q; want 4, the first \"no holder\":\n%s", len(got), got[0], r.stdout)
	}
	for i, want := range [][]string{
		{"holder a"},
		{"holder a", "waiter 1 b"},
		{"holder b"},
	} {
		rows := parseHolders(t, got[i+1])
		var roles []string
		for _, row := range rows {
			roles = append(roles, row[0]+" "+row[6])
			if row[1] != "mutex" || !strings.HasPrefix(row[2], name+"/") || !strings.HasSuffix(row[5], "s") {
				t.Errorf("queue %d: row %q: want a mutex key of %s with a TTL", i+2, row, name)
			}
		}
		if strings.Join(roles, ", ") != strings.Join(want, ", ") {
			t.Errorf("queue %d: got %q, want %q", i+2, roles, want)
		}
	}
	cancel()
	if err := <-locked; err != nil {
		t.Errorf("b's lock: %v", err)
	}
}
