package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
)

// replica runs Lead as one replica of a web service does, until ctx ends,
// and returns Lead's result. Its address is its identity: the value of its
// lock key, put with its hold's lease when it campaigns, so that a follower
// never finds a leader without its address, nor an address that outlived
// its leader. led, if not nil, receives a value when it leads.
func replica(ctx context.Context, client *clientv3.Client, addr string, led chan<- struct{}) <-chan error {
	done := make(chan error, 1)
	go func() {
		done <- etcdlock.Lead(ctx, client, "web/leader", func(ctx context.Context) error {
			if led != nil {
				led <- struct{}{}
			}
			<-ctx.Done() // serve writes until the lead ends
			return nil
		}, etcdlock.WithIdentity(addr))
	}()
	return done
}

func ExampleLeaderOf() {
	srv, client := startExampleServer()
	defer srv.Close()
	ctx, stop := context.WithCancel(context.Background())
	led := make(chan struct{}, 1)
	lead := replica(ctx, client, "http://10.0.0.1:8080", led)
	<-led

	// A follower answers writes with a redirect to the leader.
	follower := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		leader, err := etcdlock.LeaderOf(r.Context(), client, "web/leader")
		switch {
		case errors.Is(err, etcdlock.ErrNoLeader):
			http.Error(w, "no leader now; try again", http.StatusServiceUnavailable)
		case err != nil:
			http.Error(w, err.Error(), http.StatusBadGateway)
		default:
			http.Redirect(w, r, leader.Identity+r.URL.Path, http.StatusTemporaryRedirect)
		}
	})
	write := httptest.NewRecorder()
	follower.ServeHTTP(write, httptest.NewRequest(http.MethodPost, "/jobs", nil))
	fmt.Println(write.Code, write.Header().Get("Location"))

	stop() // the only replica stops: nobody leads
	<-lead
	write = httptest.NewRecorder()
	follower.ServeHTTP(write, httptest.NewRequest(http.MethodPost, "/jobs", nil))
	fmt.Println(write.Code)
	// Output:
	// 307 http://10.0.0.1:8080/jobs
	// 503
}

func ExampleFollowLeader() {
	srv, client := startExampleServer()
	defer srv.Close()
	ctx := context.Background()

	// A follower (or a candidate: run it beside Lead) learns every new
	// leader.
	following, stopFollowing := context.WithCancel(ctx)
	defer stopFollowing()
	leaders := etcdlock.FollowLeader(following, client, "web/leader")
	if l := <-leaders; l.Key == "" {
		fmt.Println("nobody leads")
	}

	first, stopFirst := context.WithCancel(ctx)
	firstDone := replica(first, client, "http://10.0.0.1:8080", nil)
	fmt.Println("leader:", (<-leaders).Identity)

	second, stopSecond := context.WithCancel(ctx)
	defer stopSecond()
	secondDone := replica(second, client, "http://10.0.0.2:8080", nil)
	// Observe shows the whole queue: wait until the second replica waits.
	queue, stopQueue := context.WithCancel(ctx)
	for q := range etcdlock.Follow(queue, client, "web/leader") {
		if len(q) == 2 {
			fmt.Println("waiting:", q[1].Identity)
			break
		}
	}
	stopQueue()

	stopFirst() // the leader stops, and releases: the second leads
	<-firstDone
	fmt.Println("leader:", (<-leaders).Identity)
	stopSecond()
	<-secondDone
	// Output:
	// nobody leads
	// leader: http://10.0.0.1:8080
	// waiting: http://10.0.0.2:8080
	// leader: http://10.0.0.2:8080
}

func ExampleFollow() {
	srv, client := startExampleServer()
	defer srv.Close()
	a, _ := etcdlock.NewSession(client, etcdlock.WithIdentity("worker-a"))
	defer a.Close()
	b, _ := etcdlock.NewSession(client, etcdlock.WithIdentity("worker-b"))
	defer b.Close()

	// Follow sends the queue now and at each change; a slow receiver gets
	// the newest, so wait for the state you want rather than count changes.
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	queue := etcdlock.Follow(ctx, client, "jobs/report")
	until := func(ok func([]etcdlock.QueueEntry) bool) []etcdlock.QueueEntry {
		for q := range queue {
			if ok(q) {
				return q
			}
		}
		return nil
	}
	until(func(q []etcdlock.QueueEntry) bool { return len(q) == 0 })
	fmt.Println("nobody holds")

	ma := etcdlock.NewMutex(a, "jobs/report")
	ma.Lock()
	q := until(func(q []etcdlock.QueueEntry) bool { return len(q) == 1 })
	fmt.Println("held by", q[0].Identity)

	held, letGo, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() { // worker-b waits, then holds until told to let go
		defer close(done)
		mb := etcdlock.NewMutex(b, "jobs/report")
		mb.Lock()
		close(held)
		<-letGo
		mb.Unlock()
	}()
	q = until(func(q []etcdlock.QueueEntry) bool { return len(q) == 2 })
	fmt.Println("waiting:", q[1].Identity, "holds:", q[1].Holds)

	ma.Unlock()
	<-held
	q = until(func(q []etcdlock.QueueEntry) bool { return len(q) == 1 && q[0].Holds })
	fmt.Println("held by", q[0].Identity)
	close(letGo)
	<-done
	// Output:
	// nobody holds
	// held by worker-a
	// waiting: worker-b holds: false
	// held by worker-b
}
