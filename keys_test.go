package etcdlock_test

// The keys the library writes, judged by listing every key in etcd: each
// family in docs/keys.md's table, and no other, with the lifetime it says.

import (
	"context"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// An etcdKey is a key as etcd has it: its name and its lease (0: none).
type etcdKey struct {
	key   string
	lease clientv3.LeaseID
}

// allKeys returns every key in client's etcd, in key order.
func allKeys(t *testing.T, client *clientv3.Client) []etcdKey {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	resp, err := client.Get(ctx, "\x00", clientv3.WithFromKey())
	if err != nil {
		t.Fatalf("list every key: %v", err)
	}
	keys := make([]etcdKey, len(resp.Kvs))
	for i, kv := range resp.Kvs {
		keys[i] = etcdKey{string(kv.Key), clientv3.LeaseID(kv.Lease)}
	}
	return keys
}

// A keyRow is a row of docs/keys.md's table: the key patterns it names and
// how its keys end (session, lasting, administrative).
type keyRow struct {
	patterns []string
	ends     string
}

// keyTables are the rows of the table.
type keyTables []keyRow

// keyTable reads the table of docs/keys.md.
func keyTable(t *testing.T) []keyRow {
	t.Helper()
	doc, err := os.ReadFile("docs/keys.md")
	if err != nil {
		t.Fatal(err)
	}
	code := regexp.MustCompile("`([^`]+)`")
	ends := regexp.MustCompile(`^\*\*(\w+)\*\*`)
	var rows []keyRow
	for line := range strings.Lines(string(doc)) {
		cells := strings.Split(line, "|")
		if len(cells) != 6 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		var r keyRow
		for _, m := range code.FindAllStringSubmatch(cells[1], -1) {
			r.patterns = append(r.patterns, m[1])
		}
		m := ends.FindStringSubmatch(strings.TrimSpace(cells[3]))
		if m == nil {
			t.Fatalf("docs/keys.md: a row whose Ends begins with no bold word: %q", line)
		}
		r.ends = m[1]
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		t.Fatal("docs/keys.md: no table")
	}
	return rows
}

// match returns the row of the table that names key, a key of one of the
// locks names, and false if none does.
func (rows keyTables) match(key string, names []string) (keyRow, bool) {
	for _, r := range rows {
		for _, p := range r.patterns {
			for _, name := range names {
				n := name
				if strings.HasPrefix(p, "etcdlock.") {
					n = strings.NewReplacer("%", "%25", "/", "%2F").Replace(name)
				}
				re := regexp.QuoteMeta(p)
				re = strings.ReplaceAll(re, "NAME", regexp.QuoteMeta(n))
				re = strings.ReplaceAll(re, "<lease>", "[0-9a-f]+")
				re = strings.ReplaceAll(re, "<id>", "[0-9a-f]+")
				re = strings.ReplaceAll(re, "<slot>", ".+")
				if regexp.MustCompile("^" + re + "$").MatchString(key) {
					return r, true
				}
			}
		}
	}
	return keyRow{}, false
}

// checkKeys fails the test for each key in etcd that the table does not
// name (as a key of one of names), or whose lease is not as its row says;
// once closed (every Session of the call closed), also for each key that
// ends with a Session.
func (rows keyTables) checkKeys(t *testing.T, client *clientv3.Client, when string, closed bool, names ...string) []etcdKey {
	t.Helper()
	keys := allKeys(t, client)
	for _, k := range keys {
		r, ok := rows.match(k.key, names)
		switch {
		case !ok:
			t.Errorf("%s: the key %q (lease %x) is in no row of docs/keys.md", when, k.key, k.lease)
		case r.ends == "administrative" && k.lease != 0:
			t.Errorf("%s: the key %q is on lease %x; its row says administrative, no lease", when, k.key, k.lease)
		case r.ends != "administrative" && k.lease == 0:
			t.Errorf("%s: the key %q has no lease; its row says %s", when, k.key, r.ends)
		case closed && r.ends == "session":
			t.Errorf("%s: the key %q outlived every Session; its row says it ends with one", when, k.key)
		case r.ends != "session" && r.ends != "lasting" && r.ends != "administrative":
			t.Errorf("%s: the key %q's row says %q, want session, lasting or administrative", when, k.key, r.ends)
		}
	}
	return keys
}

// TestKeyTable: after each public call that writes, every key left in etcd
// is in docs/keys.md's table, on the lease its row says; once the call's
// Sessions are closed, only the keys whose rows say lasting (on a lease of
// their own, still alive) or administrative (no lease) are left. Each call
// runs on an etcd of its own, so that the listing of every key is its.
func TestKeyTable(t *testing.T) {
	testflags.Parallel(t)
	rows := keyTables(keyTable(t))
	type call struct {
		name string
		run  func(t *testing.T, ctx context.Context, e *keyEnv, name string)
		// left: how many keys stay once its Sessions are closed
		left int
	}
	calls := []call{
		{"Mutex", func(t *testing.T, ctx context.Context, e *keyEnv, name string) {
			m := etcdlock.NewMutex(e.session(t), name)
			must(t, m.LockContext(ctx))
			e.check(t, "held", name)
			must(t, m.UnlockContext(ctx))
			if ok, err := m.TryLockFor(ctx, 0); !ok || err != nil {
				t.Fatalf("TryLockFor: %v, %v", ok, err)
			}
			must(t, m.UnlockContext(ctx))
		}, 0},
		{"Mutex, a reply lost", func(t *testing.T, ctx context.Context, e *keyEnv, name string) {
			fault := &txnFault{}
			s := newSession(t, serverClient(t, e.srv, fault.intercept, nil))
			e.sessions = append(e.sessions, s)
			m := etcdlock.NewMutex(s, name)
			fault.arm(0, 1, loseReply)
			if err := m.LockContext(ctx); err == nil {
				t.Fatal("lock with its reply lost: got nil, want an error")
			}
			fault.arm(0, 0, nil)
			must(t, m.LockContext(ctx))
			keys := e.check(t, "held after a reply lost", name)
			if !slices.ContainsFunc(keys, func(k etcdKey) bool { return strings.HasPrefix(k.key, "etcdlock.fence.") }) {
				t.Errorf("keys after a reply lost: got %v, want a fence key among them", keys)
			}
			must(t, m.UnlockContext(ctx))
		}, 0},
		{"RWMutex", func(t *testing.T, ctx context.Context, e *keyEnv, name string) {
			rw := etcdlock.NewRWMutex(e.session(t), name)
			must(t, rw.RLockContext(ctx))
			e.check(t, "read-held", name)
			must(t, rw.RUnlockContext(ctx))
			must(t, rw.LockContext(ctx))
			e.check(t, "write-held", name)
			must(t, rw.UnlockContext(ctx))
		}, 0},
		{"Semaphore", func(t *testing.T, ctx context.Context, e *keyEnv, name string) {
			p, err := etcdlock.NewSemaphore(e.session(t), name, 2).Acquire(ctx)
			must(t, err)
			e.check(t, "a permit held", name)
			must(t, p.Release(ctx))
		}, 0},
		{"MultiMutex", func(t *testing.T, ctx context.Context, e *keyEnv, name string) {
			m := etcdlock.NewMultiMutex(e.session(t), name, name+"-2")
			must(t, m.LockContext(ctx))
			e.check(t, "held", name, name+"-2")
			must(t, m.UnlockContext(ctx))
			e.names = append(e.names, name+"-2")
		}, 0},
		{"Do", func(t *testing.T, ctx context.Context, e *keyEnv, name string) {
			must(t, etcdlock.NewMutex(e.session(t), name).Do(ctx, func(context.Context) error {
				e.check(t, "in f", name)
				return nil
			}))
		}, 0},
		{"DoOnce", func(t *testing.T, ctx context.Context, e *keyEnv, name string) {
			r, err := etcdlock.NewMutex(e.session(t), name).DoOnce(ctx, "2026-11-28", time.Minute, func(context.Context) error { return nil })
			if r != etcdlock.OnceRan || err != nil {
				t.Fatalf("DoOnce: %v, %v", r, err)
			}
		}, 1},
		{"Lead", func(t *testing.T, ctx context.Context, e *keyEnv, name string) {
			lctx, cancel := context.WithCancel(ctx)
			err := e.session(t).Lead(lctx, name, func(context.Context) error {
				e.check(t, "leading", name)
				cancel()
				return nil
			})
			if err != context.Canceled {
				t.Fatalf("Lead: got %v, want context.Canceled", err)
			}
		}, 1},
		{"Lead, handing over", func(t *testing.T, ctx context.Context, e *keyEnv, name string) {
			// a leads; a Mutex m and b queue behind it; a hands over to b.
			// m takes its turn (a Mutex ignores the record), and while it
			// holds, the record stands; b leads once m releases.
			lctx, cancel := context.WithCancel(ctx)
			a := e.session(t, etcdlock.WithIdentity("a"))
			b := e.session(t, etcdlock.WithIdentity("b"))
			aLed := make(chan struct{})
			aDone := make(chan error, 1)
			go func() {
				aDone <- a.Lead(lctx, name, func(ctx context.Context) error {
					close(aLed)
					// Not eventually: this is not the test's goroutine.
					if err := waitUntil(ctx, func() bool { return len(lockKeys(t, e.client, name)) == 3 }); err != nil {
						return err
					}
					return etcdlock.HandOver("b")
				})
			}()
			<-aLed
			m := lockInGoroutine(t, ctx, ours{etcdlock.NewMutex(e.session(t), name)})
			eventually(t, "m queued", func() bool { return len(lockKeys(t, e.client, name)) == 2 })
			bDone := make(chan error, 1)
			go func() {
				bDone <- b.Lead(lctx, name, func(context.Context) error {
					e.check(t, "b leading, handed over to", name)
					cancel()
					return nil
				})
			}()
			must(t, waitErr(t, m.locked))
			keys := e.check(t, "m holding, the hand-over's record standing", name)
			if !slices.ContainsFunc(keys, func(k etcdKey) bool { return strings.HasPrefix(k.key, "etcdlock.handover.") && k.lease == b.Lease() }) {
				t.Errorf("keys while m holds: got %v, want the hand-over's record on b's lease %x", keys, b.Lease())
			}
			must(t, m.Release())
			for who, done := range map[string]chan error{"a": aDone, "b": bDone} {
				if err := waitErr(t, done); err != context.Canceled {
					t.Fatalf("%s's Lead: got %v, want context.Canceled", who, err)
				}
			}
		}, 1},
		{"SetLimit", func(t *testing.T, ctx context.Context, e *keyEnv, name string) {
			p, err := etcdlock.NewSemaphore(e.session(t), name, 1).Acquire(ctx)
			must(t, err)
			must(t, etcdlock.SetLimit(ctx, e.client, name, 2))
			e.check(t, "a permit held, the limit set", name)
			must(t, p.Release(ctx))
		}, 1},
	}
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			srv, client := startServer(t)
			e := &keyEnv{srv: srv, client: client, rows: rows}
			ctx := testContext(t)
			name := "keys/" + strings.ReplaceAll(t.Name(), "/", "_")
			e.names = append(e.names, name)
			c.run(t, ctx, e, name)
			e.check(t, "returned", e.names...)
			for _, s := range e.sessions {
				if err := s.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			}
			left := rows.checkKeys(t, client, "every Session closed", true, e.names...)
			if len(left) != c.left {
				t.Errorf("keys once every Session closed: got %v, want %d", left, c.left)
			}
			for _, k := range left {
				if k.lease == 0 {
					continue
				}
				ttl, err := client.TimeToLive(ctx, k.lease)
				if err != nil || ttl.TTL <= 0 {
					t.Errorf("the lease of %q: got %+v, %v; want it alive, with a TTL", k.key, ttl, err)
				}
				t.Logf("left: %q, on a lease of %d s", k.key, ttl.GrantedTTL)
			}
		})
	}
}

// A keyEnv is the etcd of one call of TestKeyTable, and the Sessions and
// lock names the call used.
type keyEnv struct {
	srv      *etcdtest.Server
	client   *clientv3.Client
	rows     keyTables
	sessions []*etcdlock.Session
	names    []string
}

// session returns a new Session of the call's, closed by the test.
func (e *keyEnv) session(t *testing.T, opts ...etcdlock.SessionOption) *etcdlock.Session {
	s := newSession(t, e.client, opts...)
	e.sessions = append(e.sessions, s)
	return s
}

// check lists every key while the call runs.
func (e *keyEnv) check(t *testing.T, when string, names ...string) []etcdKey {
	t.Helper()
	return e.rows.checkKeys(t, e.client, when, false, names...)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
