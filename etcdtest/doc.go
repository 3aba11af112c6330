// Package etcdtest runs a real etcd inside the test process, for unit tests,
// in the manner of net/http/httptest.
//
// Start gives a single-member server, ready when it returns; StartCluster
// gives a cluster of n members that can be stopped, killed and restarted,
// or made to lag: Lag holds the raft messages sent to a member, which keeps
// serving reads and watches from its old state, until CatchUp.
// Both hand out clients, closed for you by tb.Cleanup, and clients whose
// traffic goes through a Proxy that can drop, delay or hold it. Everything is
// stopped when the test ends, clients first, so that goleak.VerifyTestMain
// stays clean. A test uses it like this; example_test.go runs this test,
// and others like it for ProxiedClient and StartCluster, as they are:
//
//	func TestExampleStart(t *testing.T) {
//		srv := etcdtest.Start(t) // stopped by t.Cleanup
//		cli := srv.Client(t)     // closed by t.Cleanup, before the server
//		if _, err := cli.Put(t.Context(), "greeting", "hello"); err != nil {
//			t.Fatalf("put: got %v, want nil", err)
//		}
//		resp, err := cli.Get(t.Context(), "greeting")
//		if err != nil {
//			t.Fatalf("get: got %v, want nil", err)
//		}
//		if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "hello" {
//			t.Fatalf("get: got %v, want greeting=hello", resp.Kvs)
//		}
//	}
//
// A package of many tests, most of them parallel, can share one server
// instead: Shared gives each test a Namespace, a client whose keys live
// under a prefix of the test's own (go.etcd.io/etcd/client/v3/namespace for
// KV, Watcher and Lease), so that parallel tests cannot see or disturb each
// other's keys; the test's keys are deleted and its leases revoked when it
// ends. The server starts with the first Shared call and stops after the
// tests, which the package's TestMain runs through Main:
//
//	func TestMain(m *testing.M) {
//		goleak.VerifyTestMain(etcdtest.Main(m))
//	}
//
//	func TestWorker(t *testing.T) {
//		t.Parallel()
//		cli := etcdtest.Shared(t).Client // keys under the test's own prefix
//		s, err := etcdlock.NewSession(cli)
//		...
//	}
//
// etcdlock's locks, Inspect and Lead work through such a client, with their
// keys under the prefix; from outside it (etcdlock holders, etcdctl) a lock
// called name is called Prefix+name. TestExampleShared in example_test.go
// shares the server between parallel subtests. 200 parallel tests that each take a lock run in
// about 1 s on one shared server and about 9 s with a server each (see
// docs/benchmarks.md).
//
// Any etcd: with the environment variable ETCDTEST_ENDPOINTS set to client
// URLs (and ETCDTEST_CACERT, ETCDTEST_CERT, ETCDTEST_KEY for TLS, as
// etcdctl's --cacert, --cert, --key), Start, New, StartCluster and Shared
// start nothing and use that etcd: a real cluster, another version, or one
// started by hand. Each Server and Cluster then hands out clients under a
// prefix of its own, which its Close deletes, as Shared does per test; a
// client the code under test makes from Endpoints is not under it. What
// only an embedded etcd can do skips the test, saying why: Cluster's Stop,
// Kill, Restart, Lag, CatchUp and Leader, StartCluster with more members
// than endpoints, WithFsync, and WithTLS without TLS in the environment.
// ProxiedClient works, since its proxies are the client's own.
//
//	ETCDTEST_ENDPOINTS=http://10.0.0.5:2379 go test ./...
//
// New starts a single-member server without a testing.TB, for Example
// functions and programs such as a demo; its caller calls Close, which stops
// etcd and removes its data. The package's Example functions use it.
//
// The members are tuned for tests: a 10 ms heartbeat and a 100 ms election
// timeout (leases may be as short as 1 s), no fsync unless WithFsync is
// given, bcrypt's lowest cost for passwords (so that a login with auth on
// is fast), and no logs unless WithLogger is given.
//
// A member's data costs about 8 MB of disk (of memory, where TMPDIR is a
// tmpfs) when it starts: two 4 MB write-ahead log segments, the one in use
// and a spare, and a 28 KB backend. Importing the package lowers etcd's
// process-wide segment size (wal.SegmentSizeBytes) from 64 MB, for every
// etcd in the test binary; with the default a member costs 128 MB.
//
// Importing the package lowers etcd's process-wide read timeout on
// connections between members (rafthttp.ConnReadTimeout) from 5 s to 250 ms,
// for every etcd in the test binary: with the default, stopped clusters leave
// connections and goroutines behind for up to 5 s.
//
// What it does not do: it never fakes etcd, it keeps no state between tests
// (except the keys of a Namespace until its test ends),
// and it gives no timing guarantee beyond "ready when Start returns".
package etcdtest
