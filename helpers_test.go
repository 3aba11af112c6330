package etcdlock_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/goleak"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
)

func TestMain(m *testing.M) {
	holderMain() // a holder process of the process test (process_test.go), when run as one
	if os.Getenv(v3lockServerEnv) == "1" {
		runV3lockServer()
	}
	goleak.VerifyTestMain(m)
}

// testTimeout bounds every wait of a test: generous, since CI machines are
// shared and run with -race.
const testTimeout = 30 * time.Second

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// lockName returns a lock name of the test's own.
func lockName(t *testing.T) string {
	return "test/" + strings.ReplaceAll(t.Name(), "/", "_")
}

// newSession makes a Session on client, closed by t.Cleanup.
func newSession(t *testing.T, client *clientv3.Client, opts ...etcdlock.SessionOption) *etcdlock.Session {
	t.Helper()
	s, err := etcdlock.NewSession(client, opts...)
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// newUpstreamSession makes a concurrency.Session on client, closed by
// t.Cleanup.
func newUpstreamSession(t *testing.T, client *clientv3.Client, ttl int) *concurrency.Session {
	t.Helper()
	s, err := concurrency.NewSession(client, concurrency.WithTTL(ttl))
	if err != nil {
		t.Fatalf("concurrency.NewSession: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// lockKeys returns the keys under the lock's prefix, oldest first.
func lockKeys(t *testing.T, client *clientv3.Client, name string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	resp, err := client.Get(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		t.Fatalf("get keys of %q: %v", name, err)
	}
	keys := make([]string, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		keys = append(keys, string(kv.Key))
	}
	return keys
}

// keyOf returns the key a Session's lease uses for the lock name.
func keyOf(name string, lease clientv3.LeaseID) string {
	return fmt.Sprintf("%s/%x", name, lease)
}

// revision returns etcd's current revision.
func revision(t *testing.T, client *clientv3.Client) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	resp, err := client.Get(ctx, "\x00")
	if err != nil {
		t.Fatalf("get revision: %v", err)
	}
	return resp.Header.Revision
}

// startServer starts an embedded etcd and returns a client of it.
func startServer(t *testing.T) (*etcdtest.Server, *clientv3.Client) {
	t.Helper()
	srv := etcdtest.Start(t)
	return srv, srv.Client(t)
}

// eventually polls cond until it holds or the test timeout passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// result runs f in a goroutine and returns a channel with its error.
func result(f func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}

// waitErr waits for an error from ch, failing the test after testTimeout.
func waitErr(t *testing.T, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(testTimeout):
		t.Fatalf("timed out waiting for a call to return")
		return nil
	}
}

// blocked reports whether nothing arrives on ch within d: the call is still
// waiting. A short d only makes the check weaker, never flaky.
func blocked(ch <-chan error, d time.Duration) bool {
	select {
	case <-ch:
		return false
	case <-time.After(d):
		return true
	}
}
