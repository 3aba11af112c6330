package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/once"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// The tests of DoOnce and TryDoOnce, judged in etcd: f counts its runs in
// etcd (a key per run), and the slot's record, its lease and its TTL are
// read with a client.

// onceRetention is the retention of the tests that do not wait for it: a
// TTL that no Session of theirs has, so that a record's lease can be told
// from a Session's.
const onceRetention = 2 * time.Minute

// countRun is an f that puts one key per run under the lock's runs prefix,
// so that etcd counts the runs of each slot.
func countRun(client *clientv3.Client, name, slot, node string) func(ctx context.Context) error {
	var n atomic.Int64
	return func(ctx context.Context) error {
		_, err := client.Put(ctx, fmt.Sprintf("runs.%s.%s.%s.%d", name, slot, node, n.Add(1)), "")
		return err
	}
}

// runsOf returns how many runs of slot etcd holds.
func runsOf(t *testing.T, client *clientv3.Client, name, slot string) int64 {
	t.Helper()
	resp, err := client.Get(testContext(t), fmt.Sprintf("runs.%s.%s.", name, slot), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatalf("count the runs of %q: %v", slot, err)
	}
	return resp.Count
}

// recordOf returns the record of slot, nil if etcd holds none.
func recordOf(t *testing.T, client *clientv3.Client, name, slot string) *clientv3.GetResponse {
	t.Helper()
	resp, err := client.Get(testContext(t), once.Key(name, slot))
	if err != nil {
		t.Fatalf("read the record of %q: %v", slot, err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	return resp
}

// Two nodes, one whose clock is two hours ahead, name the same slot round
// after round, at once or one after the other: f runs once per slot.
func TestOnceTwoNodes(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	name := lockName(t)
	type node struct {
		id   string
		skew time.Duration // its clock, which the library never reads
		m    *etcdlock.Mutex
	}
	nodes := []node{
		{id: "a", m: etcdlock.NewMutex(newSession(t, client), name)},
		{id: "b", skew: 2 * time.Hour, m: etcdlock.NewMutex(newSession(t, startClient(t, client)), name)},
	}
	for round := range 6 {
		slot := fmt.Sprintf("2026-11-26T%02d:00", round)
		results := make([]etcdlock.OnceResult, len(nodes))
		var wg sync.WaitGroup
		for i, n := range nodes {
			run := func() {
				f := countRun(client, name, slot, n.id)
				var err error
				results[i], err = n.m.DoOnce(testContext(t), slot, onceRetention, func(ctx context.Context) error {
					t.Logf("round %d: node %s runs, its clock at %v", round, n.id, time.Now().Add(n.skew).Format(time.TimeOnly))
					return f(ctx)
				})
				if err != nil {
					t.Errorf("round %d, node %s: DoOnce: %v", round, n.id, err)
				}
			}
			if round%2 == 0 {
				wg.Go(run) // at once
			} else {
				run() // the second comes late
			}
		}
		wg.Wait()
		if got := runsOf(t, client, name, slot); got != 1 {
			t.Fatalf("round %d: f ran %d times in etcd, want 1 (results %v)", round, got, results)
		}
		if recordOf(t, client, name, slot) == nil {
			t.Fatalf("round %d: no record of %q in etcd", round, slot)
		}
		ran, done := 0, 0
		for _, r := range results {
			ran += btoi(r == etcdlock.OnceRan)
			done += btoi(r == etcdlock.OnceDone)
		}
		if ran != 1 || done != 1 {
			t.Fatalf("round %d: results %v, want one ran and one skipped: done", round, results)
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// The record lives where no queue counts it, with a lease of its own whose
// TTL is the retention; once it expires, the slot runs again.
func TestOnceRetention(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	name := lockName(t)
	s := newSession(t, client)
	m := etcdlock.NewMutex(s, name)
	const slot, retention = "2026-11-26T03:00/nightly", 3 * time.Second
	f := countRun(client, name, "s", "a")
	if got, err := m.DoOnce(testContext(t), slot, retention, f); got != etcdlock.OnceRan || err != nil {
		t.Fatalf("DoOnce: got %v, %v, want ran, nil", got, err)
	}
	rec := recordOf(t, client, name, slot)
	if rec == nil {
		t.Fatal("no record in etcd after a run")
	}
	if want := "etcdlock.done." + strings.ReplaceAll(name, "/", "%2F") + "@2026-11-26T03:00%2Fnightly"; string(rec.Kvs[0].Key) != want {
		t.Errorf("the record's key: got %q, want %q", rec.Kvs[0].Key, want)
	}
	lease := clientv3.LeaseID(rec.Kvs[0].Lease)
	if lease == clientv3.NoLease || lease == s.Lease() {
		t.Fatalf("the record's lease: got %x, want one of its own (the Session's is %x)", lease, s.Lease())
	}
	ttl, err := client.TimeToLive(testContext(t), lease)
	if err != nil {
		t.Fatalf("TimeToLive: %v", err)
	}
	if ttl.GrantedTTL != int64(retention/time.Second) {
		t.Errorf("the record's lease TTL: got %d s, want %v", ttl.GrantedTTL, retention)
	}
	if entries, err := etcdlock.Inspect(testContext(t), client, name); err != nil || len(entries) != 0 {
		t.Errorf("Inspect after the run: got %v, %v, want no entry", entries, err)
	}
	if got, err := m.DoOnce(testContext(t), slot, retention, f); got != etcdlock.OnceDone || err != nil {
		t.Fatalf("DoOnce again: got %v, %v, want skipped: done, nil", got, err)
	}
	eventually(t, "the record's expiry", func() bool { return recordOf(t, client, name, slot) == nil })
	if got, err := m.DoOnce(testContext(t), slot, retention, f); got != etcdlock.OnceRan || err != nil {
		t.Fatalf("DoOnce after the retention: got %v, %v, want ran, nil", got, err)
	}
	if got := runsOf(t, client, name, "s"); got != 2 {
		t.Fatalf("runs in etcd: got %d, want 2", got)
	}
}

// A crash while f runs, or f's error, records nothing, and the slot runs
// again.
func TestOnceNotDone(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	fail := errors.New("test: f failed")
	for _, c := range []struct {
		name string
		f    func(t *testing.T, s *etcdlock.Session) error // the end of f's run
		want error
	}{
		{"error", func(*testing.T, *etcdlock.Session) error { return fail }, fail},
		{"session closed", func(_ *testing.T, s *etcdlock.Session) error { _ = s.Close(); return nil }, etcdlock.ErrLockLost},
		{"key deleted", func(t *testing.T, s *etcdlock.Session) error {
			held, _ := etcdlock.NewMutex(s, lockName(t)).Held()
			if _, err := client.Delete(testContext(t), held.Key); err != nil {
				t.Errorf("delete the hold's key: %v", err)
			}
			return nil
		}, etcdlock.ErrLockLost},
	} {
		t.Run(c.name, func(t *testing.T) {
			name := lockName(t)
			s := newSession(t, client)
			m := etcdlock.NewMutex(s, name)
			const slot = "slot"
			leases := recordLeases(t, client)
			got, err := m.DoOnce(testContext(t), slot, onceRetention, func(ctx context.Context) error {
				if err := countRun(client, name, slot, "crash")(ctx); err != nil {
					return err
				}
				return c.f(t, s)
			})
			if got != etcdlock.OnceRan || !errors.Is(err, c.want) {
				t.Fatalf("DoOnce: got %v, %v, want ran, %v", got, err, c.want)
			}
			if recordOf(t, client, name, slot) != nil {
				t.Fatal("a record in etcd, want none")
			}
			if n := recordLeases(t, client); !sharedEtcd() && n != leases {
				t.Fatalf("record leases in etcd: got %d, want %d (none left behind)", n, leases)
			}
			m = etcdlock.NewMutex(newSession(t, client), name)
			if got, err := m.DoOnce(testContext(t), slot, onceRetention, countRun(client, name, slot, "again")); got != etcdlock.OnceRan || err != nil {
				t.Fatalf("DoOnce again: got %v, %v, want ran, nil", got, err)
			}
			if got := runsOf(t, client, name, slot); got != 2 {
				t.Fatalf("runs in etcd: got %d, want 2", got)
			}
			if recordOf(t, client, name, slot) == nil {
				t.Fatal("no record in etcd after the second run")
			}
		})
	}
}

// TryDoOnce skips a slot whose lock another holds, running and writing
// nothing.
func TestOnceBusy(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	name := lockName(t)
	holder := etcdlock.NewMutex(newSession(t, client), name)
	if err := holder.LockContext(testContext(t)); err != nil {
		t.Fatalf("LockContext: %v", err)
	}
	m := etcdlock.NewMutex(newSession(t, startClient(t, client)), name)
	for _, wait := range []time.Duration{0, 200 * time.Millisecond} {
		got, err := m.TryDoOnce(testContext(t), "slot", onceRetention, wait, countRun(client, name, "slot", "b"))
		if got != etcdlock.OnceBusy || err != nil {
			t.Fatalf("TryDoOnce, wait %v: got %v, %v, want skipped: busy, nil", wait, got, err)
		}
	}
	if runs := runsOf(t, client, name, "slot"); runs != 0 || recordOf(t, client, name, "slot") != nil {
		t.Fatalf("after busy tries: %d runs in etcd and a record %v, want none", runs, recordOf(t, client, name, "slot"))
	}
	if err := holder.UnlockContext(testContext(t)); err != nil {
		t.Fatalf("UnlockContext: %v", err)
	}
	if got, err := m.TryDoOnce(testContext(t), "slot", onceRetention, 0, countRun(client, name, "slot", "b")); got != etcdlock.OnceRan || err != nil {
		t.Fatalf("TryDoOnce, free: got %v, %v, want ran, nil", got, err)
	}
}

// Bad input returns ErrInvalidArgument and writes nothing.
func TestOnceInvalid(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	m := etcdlock.NewMutex(newSession(t, client), lockName(t))
	before, err := client.Get(testContext(t), "any")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	var ran atomic.Bool
	f := func(context.Context) error { ran.Store(true); return nil }
	ctx := testContext(t)
	for _, c := range []struct {
		name      string
		ctx       context.Context
		slot      string
		retention time.Duration
		f         func(context.Context) error
	}{
		{"empty slot", ctx, "", time.Minute, f},
		{"zero retention", ctx, "s", 0, f},
		{"negative retention", ctx, "s", -time.Second, f},
		{"nil f", ctx, "s", time.Minute, nil},
		{"nil ctx", nil, "s", time.Minute, f},
	} {
		if got, err := m.DoOnce(c.ctx, c.slot, c.retention, c.f); got != 0 || !errors.Is(err, etcdlock.ErrInvalidArgument) {
			t.Errorf("DoOnce, %s: got %v, %v, want ErrInvalidArgument", c.name, got, err)
		}
		if got, err := m.TryDoOnce(c.ctx, c.slot, c.retention, 0, c.f); got != 0 || !errors.Is(err, etcdlock.ErrInvalidArgument) {
			t.Errorf("TryDoOnce, %s: got %v, %v, want ErrInvalidArgument", c.name, got, err)
		}
	}
	if ran.Load() {
		t.Error("f ran on bad input")
	}
	after, err := client.Get(testContext(t), "any")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if !sharedEtcd() && after.Header.Revision != before.Header.Revision {
		t.Errorf("etcd's revision: got %d, want %d (nothing written)", after.Header.Revision, before.Header.Revision)
	}
}

// recordFault acts on the first call that match picks (by default, the
// Txn that puts a record): it hands it to act, which decides whether and
// how to call etcd; late sends a Txn so picked again, after the caller was
// answered, on a context of its own.
type recordFault struct {
	match func(method string, req any) bool
	act   func(invoke func() error) error
	fired atomic.Int32
	late  atomic.Value // func() (*pb.TxnResponse, error)
}

// recordPut reports whether a call is the Txn that puts a record.
func recordPut(method string, req any) bool {
	txn, ok := req.(*pb.TxnRequest)
	return method == txnMethod && ok && len(txn.Success) == 1 && txn.Success[0].GetRequestPut() != nil &&
		strings.Contains(string(txn.Success[0].GetRequestPut().Key), once.Prefix)
}

func (f *recordFault) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	invoke := func() error { return invoker(ctx, method, req, reply, cc, opts...) }
	match := f.match
	if match == nil {
		match = recordPut
	}
	if !match(method, req) {
		return invoke()
	}
	if f.fired.Add(1) > 1 {
		return invoke()
	}
	f.late.Store(func() (*pb.TxnResponse, error) {
		resp := new(pb.TxnResponse)
		return resp, invoker(context.WithoutCancel(ctx), method, req, resp, cc, opts...)
	})
	return f.act(invoke)
}

// The record's put, faulted once: its reply lost after etcd applied it, its
// request dropped, or held up and applied once DoOnce returned, with the
// hold kept or lost before the put is sent again. f never runs twice, DoOnce
// says "ran" with no error only where etcd holds the record, and a put
// applied late changes nothing: the hold it is guarded by has ended.
func TestOnceRecordFaults(t *testing.T) {
	testflags.Parallel(t)
	lost := status.Error(codes.Unavailable, "test: reply lost")
	for _, c := range []struct {
		name     string
		apply    bool // etcd applies the first put
		loseHold bool // the hold's key is deleted before the put is sent again
		want     error
	}{
		{"reply lost", true, false, nil},
		{"reply lost, hold lost", true, true, nil},
		{"dropped", false, false, nil},
		{"dropped, hold lost", false, true, etcdlock.ErrLockLost},
		{"late", false, false, nil},
		{"late, hold lost", false, true, etcdlock.ErrLockLost},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv, client := startServer(t)
			name := lockName(t)
			var holdKey atomic.Value // string
			fault := &recordFault{act: func(invoke func() error) error {
				if c.apply {
					if err := invoke(); err != nil {
						return err
					}
				}
				if c.loseHold {
					if _, err := client.Delete(context.Background(), holdKey.Load().(string)); err != nil {
						return err
					}
				}
				return lost
			}}
			m := etcdlock.NewMutex(newSession(t, serverClient(t, srv, fault.intercept, nil)), name)
			const slot = "slot"
			got, err := m.DoOnce(testContext(t), slot, onceRetention, func(ctx context.Context) error {
				held, _ := etcdlock.HoldFrom(ctx)
				holdKey.Store(held.Key)
				return countRun(client, name, slot, "a")(ctx)
			})
			if fault.fired.Load() < 1 {
				t.Fatal("the fault never fired")
			}
			if got != etcdlock.OnceRan || !errors.Is(err, c.want) || c.want == nil && err != nil {
				t.Fatalf("DoOnce: got %v, %v, want ran, %v", got, err, c.want)
			}
			rec := recordOf(t, client, name, slot)
			if strings.HasPrefix(c.name, "late") {
				resp, err := fault.late.Load().(func() (*pb.TxnResponse, error))()
				if err != nil || resp.Succeeded {
					t.Fatalf("the late put: got %v, %v, want it refused by its guard", resp, err)
				}
				if late := recordOf(t, client, name, slot); (late == nil) != (rec == nil) || rec != nil && late.Kvs[0].ModRevision != rec.Kvs[0].ModRevision {
					t.Fatalf("the record after the late put: got %v, want %v", late, rec)
				}
			}
			if (rec != nil) != (c.want == nil) {
				t.Fatalf("the record in etcd: got %v, want one: %v", rec, c.want == nil)
			}
			if rec == nil && !sharedEtcd() {
				if n := recordLeases(t, client); n != 0 {
					t.Fatalf("record leases in etcd with no record: got %d, want 0 (revoked)", n)
				}
			}
			again, err := etcdlock.NewMutex(newSession(t, client), name).DoOnce(testContext(t), slot, onceRetention, countRun(client, name, slot, "b"))
			if want := map[bool]etcdlock.OnceResult{true: etcdlock.OnceDone, false: etcdlock.OnceRan}[rec != nil]; again != want || err != nil {
				t.Fatalf("DoOnce again: got %v, %v, want %v, nil", again, err, want)
			}
			if want := map[bool]int64{true: 1, false: 2}[rec != nil]; runsOf(t, client, name, slot) != want {
				t.Fatalf("runs in etcd: got %d, want %d", runsOf(t, client, name, slot), want)
			}
		})
	}
}

// TestOnceRecordRefusedAfterLostReply: the record's put applied with its
// reply lost, and the put sent again refused by etcd: the first put stands,
// so DoOnce says "ran" with no error, the record's lease is not revoked
// (which would delete the record), and a second DoOnce finds the slot done:
// f ran once. (Before, the refusal revoked the lease, and f ran twice.)
func TestOnceRecordRefusedAfterLostReply(t *testing.T) {
	testflags.Parallel(t)
	srv, client := startServer(t)
	name := lockName(t)
	var puts atomic.Int32
	intercept := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if !recordPut(method, req) {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		switch puts.Add(1) {
		case 1:
			if err := invoker(ctx, method, req, reply, cc, opts...); err != nil {
				return err
			}
			return status.Error(codes.Unavailable, "test: reply lost")
		case 2:
			return rpctypes.ErrGRPCPermissionDenied
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	m := etcdlock.NewMutex(newSession(t, serverClient(t, srv, intercept, nil)), name)
	got, err := m.DoOnce(testContext(t), "slot", onceRetention, countRun(client, name, "slot", "a"))
	if got != etcdlock.OnceRan || err != nil {
		t.Fatalf("DoOnce: got %v, %v, want ran, nil (the first put stands)", got, err)
	}
	if puts.Load() != 2 {
		t.Fatalf("record puts: got %d, want 2", puts.Load())
	}
	if recordOf(t, client, name, "slot") == nil {
		t.Fatal("no record in etcd: its lease was revoked")
	}
	again, err := etcdlock.NewMutex(newSession(t, client), name).DoOnce(testContext(t), "slot", onceRetention, countRun(client, name, "slot", "b"))
	if again != etcdlock.OnceDone || err != nil {
		t.Fatalf("DoOnce again: got %v, %v, want done", again, err)
	}
	if n := runsOf(t, client, name, "slot"); n != 1 {
		t.Fatalf("runs in etcd: got %d, want 1", n)
	}
}

// recordLeases returns how many leases of onceRetention etcd holds.
func recordLeases(t *testing.T, client *clientv3.Client) int {
	t.Helper()
	leases, err := client.Leases(testContext(t))
	if err != nil {
		t.Fatalf("Leases: %v", err)
	}
	n := 0
	for _, l := range leases.Leases {
		ttl, err := client.TimeToLive(testContext(t), l.ID)
		if err != nil {
			t.Fatalf("TimeToLive %x: %v", l.ID, err)
		}
		n += btoi(ttl.GrantedTTL == int64(onceRetention/time.Second))
	}
	return n
}

// The other calls of DoOnce, faulted once: a read of the record refused
// (its role lacks etcdlock.done.) runs nothing and returns etcd's error; a
// grant whose reply is lost is sent again by clientv3, the record is made,
// and the lease of the lost reply is left to expire with the retention.
func TestOnceOtherFaults(t *testing.T) {
	testflags.Parallel(t)
	for _, c := range []struct {
		name   string
		match  func(method string, req any) bool
		act    func(invoke func() error) error
		want   etcdlock.OnceResult
		err    error
		runs   int64 // of f, in etcd
		leases int   // record leases in etcd
	}{
		{"read refused", func(method string, req any) bool {
			r, ok := req.(*pb.RangeRequest)
			return ok && strings.Contains(string(r.Key), once.Prefix)
		}, func(func() error) error { return rpctypes.ErrGRPCPermissionDenied }, 0, rpctypes.ErrPermissionDenied, 0, 0},
		{"grant reply lost", func(method string, _ any) bool { return method == "/etcdserverpb.Lease/LeaseGrant" }, func(invoke func() error) error {
			if err := invoke(); err != nil {
				return err
			}
			return status.Error(codes.DeadlineExceeded, "test: reply lost")
		}, etcdlock.OnceRan, nil, 1, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv, client := startServer(t)
			name := lockName(t)
			fault := &recordFault{match: c.match, act: c.act}
			s := newSession(t, serverClient(t, srv, fault.intercept, nil))
			fault.fired.Store(0) // the Session's own grant is not under test
			got, err := etcdlock.NewMutex(s, name).DoOnce(testContext(t), "slot", onceRetention, countRun(client, name, "slot", "a"))
			if fault.fired.Load() < 1 {
				t.Fatal("the fault never fired")
			}
			if got != c.want || !errors.Is(err, c.err) || c.err == nil && err != nil {
				t.Fatalf("DoOnce: got %v, %v, want %v, %v", got, err, c.want, c.err)
			}
			if runs := runsOf(t, client, name, "slot"); runs != c.runs || (recordOf(t, client, name, "slot") != nil) != (c.runs == 1) {
				t.Fatalf("after DoOnce: %d runs in etcd and a record %v, want %d and a record: %v", runs, recordOf(t, client, name, "slot"), c.runs, c.runs == 1)
			}
			if n := recordLeases(t, client); !sharedEtcd() && n != c.leases {
				t.Fatalf("record leases in etcd: got %d, want %d", n, c.leases)
			}
		})
	}
}
