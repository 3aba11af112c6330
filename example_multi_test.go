package etcdlock_test

import (
	"context"
	"fmt"
	"log"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
)

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
