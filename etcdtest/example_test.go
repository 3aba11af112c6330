package etcdtest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// The Example functions use New, as a program without a testing.TB does.
// The TestExample functions show Start and StartCluster as a test uses them,
// with its own *testing.T: copy them as they are.

func ExampleNew() {
	srv, err := etcdtest.New()
	if err != nil {
		fmt.Println("new:", err)
		return
	}
	defer srv.Close() // stops etcd and removes its data

	cli, err := srv.NewClient() // closed by srv.Close
	if err != nil {
		fmt.Println("client:", err)
		return
	}
	ctx := context.Background()
	if _, err := cli.Put(ctx, "greeting", "hello"); err != nil {
		fmt.Println("put:", err)
		return
	}
	resp, err := cli.Get(ctx, "greeting")
	if err != nil {
		fmt.Println("get:", err)
		return
	}
	fmt.Printf("%s\n", resp.Kvs[0].Value)
	// Output: hello
}

// A client of your own, such as one your code under test makes, gets the
// server's TLS config from TLS.
func ExampleServer_TLS() {
	srv, err := etcdtest.New(etcdtest.WithClientCertAuth())
	if err != nil {
		fmt.Println("new:", err)
		return
	}
	defer srv.Close()
	fmt.Println(strings.HasPrefix(srv.Endpoints()[0], "https://"))

	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   srv.Endpoints(),
		TLS:         srv.TLS().Config,
		DialTimeout: 5 * time.Second,
	})
	if err != nil {
		fmt.Println("client:", err)
		return
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		fmt.Println("put:", err)
		return
	}
	fmt.Println("put over TLS with a client certificate")
	// Output:
	// true
	// put over TLS with a client certificate
}

// TestExampleStart is the test shown in the package documentation.
func TestExampleStart(t *testing.T) {
	srv := etcdtest.Start(t) // stopped by t.Cleanup
	cli := srv.Client(t)     // closed by t.Cleanup, before the server
	if _, err := cli.Put(t.Context(), "greeting", "hello"); err != nil {
		t.Fatalf("put: got %v, want nil", err)
	}
	resp, err := cli.Get(t.Context(), "greeting")
	if err != nil {
		t.Fatalf("get: got %v, want nil", err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "hello" {
		t.Fatalf("get: got %v, want greeting=hello", resp.Kvs)
	}
}

func TestExampleProxiedClient(t *testing.T) {
	testflags.Parallel(t)
	srv := etcdtest.Start(t)
	cli, proxy := srv.ProxiedClient(t)

	proxy.Blackhole()
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	_, err := cli.Get(ctx, "k")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("get while blackholed: got %v, want %v", err, context.DeadlineExceeded)
	}

	proxy.Unblackhole()
	ctx, cancel = context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := cli.Get(ctx, "k"); err != nil {
		t.Fatalf("get after Unblackhole: got %v, want nil", err)
	}
}

func TestExampleStartCluster(t *testing.T) {
	cluster := etcdtest.StartCluster(t, 3)
	cli := cluster.Client(t)

	leader := cluster.Leader()
	cluster.Stop(leader)
	if next := cluster.Leader(); next < 0 || next == leader {
		t.Fatalf("leader after Stop(%d): got %d, want another member", leader, next)
	}

	// clientv3 retries reads that fail because a member stopped; writes
	// would need retrying by the caller.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := cli.Get(ctx, "k"); err != nil {
		t.Fatalf("get after Stop(%d): got %v, want nil", leader, err)
	}
	cluster.Restart(leader)
}

// TestExampleShared shares the package's server between parallel subtests,
// each with its own namespace: both write "greeting" and read their own.
// The package's TestMain runs the tests through etcdtest.Main.
func TestExampleShared(t *testing.T) {
	for _, greeting := range []string{"hello", "bonjour"} {
		t.Run(greeting, func(t *testing.T) {
			t.Parallel()
			cli := etcdtest.Shared(t).Client // keys under the subtest's own prefix
			if _, err := cli.Put(t.Context(), "greeting", greeting); err != nil {
				t.Fatalf("put: got %v, want nil", err)
			}
			resp, err := cli.Get(t.Context(), "greeting")
			if err != nil {
				t.Fatalf("get: got %v, want nil", err)
			}
			if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != greeting {
				t.Fatalf("get: got %v, want greeting=%s", resp.Kvs, greeting)
			}
		})
	}
}
