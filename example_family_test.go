package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
)

func ExampleRWMutex() {
	srv, client := startExampleServer()
	defer srv.Close()
	readers, _ := etcdlock.NewSession(client)
	defer readers.Close()
	writers, _ := etcdlock.NewSession(client)
	defer writers.Close()

	config := etcdlock.NewRWMutex(readers, "config")
	config.RLock() // many readers may hold at once
	fmt.Println("reading")

	w := etcdlock.NewRWMutex(writers, "config")
	fmt.Println("writer while reading:", w.TryLock())
	config.RUnlock()

	fmt.Println("writer after the reader left:", w.TryLock())
	w.Unlock()
	// Output:
	// reading
	// writer while reading: false
	// writer after the reader left: true
}

func ExampleRWMutex_TryRLockFor() {
	srv, client := startExampleServer()
	defer srv.Close()
	a, _ := etcdlock.NewSession(client)
	defer a.Close()
	b, _ := etcdlock.NewSession(client)
	defer b.Close()

	// A writer holds the configuration until told to let go. It unlocks
	// on the goroutine that locked: holds belong to goroutines.
	writer := etcdlock.NewRWMutex(a, "config")
	locked, letGo, unlocked := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(unlocked)
		writer.Lock()
		close(locked)
		<-letGo
		time.Sleep(50 * time.Millisecond)
		writer.Unlock()
	}()
	<-locked

	// A reader that must not block for long waits up to a bound.
	reader := etcdlock.NewRWMutex(b, "config")
	ctx := context.Background()
	ok, err := reader.TryRLockFor(ctx, 50*time.Millisecond)
	fmt.Println("within 50 ms:", ok, err)
	close(letGo)
	ok, err = reader.TryRLockFor(ctx, 10*time.Second)
	fmt.Println("within 10 s:", ok, err)
	if ok {
		reader.RUnlock()
	}
	<-unlocked
	// Output:
	// within 50 ms: false <nil>
	// within 10 s: true <nil>
}

