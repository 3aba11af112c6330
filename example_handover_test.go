package etcdlock_test

import (
	"context"
	"fmt"
	"time"

	"github.com/etcdlock/etcdlock"
)

func ExampleStepDown() {
	srv, client := startExampleServer()
	defer srv.Close()

	ctx, stop := context.WithCancel(context.Background())
	err := etcdlock.Lead(ctx, client, "reports/leader", func(ctx context.Context) error {
		term, _ := etcdlock.TermFrom(ctx)
		fmt.Println("leading, term", term)
		if term == 2 {
			stop() // here, to end the example
			<-ctx.Done()
			return nil
		}
		// Going into maintenance: stop leading for a while. A replica
		// queued leads meanwhile; this one campaigns again after the
		// pause (here nobody else is queued: it leads again).
		return etcdlock.StepDown(100 * time.Millisecond)
	})
	fmt.Println("Lead returned:", err)
	// Output:
	// leading, term 1
	// leading, term 2
	// Lead returned: context canceled
}

func ExampleHandOver() {
	srv, client := startExampleServer()
	defer srv.Close()

	ctx, stop := context.WithCancel(context.Background())
	led := make(chan string, 3)
	// replica runs Lead as one replica does; replica-1 hands the lead over
	// to replica-3 (say, the one next to the database) once both others
	// are queued.
	replica := func(id string) <-chan error {
		done := make(chan error, 1)
		go func() {
			done <- etcdlock.Lead(ctx, client, "db/primary", func(ctx context.Context) error {
				term, _ := etcdlock.TermFrom(ctx)
				fmt.Printf("%s leads, term %d\n", id, term)
				led <- id
				if id == "replica-1" {
					for q := range etcdlock.Follow(ctx, client, "db/primary") {
						if len(q) == 3 {
							break
						}
					}
					return etcdlock.HandOver("replica-3") // by identity, or by key
				}
				<-ctx.Done()
				return nil
			}, etcdlock.WithIdentity(id))
		}()
		return done
	}
	done := []<-chan error{replica("replica-1")}
	<-led
	done = append(done, replica("replica-2"))
	for q := range etcdlock.Follow(ctx, client, "db/primary") {
		if len(q) == 2 {
			break
		}
	}
	done = append(done, replica("replica-3"))
	<-led // replica-3's term: replica-2, ahead of it in the queue, stepped aside
	stop()
	for _, d := range done {
		<-d
	}
	// Output:
	// replica-1 leads, term 1
	// replica-3 leads, term 2
}
