package etcdlockgocron_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	etcdlockgocron "github.com/etcdlock/etcdlock/gocron"
)

// skew is how much later each replica of TestLockerReplicas starts a tick
// than the one before.
const skew = 50 * time.Millisecond

// Three replicas' schedulers run one job each tick with the Locker, their
// starts of a tick spread over 100 ms: each tick runs once, under a lock
// etcd shows held by the replica that runs it; once the replica that ran
// last is cut off from etcd, the others go on. Without WithMinHold, the
// later replicas run most ticks again.
func TestLockerReplicas(t *testing.T) {
	srv := etcdtest.Start(t)
	prefix := t.Name() + "/jobs/"
	cutOneOfThree(t, srv, prefix+"report/", "replica", func(r *replica) gocron.SchedulerOption {
		// Each replica starts a tick 50 ms after the one before, a run
		// taking milliseconds: the minimum hold keeps the later ones out.
		l, err := etcdlockgocron.NewLocker(r.s, prefix, etcdlockgocron.WithMinHold(interval*3/4))
		if err != nil {
			t.Fatal(err)
		}
		return gocron.WithDistributedLocker(l)
	})
}

// Lock takes the job's lock only while nobody else holds it; Unlock
// deletes its key, after the minimum hold.
func TestLockerLockUnlock(t *testing.T) {
	srv := etcdtest.Start(t)
	judge := srv.Client(t)
	ctx := context.Background()
	prefix := t.Name() + "/"
	const minHold = 300 * time.Millisecond
	var lockers [2]*etcdlockgocron.Locker
	for i := range lockers {
		s, err := etcdlock.NewSession(srv.Client(t))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if lockers[i], err = etcdlockgocron.NewLocker(s, prefix, etcdlockgocron.WithMinHold(minHold)); err != nil {
			t.Fatal(err)
		}
	}
	keys := func() int64 {
		t.Helper()
		resp, err := judge.Get(ctx, prefix+"job/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count
	}

	start := time.Now()
	lock, err := lockers[0].Lock(ctx, "job")
	if err != nil {
		t.Fatalf("Lock: got %v, want nil", err)
	}
	if n := keys(); n != 1 {
		t.Fatalf("keys in etcd while held: got %d, want 1", n)
	}
	if _, err := lockers[1].Lock(ctx, "job"); !errors.Is(err, etcdlockgocron.ErrBusy) {
		t.Fatalf("Lock of a held job: got %v, want ErrBusy", err)
	}
	if n := keys(); n != 1 {
		t.Fatalf("keys in etcd after a busy Lock: got %d, want 1", n)
	}
	if err := lock.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: got %v, want nil", err)
	}
	if d := time.Since(start); d < minHold {
		t.Errorf("Unlock returned %v after Lock, want >= %v", d, minHold)
	}
	if n := keys(); n != 0 {
		t.Fatalf("keys in etcd after Unlock: got %d, want 0", n)
	}
	if err := lock.Unlock(ctx); !errors.Is(err, etcdlock.ErrNotHeld) {
		t.Errorf("second Unlock: got %v, want ErrNotHeld", err)
	}
	lock, err = lockers[1].Lock(ctx, "job")
	if err != nil {
		t.Fatalf("Lock once free: got %v, want nil", err)
	}
	// A cancelled context (the scheduler shutting down) keeps the minimum
	// hold, and unlocks.
	start = time.Now()
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := lock.Unlock(cctx); err != nil {
		t.Fatalf("Unlock with a cancelled context: got %v, want nil", err)
	}
	if d := time.Since(start); d < minHold-100*time.Millisecond {
		t.Errorf("Unlock with a cancelled context returned %v after Lock, want about %v or more", d, minHold)
	}
	if n := keys(); n != 0 {
		t.Fatalf("keys in etcd after Unlock: got %d, want 0", n)
	}
}

func TestLockerInvalid(t *testing.T) {
	srv := etcdtest.Start(t)
	s, err := etcdlock.NewSession(srv.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tc := range []struct {
		name   string
		s      *etcdlock.Session
		prefix string
		opts   []etcdlockgocron.LockerOption
	}{
		{"nil session", nil, "jobs/", nil},
		{"empty prefix", s, "", nil},
		{"negative minimum hold", s, "jobs/", []etcdlockgocron.LockerOption{etcdlockgocron.WithMinHold(-time.Second)}},
	} {
		if _, err := etcdlockgocron.NewLocker(tc.s, tc.prefix, tc.opts...); !errors.Is(err, etcdlockgocron.ErrInvalidArgument) {
			t.Errorf("%s: got %v, want ErrInvalidArgument", tc.name, err)
		}
	}
	l, err := etcdlockgocron.NewLocker(s, "jobs/")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Lock(context.Background(), ""); !errors.Is(err, etcdlockgocron.ErrInvalidArgument) {
		t.Errorf("empty job name: got %v, want ErrInvalidArgument", err)
	}
	//lint:ignore SA1012 a nil context is the bad input under test
	if _, err := l.Lock(nil, "job"); !errors.Is(err, etcdlockgocron.ErrInvalidArgument) {
		t.Errorf("nil context: got %v, want ErrInvalidArgument", err)
	}
}

// A run longer than the lease's TTL keeps its lock, renewed by the
// Session's keep-alive alone; a hold whose key is deleted under it unlocks
// with ErrLockLost.
func TestLockerLongRun(t *testing.T) {
	srv := etcdtest.Start(t)
	judge := srv.Client(t)
	ctx := context.Background()
	prefix := t.Name() + "/"
	var (
		lockers [2]*etcdlockgocron.Locker
		ttl     time.Duration // as etcd granted it
	)
	for i := range lockers {
		s, err := etcdlock.NewSession(srv.Client(t), etcdlock.WithTTL(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		ttl = s.TTL()
		if lockers[i], err = etcdlockgocron.NewLocker(s, prefix); err != nil {
			t.Fatal(err)
		}
	}
	lock, err := lockers[0].Lock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * ttl)
	resp, err := judge.Get(ctx, prefix+"job/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 {
		t.Fatalf("keys in etcd after twice the TTL: got %d, want 1", len(resp.Kvs))
	}
	if _, err := lockers[1].Lock(ctx, "job"); !errors.Is(err, etcdlockgocron.ErrBusy) {
		t.Fatalf("Lock of a job run past the TTL: got %v, want ErrBusy", err)
	}
	if err := lock.Unlock(ctx); err != nil {
		t.Fatalf("Unlock after twice the TTL: got %v, want nil", err)
	}

	lock, err = lockers[1].Lock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := judge.Delete(ctx, prefix+"job/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	if err := lock.Unlock(ctx); !errors.Is(err, etcdlock.ErrLockLost) {
		t.Errorf("Unlock of a hold whose key was deleted: got %v, want ErrLockLost", err)
	}
}