func ExampleSemaphore() {
	srv, client := startExampleServer()
	defer srv.Close()
	s, _ := etcdlock.NewSession(client)
	defer s.Close()
	ctx := context.Background()

	// At most 2 exports at a time, across every process.
	exports := etcdlock.NewSemaphore(s, "exports", 2)
	a, err := exports.Acquire(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer a.Release(ctx)
	b, err := exports.Acquire(ctx)
	if err != nil {
		log.Fatal(err)
	}

	if _, err := exports.TryAcquire(ctx, 0); errors.Is(err, etcdlock.ErrNoPermit) {
		fmt.Println("third export: no permit")
	}
	if err := b.Release(ctx); err != nil {
		log.Fatal(err)
	}
	c, err := exports.TryAcquire(ctx, time.Second)
	fmt.Println("third export after a release:", err == nil)
	defer c.Release(ctx)
	// Output:
	// third export: no permit
	// third export after a release: true
}

func ExampleSemaphore_AcquireN() {
	srv, client := startExampleServer()
	defer srv.Close()
	s, _ := etcdlock.NewSession(client)
	defer s.Close()
	ctx := context.Background()

	// 8 GiB of memory for the builds of every machine, in 1 GiB permits.
	memory := etcdlock.NewSemaphore(s, "build-memory", 8)
	small, err := memory.AcquireN(ctx, 3)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("small build holds", small.Weight(), "GiB")
	if _, err := memory.TryAcquireN(ctx, 6, 0); errors.Is(err, etcdlock.ErrNoPermit) {
		fmt.Println("large build: 6 GiB are not free")
	}
	if err := small.Release(ctx); err != nil {
		log.Fatal(err)
	}
	large, err := memory.AcquireN(ctx, 6)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("large build holds", large.Weight(), "GiB")
	defer large.Release(ctx)
	// Output:
	// small build holds 3 GiB
	// large build: 6 GiB are not free
	// large build holds 6 GiB
}

func ExampleSetLimit() {
	srv, client := startExampleServer()
	defer srv.Close()
	s, _ := etcdlock.NewSession(client)
	defer s.Close()
	ctx := context.Background()

	exports := etcdlock.NewSemaphore(s, "exports", 2)
	a, _ := exports.Acquire(ctx)
	b, _ := exports.Acquire(ctx)

	// The database is struggling: one export at a time, from now on.
	// The two running keep their permits; new ones wait for both.
	if err := etcdlock.SetLimit(ctx, client, "exports", 1); err != nil {
		log.Fatal(err)
	}
	limit, _ := etcdlock.ReadLimit(ctx, client, "exports")
	fmt.Println("limit:", limit)
	if _, err := exports.TryAcquire(ctx, 0); errors.Is(err, etcdlock.ErrNoPermit) {
		fmt.Println("a third export waits")
	}
	_ = a.Release(ctx)
	if _, err := exports.TryAcquire(ctx, 0); errors.Is(err, etcdlock.ErrNoPermit) {
		fmt.Println("and still waits with one running")
	}
	_ = b.Release(ctx)
	c, err := exports.TryAcquire(ctx, 0)
	fmt.Println("then runs:", err == nil)
	defer c.Release(ctx)
	// Output:
	// limit: 1
	// a third export waits
	// and still waits with one running
	// then runs: true
}

func ExampleMutex_Do() {
	srv, client := startExampleServer()
	defer srv.Close()
	s, _ := etcdlock.NewSession(client)
	defer s.Close()

	m := etcdlock.NewMutex(s, "migrations")
	err := m.Do(context.Background(), func(ctx context.Context) error {
		// ctx is cancelled if the lock is lost, or about to be: stop then.
		h, _ := etcdlock.HoldFrom(ctx)
		fmt.Println("migrating; fencing token > 0:", h.Token > 0)

		// Goroutines started here with ctx share the hold: no deadlock.
		if err := m.LockContext(ctx); err != nil {
			return err
		}
		return m.UnlockContext(ctx)
	})
	fmt.Println("done:", err)
	// Output:
	// migrating; fencing token > 0: true
	// done: <nil>
}

func ExampleLead() {
	srv, client := startExampleServer()
	defer srv.Close()

	ctx, stop := context.WithCancel(context.Background())
	// Every replica runs Lead; one at a time runs the duty. When the
	// leader dies or is cut off, a backup takes over.
	err := etcdlock.Lead(ctx, client, "cron/leader", func(ctx context.Context) error {
		fmt.Println("leading")
		// Publish the leader's address with the hold's lease, fenced: the
		// key goes with the leader, and a deposed one cannot write it.
		h, _ := etcdlock.HoldFrom(ctx)
		resp, err := client.Txn(ctx).If(h.IsOwner()).
			Then(clientv3.OpPut("cron/leader-addr", "10.0.0.1:8080", clientv3.WithLease(h.Lease))).Commit()
		if err != nil {
			// A transient failure must not end Lead (an error from f
			// does): log it and return nil, and Lead campaigns again.
			log.Printf("publish: %v; campaigning again", err)
			return nil
		}
		fmt.Println("published:", resp.Succeeded)
		stop() // here, to end the example: a real duty runs until ctx is cancelled
		<-ctx.Done()
		return nil
	}, etcdlock.WithTTL(10*time.Second), etcdlock.WithIdentity("replica-1"))
	fmt.Println("Lead returned:", err)
	// Output:
	// leading
	// published: true
	// Lead returned: context canceled
}

func ExampleInspect() {
	srv, client := startExampleServer()
	defer srv.Close()
	ctx := context.Background()
	a, _ := etcdlock.NewSession(client, etcdlock.WithIdentity("host-a pid 10"))
	defer a.Close()
	b, _ := etcdlock.NewSession(client, etcdlock.WithIdentity("host-b pid 20"))
	defer b.Close()

	held := etcdlock.NewMutex(a, "jobs/nightly")
	held.Lock()
	defer held.Unlock()
	waiting, cancel := context.WithCancel(ctx)
	defer cancel()
	go etcdlock.NewMutex(b, "jobs/nightly").LockContext(waiting)

	for {
		entries, err := etcdlock.Inspect(ctx, client, "jobs/nightly")
		if err != nil {
			log.Fatal(err)
		}
		if len(entries) < 2 {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		for _, e := range entries {
			fmt.Printf("%s holds=%v %q\n", e.Kind, e.Holds, e.Identity)
		}
		return
	}
	// Output:
	// mutex holds=true "host-a pid 10"
	// mutex holds=false "host-b pid 20"
}
