//go:build unix

package main

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// revisionOf returns etcd's current revision.
func revisionOf(t *testing.T, cli *clientv3.Client) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	resp, err := cli.Get(ctx, "\x00")
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	return resp.Header.Revision
}

// TestRelease: etcdlock release deletes the holders' keys, or the one
// asked for, and only after a confirmation; etcd is the judge.
func TestRelease(t *testing.T) {
	testflags.Parallel(t)
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	ep := srv.Endpoints()[0]

	t.Run("holder", func(t *testing.T) {
		name := lockName(t)
		m := holdLock(t, cli, name)
		done := m.Done()
		r := runCLI(t, nil, "release", "--yes", "--endpoints", ep, name)
		r.want(t, 0)
		if !strings.Contains(r.stdout, "released: "+m.Key()) {
			t.Fatalf("stdout: got %q, want it to name %s", r.stdout, m.Key())
		}
		if keys := lockKeys(t, cli, name); len(keys) != 0 {
			t.Fatalf("keys after release: got %v, want none", keys)
		}
		<-done
	})

	t.Run("one permit by token", func(t *testing.T) {
		name := lockName(t)
		sem := func() *etcdlock.Permit {
			p, err := etcdlock.NewSemaphore(newSession(t, cli), name, 2).Acquire(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			return p
		}
		a, b := sem(), sem()
		r := runCLI(t, nil, "release", "--yes", "--token", strconv.FormatInt(b.Token(), 10), "--endpoints", ep, name)
		r.want(t, 0)
		keys := lockKeys(t, cli, name)
		if len(keys) != 1 || keys[0].key != a.Key() {
			t.Fatalf("keys after release of %s: got %v, want only %s", b.Key(), keys, a.Key())
		}
	})

	t.Run("waiter by key", func(t *testing.T) {
		name := lockName(t)
		holdLock(t, cli, name)
		w := etcdlock.NewMutex(newSession(t, cli), name)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go func() { _ = w.LockContext(ctx) }()
		keys := waitKeys(t, cli, name, 2)
		r := runCLI(t, nil, "release", "--yes", "--lock-key", keys[1].key, "--endpoints", ep, name)
		r.want(t, 0)
		// The waiter puts its key again (a new token): the holder's is intact.
		after := waitKeys(t, cli, name, 2)
		if after[0].key != keys[0].key || after[0].rev != keys[0].rev || after[1].rev == keys[1].rev {
			t.Fatalf("keys: got %v after %v, want the holder's untouched and the waiter's put again", after, keys)
		}
	})

	t.Run("not confirmed", func(t *testing.T) {
		name := lockName(t)
		holdLock(t, cli, name)
		before := lockKeys(t, cli, name)
		r := runCLI(t, nil, "release", "--endpoints", ep, name)
		r.want(t, exitFailed)
		if !slices.EqualFunc(lockKeys(t, cli, name), before, func(a, b *keyInfo) bool { return *a == *b }) {
			t.Fatalf("keys changed without a confirmation")
		}
		yes := startCLIVia(t, []string{"sh", "-c", `echo y | "$@"`, "sh"}, nil, "release", "--endpoints", ep, name).wait(t)
		yes.want(t, 0)
		if keys := lockKeys(t, cli, name); len(keys) != 0 {
			t.Fatalf("keys after a confirmed release: got %v, want none", keys)
		}
	})

	t.Run("run stops its command", func(t *testing.T) {
		name := lockName(t)
		p := startCLI(t, nil, "run", "--endpoints", ep, name, "--", "sleep", "60")
		waitKeys(t, cli, name, 1)
		runCLI(t, nil, "release", "--yes", "--endpoints", ep, name).want(t, 0)
		p.wait(t).want(t, exitLost)
	})

	t.Run("bad input", func(t *testing.T) {
		name := lockName(t)
		holdLock(t, cli, name)
		before := revisionOf(t, cli)
		for _, c := range []struct {
			args []string
			code int
		}{
			{[]string{name + "-nobody"}, exitNothing},
			{[]string{"--token", "1", name}, exitNothing},
			{[]string{"--lock-key", name + "/0", name}, exitNothing},
			{[]string{"--lock-key", "other/1", name}, exitUsage},
			{[]string{"--token", "-3", name}, exitUsage},
			{[]string{}, exitUsage},
			{[]string{name, "extra"}, exitUsage},
		} {
			r := runCLI(t, nil, append([]string{"release", "--yes", "--endpoints", ep}, c.args...)...)
			r.want(t, c.code)
			if r.stderr == "" {
				t.Errorf("%q: no error message", c.args)
			}
		}
		if after := revisionOf(t, cli); after != before {
			t.Fatalf("etcd's revision moved from %d to %d: bad input wrote", before, after)
		}
	})
}
