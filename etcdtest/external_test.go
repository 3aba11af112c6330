package etcdtest_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock/etcdtest"
)

// TestExternal runs TestExternalChild in a child process pointed at this
// test's server by ETCDTEST_ENDPOINTS, then checks that the child left no
// key behind.
func TestExternal(t *testing.T) {
	if os.Getenv(etcdtest.EnvEndpoints) != "" {
		t.Skip("runs its own external etcd")
	}
	srv := etcdtest.Start(t)
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestExternalChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), etcdtest.EnvEndpoints+"="+srv.Endpoints()[0], externalChild+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: got %v, want nil\n%s", err, out)
	}
	for _, want := range []string{"--- PASS: TestExternalChild", "Cluster.Kill needs an embedded etcd", "needs 3 endpoints", "WithFsync"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("child output: got\n%s\nwant %q in it", out, want)
		}
	}
	resp, err := srv.Client(t).Get(t.Context(), "", clientv3.WithFromKey(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatalf("get: got %v, want nil", err)
	}
	if resp.Count != 0 {
		t.Fatalf("keys left by the child: got %d, want 0", resp.Count)
	}
}

// externalChild marks the child process of TestExternal, which has its
// etcd to itself.
const externalChild = "ETCDTEST_EXTERNAL_CHILD"

// TestExternalChild is run by TestExternal, with ETCDTEST_ENDPOINTS set.
func TestExternalChild(t *testing.T) {
	eps := os.Getenv(etcdtest.EnvEndpoints)
	if eps == "" || os.Getenv(externalChild) != "1" {
		t.Skip("run by TestExternal, on an etcd of its own")
	}
	var prefix string
	t.Run("Start", func(t *testing.T) {
		srv := etcdtest.Start(t)
		if got := srv.Endpoints(); len(got) != 1 || got[0] != eps {
			t.Fatalf("endpoints: got %v, want [%s]", got, eps)
		}
		put(t, srv.Client(t), "k", "v")
		raw := singleClient(t, eps, nil)
		resp, err := raw.Get(t.Context(), "etcdtest/", clientv3.WithPrefix())
		if err != nil || len(resp.Kvs) != 1 || !strings.HasSuffix(string(resp.Kvs[0].Key), "/k") {
			t.Fatalf("raw keys: got %v (%v), want one etcdtest/.../k", resp, err)
		}
		prefix = strings.TrimSuffix(string(resp.Kvs[0].Key), "k")
	})
	raw := singleClient(t, eps, nil)
	resp, err := raw.Get(t.Context(), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Fatalf("keys under %s after Close: got %v (%v), want none", prefix, resp, err)
	}
	t.Run("Shared", func(t *testing.T) {
		put(t, etcdtest.Shared(t).Client, "k", "v")
	})
	t.Run("Kill", func(t *testing.T) {
		c := etcdtest.StartCluster(t, 1)
		put(t, c.Client(t), "k", "v")
		c.Kill(0)
		t.Fatal("Kill on an external etcd: got no skip, want one")
	})
	t.Run("ThreeMembers", func(t *testing.T) {
		etcdtest.StartCluster(t, 3)
		t.Fatal("StartCluster(3) on one endpoint: got no skip, want one")
	})
	t.Run("Fsync", func(t *testing.T) {
		etcdtest.Start(t, etcdtest.WithFsync())
		t.Fatal("WithFsync on an external etcd: got no skip, want one")
	})
}
