package main

import (
	"context"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock/etcdtest"
)

func checkDemoOutput(t *testing.T, r result) {
	t.Helper()
	r.want(t, 0)
	if n := strings.Count(r.stdout, "\nPASS  "); n < 8 || strings.Contains(r.stdout, "FAIL") {
		t.Fatalf("got %d PASS lines and FAIL %v, want every check passed:\n%s", n, strings.Contains(r.stdout, "FAIL"), r.stdout)
	}
	t.Logf("demo took %v:\n%s", r.took, r.stdout)
}

func TestDemo(t *testing.T) {
	checkDemoOutput(t, runCLI(t, nil, "demo"))
}

func TestDemoExternalEtcd(t *testing.T) {
	srv := etcdtest.Start(t)
	checkDemoOutput(t, runCLI(t, nil, "demo", "--endpoints", srv.Endpoints()[0], "--workers", "5", "--rounds", "3"))
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	resp, err := srv.Client(t).Get(ctx, "etcdlock-demo/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count != 0 {
		t.Fatalf("keys left under etcdlock-demo/: got %d, want 0", resp.Count)
	}
}
