package etcdlock_test

import (
	"context"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/etcdlock/etcdlock"
)

// A long-running service: one renewing Session per process, its leader
// duty and its other locks on it, and a shutdown that releases everything at
// once. The Session outlives its leases: after a partition longer than the
// TTL, the holds are lost (their contexts and Done channels tell), and the
// Session goes on with a new lease, so that Lead leads again and TryLock
// succeeds again once etcd is back.
func Example_longRunningService() {
	srv, client := startExampleServer() // a service connects with clientv3.New(clientv3.Config{Endpoints: ...})
	defer srv.Close()

	s, err := etcdlock.NewSession(client,
		etcdlock.WithRenewal(), // a new lease after each loss, instead of an ended Session
		etcdlock.WithTTL(10*time.Second),
		etcdlock.WithIdentity("replica-1"), // a service also passes WithLogger(slog.Default())
	)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close() // last: revokes the lease, which releases whatever is still held

	ctx, shutdown := context.WithCancel(context.Background())
	var once sync.Once
	leading := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		// The leader duty, on the Session's lease, identity and observers.
		err := s.Lead(ctx, "service/leader", func(ctx context.Context) error {
			once.Do(func() { close(leading) })
			<-ctx.Done() // the duty: until shutdown, or the lead is lost
			return nil
		})
		fmt.Println("Lead returned:", err)
	})
	<-leading
	fmt.Println("leading")

	// A report that any replica may run, skipped while another runs it.
	report := etcdlock.NewMutex(s, "service/report")
	if report.TryLock() {
		fmt.Println("report: running")
		report.Unlock()
	} else {
		fmt.Println("report: busy, skipped")
	}

	// Shutdown: end the duty and wait for it, then close the Session.
	shutdown()
	wg.Wait()
	// Output:
	// leading
	// report: running
	// Lead returned: context canceled
}
