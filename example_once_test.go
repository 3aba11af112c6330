package etcdlock_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/etcdlock/etcdlock"
)

// A nightly job on two nodes: each names the night's slot, from the
// schedule, not from its clock; the job runs once, and the node that comes
// second skips it.
func ExampleMutex_DoOnce() {
	srv, client := startExampleServer()
	defer srv.Close()

	ctx := context.Background()
	for _, node := range []string{"node-a", "node-b"} {
		s, err := etcdlock.NewSession(client, etcdlock.WithIdentity(node))
		if err != nil {
			log.Fatal(err)
		}
		m := etcdlock.NewMutex(s, "jobs/nightly")
		got, err := m.DoOnce(ctx, "2026-11-26T03:00", 7*24*time.Hour, func(ctx context.Context) error {
			fmt.Println(node, "runs the nightly job")
			return nil
		})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(node+":", got)
		_ = s.Close()
	}

	// A crontab run that finds the job under way skips it.
	s, err := etcdlock.NewSession(client)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	holder := etcdlock.NewMutex(s, "jobs/hourly")
	if err := holder.LockContext(ctx); err != nil {
		log.Fatal(err)
	}
	other, err := etcdlock.NewSession(client)
	if err != nil {
		log.Fatal(err)
	}
	defer other.Close()
	got, err := etcdlock.NewMutex(other, "jobs/hourly").TryDoOnce(ctx, "2026-11-26T04:00", time.Hour, 0, func(ctx context.Context) error {
		fmt.Println("never printed")
		return nil
	})
	fmt.Println("hourly:", got, err)
	// Output:
	// node-a runs the nightly job
	// node-a: ran
	// node-b: skipped: done
	// hourly: skipped: busy <nil>
}
