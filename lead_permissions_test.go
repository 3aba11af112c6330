package etcdlock_test

// Lead under etcd's authentication: a refused request is an error, every
// time; a role that was enough for Lead in 1.0.0 is enough for it now.

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/syncbuf"
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

// TestLeadRole100: under 1.0.0's role for a lock (read and write on name/
// and on etcdlock.fence., nothing else), Lead leads as in 1.0.0: its f
// runs, one at a time, each candidate in turn as the last leader's f ends,
// and nothing is left once they stop. Its records refused, a term is not
// counted (TermFrom false, TermStarted's Err names both records' keys), and
// no hand-over is honoured; HandOver, the feature that writes a record, is
// refused: Lead releases and returns etcd's refusal naming the record's
// key, and the next candidate leads.
func TestLeadRole100(t *testing.T) {
	testflags.Parallel(t)
	name := "perm/" + t.Name()
	rw := clientv3.PermissionType(clientv3.PermReadWrite)
	env := authServer(t, prefixPermission(name+"/", rw), prefixPermission("etcdlock.fence.", rw))
	ctx := testContext(t)
	record, term := recordKeys(name)
	type run struct {
		who     string
		counted bool
	}
	var (
		mu      sync.Mutex
		running string
	)
	started := make(chan run, 16)
	ends := map[string]chan error{"a": make(chan error, 1), "b": make(chan error, 1)}
	f := func(who string) func(context.Context) error {
		return func(ctx context.Context) error {
			mu.Lock()
			if running != "" {
				t.Errorf("%s's f runs while %s's still runs", who, running)
			}
			running = who
			mu.Unlock()
			_, counted := etcdlock.TermFrom(ctx)
			started <- run{who, counted}
			var err error
			select {
			case <-ctx.Done():
			case err = <-ends[who]:
			}
			mu.Lock()
			running = ""
			mu.Unlock()
			return err
		}
	}
	next := func() run {
		t.Helper()
		select {
		case r := <-started:
			return r
		case <-time.After(testTimeout):
			t.Fatalf("no term began within %v", testTimeout)
		}
		return run{}
	}
	var log eventLog
	var logged syncbuf.Buffer
	a := campaign(ctx, env.user, name, f("a"), etcdlock.WithIdentity("a"), etcdlock.WithObserver(&log),
		etcdlock.WithLogger(slog.New(slog.NewTextHandler(&logged, nil))))
	if r := next(); r.who != "a" || r.counted {
		t.Errorf("the first term: got %+v, want a's, not counted", r)
	}
	e := log.wait(t, "a's TermStarted", func(e etcdlock.Event) bool { return e.Kind == etcdlock.TermStarted })
	if e.Term != 0 || !errors.Is(e.Err, rpctypes.ErrPermissionDenied) ||
		!strings.Contains(e.Err.Error(), record) || !strings.Contains(e.Err.Error(), term) {
		t.Errorf("TermStarted under the role: got Term %d, Err %v; want 0 and permission denied naming %s and %s", e.Term, e.Err, term, record)
	}
	if out := logged.String(); !strings.Contains(out, "level=WARN msg=\"etcdlock: leading, uncounted\"") || !strings.Contains(out, "permission denied") {
		t.Errorf("the log of a's term: got %q, want a warning that it leads uncounted, with etcd's refusal", out)
	}
	b := campaign(ctx, env.user, name, f("b"), etcdlock.WithIdentity("b"))
	queued(t, env.root, name, 2)
	ends["a"] <- etcdlock.HandOver("b")
	if err := waitErr(t, a.result); !errors.Is(err, rpctypes.ErrPermissionDenied) || !strings.Contains(err.Error(), record) {
		t.Errorf("Lead whose f handed over under the role: got %v, want permission denied naming %s", err, record)
	}
	if r := next(); r.who != "b" || r.counted {
		t.Errorf("after a's refused hand-over: got %+v, want b's term, not counted", r)
	}
	if err := b.stop(t); !errors.Is(err, context.Canceled) {
		t.Errorf("b stopped: got %v, want context.Canceled", err)
	}
	if keys := allKeys(t, env.root); len(keys) != 0 {
		t.Errorf("keys once a and b stopped: got %v, want none", keys)
	}
}
