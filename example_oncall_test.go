package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/etcdlock/etcdlock"
)

// An operator breaks a stuck lock: the holder's Done closes, its unlock
// reports the loss, and the next in the queue holds.
func ExampleRelease() {
	srv, client := startExampleServer()
	defer srv.Close()
	ctx := context.Background()
	stuck, _ := etcdlock.NewSession(client)
	defer stuck.Close()
	m := etcdlock.NewMutex(stuck, "jobs/nightly")
	m.Lock()
	done := m.Done()

	// On call: see who holds, and release that key (its token fences it).
	entries, err := etcdlock.Inspect(ctx, client, "jobs/nightly")
	if err != nil {
		log.Fatal(err)
	}
	if err := etcdlock.Release(ctx, client, "jobs/nightly", entries[0]); err != nil {
		log.Fatal(err)
	}
	<-done
	fmt.Println("holder told: Done closed")
	fmt.Println("holder's unlock:", m.UnlockContext(ctx))
	fmt.Println("releasing again:", errors.Is(etcdlock.Release(ctx, client, "jobs/nightly", entries[0]), etcdlock.ErrNotHeld))
	// Output:
	// holder told: Done closed
	// holder's unlock: etcdlock: lock lost
	// releasing again: true
}

// A hold capped at 200 ms ends even though its holder never unlocks: Done
// closes first, then the key is deleted.
func ExampleWithMaxHold() {
	srv, client := startExampleServer()
	defer srv.Close()
	ctx := context.Background()
	s, _ := etcdlock.NewSession(client, etcdlock.WithMaxHold(200*time.Millisecond))
	defer s.Close()
	m := etcdlock.NewMutex(s, "reports")
	m.Lock()
	<-m.Done()
	fmt.Println("hold ended at its cap")
	fmt.Println("unlock:", m.UnlockContext(ctx))
	// Output:
	// hold ended at its cap
	// unlock: etcdlock: lock lost
}

// A holder learns that another process waits, and yields.
func ExampleHold_Waiting() {
	srv, client := startExampleServer()
	defer srv.Close()
	ctx := context.Background()
	a, _ := etcdlock.NewSession(client)
	defer a.Close()
	b, _ := etcdlock.NewSession(client)
	defer b.Close()

	m := etcdlock.NewMutex(a, "batch")
	m.Lock()
	h, _ := m.Held()
	other := make(chan error, 1)
	go func() { other <- etcdlock.NewMutex(b, "batch").LockContext(ctx) }()

	select {
	case <-h.Waiting():
		fmt.Println("someone waits: yielding")
	case <-h.Done():
		fmt.Println("lost")
	}
	m.Unlock()
	fmt.Println("the other holds:", <-other == nil)
	// Output:
	// someone waits: yielding
	// the other holds: true
}

// A liveness probe on the Session's lease.
func ExampleSession_HealthHandler() {
	srv, client := startExampleServer()
	defer srv.Close()
	s, _ := etcdlock.NewSession(client)
	mux := http.NewServeMux() // the service's probe server
	mux.Handle("/healthz/etcdlock", s.HealthHandler())

	probe := func() int {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz/etcdlock", nil))
		return rec.Code
	}
	fmt.Println(probe(), s.Health() == nil)
	s.Close()
	fmt.Println(probe(), errors.Is(s.Health(), etcdlock.ErrSessionExpired))
	// Output:
	// 200 true
	// 503 true
}

// A leader reports progress; a duty that stops reporting gives up the lead.
func ExampleWithWatchdog() {
	srv, client := startExampleServer()
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	terms := 0
	err := etcdlock.Lead(ctx, client, "scheduler", func(ctx context.Context) error {
		terms++
		if terms == 2 {
			fmt.Println("leading again")
			cancel()
			return nil
		}
		for range 3 {
			etcdlock.Progress(ctx) // a loop of work reports each round
			time.Sleep(50 * time.Millisecond)
		}
		<-ctx.Done() // stuck: the watchdog cancels the duty
		fmt.Println("duty cancelled by the watchdog")
		return nil
	}, etcdlock.WithTTL(5*time.Second), etcdlock.WithWatchdog(200*time.Millisecond))
	fmt.Println(errors.Is(err, context.Canceled))
	// Output:
	// duty cancelled by the watchdog
	// leading again
	// true
}

// A holder crashes (its lease revoked, as etcd does when it expires): the
// next holder waits the lock-delay before its acquisition returns; after a
// clean unlock it would return at once.
func ExampleWithLockDelay() {
	srv, client := startExampleServer()
	defer srv.Close()
	ctx := context.Background()
	crashed, _ := etcdlock.NewSession(client)
	defer crashed.Close()
	etcdlock.NewMutex(crashed, "payments").Lock()

	s, _ := etcdlock.NewSession(client, etcdlock.WithLockDelay(300*time.Millisecond))
	defer s.Close()
	m := etcdlock.NewMutex(s, "payments")
	locked := make(chan time.Time, 1)
	go func() {
		if err := m.LockContext(ctx); err != nil {
			log.Fatal(err)
		}
		at := time.Now()
		m.Unlock()
		locked <- at
	}()
	for {
		if e, _ := etcdlock.Inspect(ctx, client, "payments"); len(e) == 2 {
			break // queued behind the holder
		}
		time.Sleep(10 * time.Millisecond)
	}
	crash := time.Now()
	client.Revoke(ctx, crashed.Lease())
	fmt.Println("held after the delay:", (<-locked).Sub(crash) >= 300*time.Millisecond)
	// Output:
	// held after the delay: true
}
