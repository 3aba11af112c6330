package etcdlock_test

import (
	"context"
	"fmt"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
)

// startExampleServer starts an in-process etcd for the examples. In your
// code, connect to your own etcd instead.
func startExampleServer() (*etcdtest.Server, *clientv3.Client) {
	srv, err := etcdtest.New()
	if err != nil {
		log.Fatal(err)
	}
	client, err := srv.NewClient()
	if err != nil {
		log.Fatal(err)
	}
	return srv, client
}

func Example() {
	srv, client := startExampleServer()
	defer srv.Close()

	// One Session (one lease, kept alive) per process, shared by all locks.
	s, err := etcdlock.NewSession(client, etcdlock.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	m := etcdlock.NewMutex(s, "jobs/nightly")
	ctx := context.Background()
	if err := m.LockContext(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("held, token > 0:", m.Token() > 0)

	// Reentrant: the holding goroutine may lock again; each lock needs an unlock.
	m.Lock()
	fmt.Println("hold count:", m.HoldCount())
	m.Unlock()

	if err := m.UnlockContext(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("held after unlock:", m.HoldCount() > 0)
	// Output:
	// held, token > 0: true
	// hold count: 2
	// held after unlock: false
}

func ExampleMutex_TryLock() {
	srv, client := startExampleServer()
	defer srv.Close()
	a, _ := etcdlock.NewSession(client)
	defer a.Close()
	b, _ := etcdlock.NewSession(client)
	defer b.Close()

	held := etcdlock.NewMutex(a, "reports")
	held.Lock()
	defer held.Unlock()

	// A path that must not block: skip the work if another process has it.
	if m := etcdlock.NewMutex(b, "reports"); m.TryLock() {
		defer m.Unlock()
		fmt.Println("working")
	} else {
		fmt.Println("busy, skipping")
	}
	// Output: busy, skipping
}

func ExampleMutex_TryLockFor() {
	srv, client := startExampleServer()
	defer srv.Close()
	a, _ := etcdlock.NewSession(client)
	defer a.Close()
	b, _ := etcdlock.NewSession(client)
	defer b.Close()

	held := etcdlock.NewMutex(a, "migrations")
	held.Lock()
	defer held.Unlock()

	ok, err := etcdlock.NewMutex(b, "migrations").TryLockFor(context.Background(), 100*time.Millisecond)
	fmt.Println(ok, err)
	// Output: false <nil>
}

// Fencing a write to etcd: the Txn only applies while this hold owns the lock.
func ExampleMutex_IsOwner() {
	srv, client := startExampleServer()
	defer srv.Close()
	s, _ := etcdlock.NewSession(client)
	defer s.Close()

	m := etcdlock.NewMutex(s, "config")
	m.Lock()
	guard := m.IsOwner()
	resp, err := client.Txn(context.Background()).If(guard).Then(clientv3.OpPut("config/value", "1")).Commit()
	fmt.Println("while held:", err == nil && resp.Succeeded)
	m.Unlock()

	resp, err = client.Txn(context.Background()).If(guard).Then(clientv3.OpPut("config/value", "2")).Commit()
	fmt.Println("after unlock:", err == nil && resp.Succeeded)
	// Output:
	// while held: true
	// after unlock: false
}

// Fencing a resource outside etcd: it keeps the highest token it has seen and
// rejects lower ones.
func ExampleMutex_Token() {
	srv, client := startExampleServer()
	defer srv.Close()
	s1, _ := etcdlock.NewSession(client)
	defer s1.Close()
	s2, _ := etcdlock.NewSession(client)
	defer s2.Close()

	var highest int64
	write := func(token int64) bool {
		if token < highest {
			return false // a stale holder
		}
		highest = token
		return true
	}

	first := etcdlock.NewMutex(s1, "ledger")
	first.Lock()
	stale := first.Token()
	first.Unlock()

	second := etcdlock.NewMutex(s2, "ledger")
	second.Lock()
	defer second.Unlock()
	fmt.Println("new holder writes:", write(second.Token()))
	fmt.Println("old holder writes:", write(stale))
	// Output:
	// new holder writes: true
	// old holder writes: false
}

func ExampleMultiMutex() {
	srv, client := startExampleServer()
	defer srv.Close()
	s, err := etcdlock.NewSession(client)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()

	// A transfer needs both accounts. Another process that asks for them in
	// the other order cannot deadlock with this one: one Txn enters both
	// queues at one revision.
	m := etcdlock.NewMultiMutex(s, "accounts/bob", "accounts/alice")
	if err := m.LockContext(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("held:", m.Names())

	// Each name's key is the one its Mutex would have: a Mutex (or
	// etcdctl lock) of either name waits for this hold. They share the token.
	alice, _ := client.Get(ctx, "accounts/alice/", clientv3.WithPrefix())
	bob, _ := client.Get(ctx, "accounts/bob/", clientv3.WithPrefix())
	fmt.Println("one token:", alice.Kvs[0].CreateRevision == m.Token() && bob.Kvs[0].CreateRevision == m.Token())

	if err := m.UnlockContext(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("token after unlock:", m.Token())
	// Output:
	// held: [accounts/alice accounts/bob]
	// one token: true
	// token after unlock: 0
}
