package main

import (
	"strings"
	"testing"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/queue"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// limit shows a Semaphore's limit in force, sets it (the record, read back
// from etcd), refuses a queue that is no Semaphore's (65), bad usage (64)
// and an etcd that is gone (69).
func TestLimit(t *testing.T) {
	testflags.Parallel(t)
	skipExternal(t)
	srv := etcdtest.Start(t)
	ep := srv.Endpoints()[0]
	client := srv.Client(t)
	s, err := etcdlock.NewSession(client)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	name := lockName(t)

	r := runCLI(t, nil, "limit", "--endpoints", ep, name)
	r.want(t, 0)
	if !strings.Contains(r.stdout, "no limit recorded") {
		t.Fatalf("stdout: got %q, want no limit recorded", r.stdout)
	}
	p, err := etcdlock.NewSemaphore(s, name, 3).Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{name}, ": limit 3\n"},      // the holder's own
		{[]string{name, "1"}, ": limit 1\n"}, // recorded
		{[]string{name}, ": limit 1\n"},
	} {
		r := runCLI(t, nil, append([]string{"limit", "--endpoints", ep}, tc.args...)...)
		r.want(t, 0)
		if !strings.HasSuffix(r.stdout, tc.want) {
			t.Fatalf("limit %q: stdout %q, want …%q", tc.args, r.stdout, tc.want)
		}
	}
	resp, err := client.Get(t.Context(), queue.LimitKey(name))
	if err != nil || len(resp.Kvs) != 1 || !strings.HasPrefix(string(resp.Kvs[0].Value), "limit=1 ") {
		t.Fatalf("the record in etcd: %v, %v", resp, err)
	}
	if err := etcdlock.CheckFence(t.Context(), client, p.Fence()); err != nil {
		t.Fatalf("the permit held, after the limit was lowered: %v", err)
	}
	if err := p.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	w, err := etcdlock.NewSemaphore(s, name, 3).AcquireN(t.Context(), 3)
	if err != nil {
		t.Fatal(err)
	}
	r = runCLI(t, nil, "holders", "--endpoints", ep, name)
	r.want(t, 0)
	if !strings.Contains(r.stdout, "semaphore(3)") {
		t.Fatalf("holders of a permit of 3: got %q, want its KIND semaphore(3)", r.stdout)
	}
	if err := w.Release(t.Context()); err != nil {
		t.Fatal(err)
	}

	m := etcdlock.NewMutex(s, name+"/m")
	if err := m.LockContext(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{name + "/m", "2"}, {name + "/m"}} {
		r := runCLI(t, nil, append([]string{"limit", "--endpoints", ep}, args...)...)
		r.want(t, exitDataErr)
		if strings.Contains(r.stderr, "etcdlock: etcdlock:") || !strings.Contains(r.stderr, "no permit's") {
			t.Fatalf("limit %q of a Mutex's queue: stderr %q, want one prefix and the key that is no permit's", args, r.stderr)
		}
	}
	for _, args := range [][]string{
		{"limit", "--endpoints", ep},
		{"limit", "--endpoints", ep, name, "0"},
		{"limit", "--endpoints", ep, name, "x"},
		{"limit", "--endpoints", ep, name, "2", "3"},
	} {
		runCLI(t, nil, args...).want(t, exitUsage)
	}
	srv.Close()
	runCLI(t, nil, "limit", "--endpoints", ep, "--dial-timeout", "1s", name).want(t, exitUnavailable)
}
