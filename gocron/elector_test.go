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

// Three replicas' schedulers with an Elector each: only the replica etcd
// shows as the leader runs the job, each tick once; once the leader is cut
// off from etcd, another leads and runs it.
func TestElectorReplicas(t *testing.T) {
	srv := etcdtest.Start(t)
	name := t.Name() + "/leader"
	cutOneOfThree(t, srv, name+"/", "leader", func(r *replica) gocron.SchedulerOption {
		e, err := etcdlockgocron.NewElector(r.s, name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		// The same skew as the Locker's test: no matter to an Elector.
		return gocron.WithDistributedElector(e)
	})
}

// IsLeader returns nil once the Elector's key is the oldest in etcd, and
// ErrNotLeader after Close, which deletes the key.
func TestElectorClose(t *testing.T) {
	srv := etcdtest.Start(t)
	judge := srv.Client(t)
	name := t.Name()
	s, err := etcdlock.NewSession(srv.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	e, err := etcdlockgocron.NewElector(s, name)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for e.IsLeader(ctx) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("IsLeader after 30 s alone: got %v, want nil", e.IsLeader(ctx))
		}
		time.Sleep(10 * time.Millisecond)
	}
	resp, err := judge.Get(ctx, name+"/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || clientv3.LeaseID(resp.Kvs[0].Lease) != s.Lease() {
		t.Fatalf("keys in etcd while leading: got %v, want one of lease %x", resp.Kvs, s.Lease())
	}
	if err := e.Close(); err != nil {
		t.Fatalf("Close: got %v, want nil", err)
	}
	if err := e.IsLeader(ctx); !errors.Is(err, etcdlockgocron.ErrNotLeader) {
		t.Errorf("IsLeader after Close: got %v, want ErrNotLeader", err)
	}
	resp, err = judge.Get(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count != 0 {
		t.Errorf("keys in etcd after Close: got %d, want 0", resp.Count)
	}
	if err := e.Close(); err != nil {
		t.Errorf("second Close: got %v, want nil", err)
	}
}

func TestElectorInvalid(t *testing.T) {
	srv := etcdtest.Start(t)
	s, err := etcdlock.NewSession(srv.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := etcdlockgocron.NewElector(nil, "leader"); !errors.Is(err, etcdlockgocron.ErrInvalidArgument) {
		t.Errorf("nil session: got %v, want ErrInvalidArgument", err)
	}
	if _, err := etcdlockgocron.NewElector(s, ""); !errors.Is(err, etcdlockgocron.ErrInvalidArgument) {
		t.Errorf("empty name: got %v, want ErrInvalidArgument", err)
	}
}

// Without WithRenewal, the campaign ends with the Session: IsLeader then
// returns ErrNotLeader with the Session's error.
func TestElectorSessionEnded(t *testing.T) {
	srv := etcdtest.Start(t)
	s, err := etcdlock.NewSession(srv.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	e, err := etcdlockgocron.NewElector(s, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for err := e.IsLeader(ctx); !errors.Is(err, etcdlock.ErrSessionExpired); err = e.IsLeader(ctx) {
		if time.Now().After(deadline) {
			t.Fatalf("IsLeader 30 s after the Session's Close: got %v, want ErrNotLeader and ErrSessionExpired", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := e.IsLeader(ctx); !errors.Is(err, etcdlockgocron.ErrNotLeader) {
		t.Errorf("IsLeader: got %v, want ErrNotLeader", err)
	}
}
