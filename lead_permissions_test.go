package etcdlock_test

// Lead under etcd's authentication: a refused request is an error, every
// time; a role that was enough for Lead in 1.0.0 is enough for it now.

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// TestLeadRefused: under a role that may read every key but write none,
// Lead and Session.Lead return etcd's refusal (permission denied) at their
// first campaign, f not run, every time, and leave no key: a refused
// campaign was not applied, so there is nothing to wait for.
func TestLeadRefused(t *testing.T) {
	testflags.Parallel(t)
	env := authServer(t, permission{"\x00", "\x00", clientv3.PermissionType(clientv3.PermRead)})
	name := lockName(t)
	f := func(context.Context) error {
		t.Errorf("f ran under a role that may not write %s/", name)
		return nil
	}
	s := newSession(t, env.user)
	leads := map[string]func(ctx context.Context) error{
		"Lead":         func(ctx context.Context) error { return etcdlock.Lead(ctx, env.user, name, f) },
		"Session.Lead": func(ctx context.Context) error { return s.Lead(ctx, name, f) },
	}
	for round := range 3 {
		for what, lead := range leads {
			// The bound is the test's, not a promise: a refusal takes
			// milliseconds; the retries it replaces took until ctx ended.
			ctx, cancel := context.WithTimeout(testContext(t), 5*time.Second)
			start := time.Now()
			err := lead(ctx)
			took := time.Since(start)
			cancel()
			if !errors.Is(err, rpctypes.ErrPermissionDenied) {
				t.Fatalf("round %d: %s: got %v after %v, want permission denied", round, what, err, took)
			}
			t.Logf("round %d: %s refused in %v", round, what, took)
		}
	}
	if keys := lockKeys(t, env.root, name); len(keys) != 0 {
		t.Errorf("keys after the refused Leads: got %q, want none", keys)
	}
	if keys := leaseKeys(t, env.root, s.Lease()); len(keys) != 0 {
		t.Errorf("keys on the Session's lease after the refused Leads: got %q, want none", keys)
	}
}
