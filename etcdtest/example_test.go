package etcdtest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/etcdlock/etcdlock/etcdtest"
)

// In a test, pass t; an Example has no testing.TB, so these use a stand-in
// that runs the cleanups when the example returns.

func ExampleStart() {
	t := &scopedTB{} // in a test, the test's *testing.T
	defer t.cleanup()

	srv := etcdtest.Start(t)
	cli := srv.Client(t)

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

func ExampleWithTLS() {
	t := &scopedTB{} // in a test, the test's *testing.T
	defer t.cleanup()

	srv := etcdtest.Start(t, etcdtest.WithClientCertAuth())
	fmt.Println(strings.HasPrefix(srv.Endpoints()[0], "https://"))

	if _, err := srv.Client(t).Put(context.Background(), "k", "v"); err != nil {
		fmt.Println("put:", err)
		return
	}
	fmt.Println("put over TLS with a client certificate")
	// Output:
	// true
	// put over TLS with a client certificate
}

func ExampleServer_ProxiedClient() {
	t := &scopedTB{} // in a test, the test's *testing.T
	defer t.cleanup()

	srv := etcdtest.Start(t)
	cli, proxy := srv.ProxiedClient(t)

	proxy.Blackhole()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := cli.Get(ctx, "k")
	cancel()
	fmt.Println(errors.Is(err, context.DeadlineExceeded))

	proxy.Unblackhole()
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	_, err = cli.Get(ctx, "k")
	cancel()
	fmt.Println(err)
	// Output:
	// true
	// <nil>
}

func ExampleStartCluster() {
	t := &scopedTB{} // in a test, the test's *testing.T
	defer t.cleanup()

	cluster := etcdtest.StartCluster(t, 3)
	cli := cluster.Client(t)

	leader := cluster.Leader()
	cluster.Stop(leader)
	next := cluster.Leader()
	fmt.Println("new leader:", next >= 0 && next != leader)

	// clientv3 retries reads that fail because a member stopped; writes
	// would need retrying by the caller.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Get(ctx, "k"); err != nil {
		fmt.Println("get:", err)
		return
	}
	cluster.Restart(leader)
	fmt.Println("members:", cluster.Members())
	// Output:
	// new leader: true
	// members: 3
}
