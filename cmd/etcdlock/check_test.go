package main

import (
	"strings"
	"testing"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// check says whether a fence still holds, from etcd: 0 while it does, 74
// once it does not; 64 for a fence that does not parse, 69 with etcd gone.
func TestCheck(t *testing.T) {
	testflags.Parallel(t)
	skipExternal(t)
	srv := etcdtest.Start(t)
	ep := srv.Endpoints()[0]
	s, err := etcdlock.NewSession(srv.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m := etcdlock.NewMutex(s, lockName(t))
	if err := m.LockContext(t.Context()); err != nil {
		t.Fatal(err)
	}
	h, _ := m.Held()
	f := h.Fence().String()

	for _, args := range [][]string{{"check", "--endpoints", ep, f}, {"check", f, "--endpoints", ep}} {
		r := runCLI(t, nil, args...)
		r.want(t, 0)
		if !strings.HasPrefix(r.stdout, "holds: ") {
			t.Fatalf("%q: stdout: got %q, want holds: …", args, r.stdout)
		}
	}
	if err := m.UnlockContext(t.Context()); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, nil, "check", "--endpoints", ep, f)
	r.want(t, exitLost)
	if !strings.Contains(r.stdout, "lost: ") || !strings.Contains(r.stdout, "is gone") {
		t.Fatalf("stdout: got %q, want lost: … is gone", r.stdout)
	}

	for _, args := range [][]string{
		{"check", "--endpoints", ep},
		{"check", "--endpoints", ep, "1042"},
		{"check", "--endpoints", ep, "etcdlock:0:jobs:1f"},
		{"check", "--endpoints", ep, f, "more"},
	} {
		runCLI(t, nil, args...).want(t, exitUsage)
	}
	srv.Close()
	runCLI(t, nil, "check", "--endpoints", ep, "--dial-timeout", "1s", f).want(t, exitUnavailable)
}
