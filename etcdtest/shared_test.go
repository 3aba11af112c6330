package etcdtest_test

import (
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock/etcdtest"
)

// TestSharedIsolation runs two parallel tests on the shared server, each
// writing the same key in its own namespace: neither reads, lists nor
// watches the other's.
func TestSharedIsolation(t *testing.T) {
	ready := make(chan struct{}, 2) // one per test, once it has written
	done := make(chan struct{})
	for _, val := range []string{"a", "b"} {
		t.Run(val, func(t *testing.T) {
			t.Parallel()
			ns := etcdtest.Shared(t)
			cli := ns.Client
			wch := cli.Watch(t.Context(), "", clientv3.WithPrefix())
			put(t, cli, "key", val)
			ready <- struct{}{}
			if val == "a" {
				<-ready
				<-ready // both have written
				close(done)
			} else {
				<-done
			}
			resp, err := cli.Get(t.Context(), "", clientv3.WithPrefix())
			if err != nil {
				t.Fatalf("get: got %v, want nil", err)
			}
			if len(resp.Kvs) != 1 || string(resp.Kvs[0].Key) != "key" || string(resp.Kvs[0].Value) != val {
				t.Fatalf("keys: got %v, want key=%s only", resp.Kvs, val)
			}
			// The watch saw this test's put and nothing else: a put
			// after the other test's ends the wait.
			put(t, cli, "end", "")
			var keys []string
			for len(keys) < 2 {
				wr := <-wch
				if err := wr.Err(); err != nil {
					t.Fatalf("watch: got %v, want nil", err)
				}
				for _, ev := range wr.Events {
					keys = append(keys, string(ev.Kv.Key)+"="+string(ev.Kv.Value))
				}
			}
			if len(keys) != 2 || keys[0] != "key="+val || keys[1] != "end=" {
				t.Fatalf("watch: got %v, want [key=%s end=]", keys, val)
			}
		})
	}
}

// TestSharedCleanup checks that a test's keys and leases are gone after it,
// and that keys outside its namespace stay.
func TestSharedCleanup(t *testing.T) {
	var ns *etcdtest.Namespace
	var lease clientv3.LeaseID
	t.Run("user", func(t *testing.T) {
		ns = etcdtest.Shared(t)
		grant, err := ns.Client.Grant(t.Context(), 60)
		if err != nil {
			t.Fatalf("grant: got %v, want nil", err)
		}
		lease = grant.ID
		put(t, ns.Client, "plain", "1")
		if _, err := ns.Client.Put(t.Context(), "leased", "1", clientv3.WithLease(lease)); err != nil {
			t.Fatalf("put: got %v, want nil", err)
		}
	})
	other := etcdtest.Shared(t)
	raw := rawClient(t, other)
	resp, err := raw.Get(t.Context(), ns.Prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatalf("get: got %v, want nil", err)
	}
	if resp.Count != 0 {
		t.Fatalf("keys under %s after the test: got %d, want 0", ns.Prefix, resp.Count)
	}
	ttl, err := raw.TimeToLive(t.Context(), lease)
	if err != nil {
		t.Fatalf("time to live: got %v, want nil", err)
	}
	if ttl.TTL != -1 {
		t.Fatalf("lease TTL after the test: got %d, want -1 (revoked)", ttl.TTL)
	}
}

// rawClient returns a client of ns's server outside any namespace.
func rawClient(t *testing.T, ns *etcdtest.Namespace) *clientv3.Client {
	t.Helper()
	raw, err := clientv3.New(clientv3.Config{Endpoints: ns.Client.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("client: got %v, want nil", err)
	}
	t.Cleanup(func() { raw.Close() })
	return raw
}

// TestSharedPrefixes checks that the namespaces' keys are stored under
// their prefixes, and that each prefix is its own.
func TestSharedPrefixes(t *testing.T) {
	a, b := etcdtest.Shared(t), etcdtest.Shared(t)
	if a.Prefix == b.Prefix {
		t.Fatalf("prefixes: got %q twice, want two", a.Prefix)
	}
	put(t, a.Client, "k", "v")
	if got := get(t, rawClient(t, a), a.Prefix+"k"); got != "v" {
		t.Fatalf("raw get %sk: got %q, want v", a.Prefix, got)
	}
	resp, err := b.Client.Get(t.Context(), "k")
	if err != nil {
		t.Fatalf("get: got %v, want nil", err)
	}
	if len(resp.Kvs) != 0 {
		t.Fatalf("get k in another namespace: got %v, want nothing", resp.Kvs)
	}
}

// TestSharedCloseWhileWatching closes a Namespace's client while other
// goroutines open watches on it, as a test closes the client of a process
// it makes crash while that process's Session opens a watch: with -race,
// the namespace package's Watch and Close (a WaitGroup's Add and Wait) are
// a data race unless the Namespace keeps them apart. Each goroutine's watch
// ends with the Close; the 50 it opens after end at once.
func TestSharedCloseWhileWatching(t *testing.T) {
	ns := etcdtest.Shared(t)
	ctx := t.Context()
	var wg sync.WaitGroup
	defer wg.Wait()
	for range 4 {
		wg.Go(func() {
			for range ns.Client.Watch(ctx, "key") {
			}
			for range 50 {
				for range ns.Client.Watch(ctx, "key") {
				}
			}
		})
	}
	time.Sleep(20 * time.Millisecond)
	if err := ns.Client.Close(); err != nil {
		t.Fatalf("close: got %v, want nil", err)
	}
}
