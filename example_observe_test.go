package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"sync"

	"github.com/etcdlock/etcdlock"
)

func ExampleWithObserver() {
	srv, client := startExampleServer()
	defer srv.Close()

	// An Observer gets every event of the Session, in order, off the lock's
	// path: here the kinds of one lock's, as an adapter for metrics or
	// traces would take them (etcdlock/prometheus, etcdlock/otel).
	var mu sync.Mutex
	var seen []string
	observe := etcdlock.ObserverFunc(func(e etcdlock.Event) {
		if e.Kind == etcdlock.KeptAlive { // one per renewal, when the lease says
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if e.Outcome != "" {
			seen = append(seen, fmt.Sprintf("%s %s", e.Kind, e.Outcome))
			return
		}
		seen = append(seen, string(e.Kind))
	})
	s, err := etcdlock.NewSession(client, etcdlock.WithObserver(observe))
	if err != nil {
		log.Fatal(err)
	}
	m := etcdlock.NewMutex(s, "jobs/report")
	m.Lock()
	fmt.Println("held:", m.Token() > 0)
	m.Unlock()
	s.Close() // delivers the events still queued, then SessionClosed

	mu.Lock()
	defer mu.Unlock()
	for _, e := range seen {
		fmt.Println(e)
	}
	// Output:
	// held: true
	// acquire_started
	// acquire_ended acquired
	// hold_ended
	// released
	// session_closed
}

func ExampleWithLogger() {
	srv, client := startExampleServer()
	defer srv.Close()

	// At Info, the log has what needs attention. Here the time, the key
	// and the token are left out, so that the output is the same each run.
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		Level: slog.LevelInfo,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			switch a.Key {
			case slog.TimeKey, "key", "token":
				return slog.Attr{}
			}
			return a
		},
	}))
	s, err := etcdlock.NewSession(client, etcdlock.WithLogger(logger))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	ctx := context.Background()
	m := etcdlock.NewMutex(s, "jobs/report")
	if err := m.LockContext(ctx); err != nil {
		log.Fatal(err)
	}
	done := m.Done()
	// Someone deletes the lock's key, as `etcdctl del` would.
	if _, err := client.Delete(ctx, m.Key()); err != nil {
		log.Fatal(err)
	}
	<-done
	err = m.UnlockContext(ctx)
	s.Close() // delivers the events still queued
	fmt.Println("unlock:", errors.Is(err, etcdlock.ErrLockLost))
	// Output:
	// level=WARN msg="etcdlock: hold lost" lock=jobs/report primitive=mutex reason=key_deleted
	// level=WARN msg="etcdlock: released a hold already lost" lock=jobs/report primitive=mutex
	// unlock: true
}
