package etcdlockgocron_test

import (
	"context"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	etcdlockgocron "github.com/etcdlock/etcdlock/gocron"
)

// Three replicas, each with its own Session and scheduler, run a job every
// 2 seconds: each tick runs on one of them. The replicas here are in one
// process, on an in-process etcd; in your code, each process makes one,
// connected to your own etcd.
func ExampleLocker() {
	srv, err := etcdtest.New()
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()

	var (
		mu   sync.Mutex
		runs = make(map[int]int) // runs per tick
	)
	const every = 2 * time.Second
	first := time.Now().Add(time.Second)
	report := func() {
		mu.Lock()
		defer mu.Unlock()
		runs[int(time.Since(first)/every)]++
	}
	for range 3 {
		client, err := srv.NewClient()
		if err != nil {
			log.Fatal(err)
		}
		s, err := etcdlock.NewSession(client, etcdlock.WithRenewal())
		if err != nil {
			log.Fatal(err)
		}
		defer s.Close()
		// Held for 1.5 s at least: a replica that starts the tick up to
		// then after the first one finds the job locked.
		locker, err := etcdlockgocron.NewLocker(s, "myapp/jobs/", etcdlockgocron.WithMinHold(1500*time.Millisecond))
		if err != nil {
			log.Fatal(err)
		}
		sched, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
		if err != nil {
			log.Fatal(err)
		}
		defer sched.Shutdown()
		_, err = sched.NewJob(gocron.DurationJob(every), gocron.NewTask(report),
			gocron.WithName("report"), gocron.WithStartAt(gocron.WithStartDateTime(first)))
		if err != nil {
			log.Fatal(err)
		}
		sched.Start()
	}

	for {
		mu.Lock()
		fourth := runs[3] > 0
		mu.Unlock()
		if fourth {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	for tick := range 3 {
		fmt.Printf("tick %d: %d run\n", tick, runs[tick])
	}
	// Output:
	// tick 0: 1 run
	// tick 1: 1 run
	// tick 2: 1 run
}

// A replica runs the jobs of its scheduler while it leads; the others skip
// them until it is gone.
func ExampleElector() {
	srv, err := etcdtest.New()
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	client, err := srv.NewClient()
	if err != nil {
		log.Fatal(err)
	}
	s, err := etcdlock.NewSession(client, etcdlock.WithRenewal())
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	elector, err := etcdlockgocron.NewElector(s, "myapp/leader")
	if err != nil {
		log.Fatal(err)
	}
	defer elector.Close()
	sched, err := gocron.NewScheduler(gocron.WithDistributedElector(elector))
	if err != nil {
		log.Fatal(err)
	}
	defer sched.Shutdown()

	ran := make(chan struct{})
	var once sync.Once
	_, err = sched.NewJob(gocron.DurationJob(100*time.Millisecond), gocron.NewTask(func() {
		once.Do(func() { close(ran) })
	}))
	if err != nil {
		log.Fatal(err)
	}
	sched.Start()
	<-ran // alone, this replica is elected, and its job runs
	fmt.Println("ran as the leader:", elector.IsLeader(context.Background()) == nil)
	// Output:
	// ran as the leader: true
}
