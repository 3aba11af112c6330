package etcdlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
)

// FuzzMutexName locks and unlocks arbitrary lock names on a real etcd: the
// empty name, "/", NUL bytes, invalid UTF-8, unicode, names too long for
// etcd. No call may panic; the context methods return nil or an error; a
// lock that is taken has the key name + "/" + lease hex and the key's
// create revision as its token; and nothing is left in etcd afterwards.
//
// One etcd serves the whole run (each fuzzing process starts its own), so
// an input costs a few round trips.
func FuzzMutexName(f *testing.F) {
	for _, name := range []string{
		"", "/", "//", "a/", "/a", "jobs/nightly", "a\x00b", "\x00", "\xff\xfe", "日本語/ロック",
		strings.Repeat("n", 1<<10),
		// The acquire Txn carries the name 7 times: 200 KiB fits in etcd's
		// 1.5 MiB request limit, 250 KiB does not, and 1 MiB is over the
		// client's 2 MiB send limit already in the first read.
		strings.Repeat("l", 200<<10),
		strings.Repeat("x", 250<<10),
		strings.Repeat("y", 1<<20),
	} {
		f.Add(name)
	}
	srv := etcdtest.Start(f)
	client := srv.Client(f)
	s, err := etcdlock.NewSession(client)
	if err != nil {
		f.Fatalf("NewSession: %v", err)
	}
	f.Cleanup(func() { _ = s.Close() })

	f.Fuzz(func(t *testing.T, name string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		key := keyOf(name, s.Lease())
		// keyLeft reports whether our key for name is in etcd; a name too
		// long to ask about cannot have been written either.
		keyLeft := func() bool {
			resp, err := client.Get(ctx, key)
			return err == nil && len(resp.Kvs) > 0
		}
		m := etcdlock.NewMutex(s, name)

		ok, err := m.TryLockFor(ctx, 0)
		if name == "" {
			if ok || !errors.Is(err, etcdlock.ErrInvalidName) {
				t.Errorf("TryLockFor of the empty name: got %v, %v; want false, ErrInvalidName", ok, err)
			}
			if err := m.LockContext(ctx); !errors.Is(err, etcdlock.ErrInvalidName) {
				t.Errorf("LockContext of the empty name: got %v, want ErrInvalidName", err)
			}
			if err := m.UnlockContext(ctx); !errors.Is(err, etcdlock.ErrInvalidName) {
				t.Errorf("UnlockContext of the empty name: got %v, want ErrInvalidName", err)
			}
			if keyLeft() {
				t.Errorf("the empty name wrote %q", key)
			}
			return
		}
		if err != nil || !ok {
			if ok || m.HoldCount() != 0 || m.Token() != 0 {
				t.Errorf("TryLockFor(%.40q) = %v, %v with HoldCount %d, Token %d; want no hold on failure", name, ok, err, m.HoldCount(), m.Token())
			}
			if err == nil {
				t.Errorf("TryLockFor(%.40q) on a free lock: got false, nil; want true", name)
			}
			if keyLeft() {
				t.Errorf("TryLockFor(%.40q) failed with %v and left its key", name, err)
			}
			if err := m.UnlockContext(ctx); !errors.Is(err, etcdlock.ErrNotHeld) {
				t.Errorf("UnlockContext(%.40q) after a failed lock: got %v, want ErrNotHeld", name, err)
			}
			return
		}

		if got := m.Key(); got != key {
			t.Errorf("Key() = %.60q, want %.60q", got, key)
		}
		resp, err := client.Get(ctx, key)
		if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != m.Token() {
			t.Errorf("key %.60q in etcd: got %v, err %v; want one key with create revision %d", key, resp, err, m.Token())
		}
		if isClosed(m.Done()) {
			t.Errorf("Done() of %.40q while held: got closed, want open", name)
		}
		if err := m.LockContext(ctx); err != nil || m.HoldCount() != 2 {
			t.Errorf("LockContext(%.40q) by the holder: got %v with HoldCount %d, want nil and 2", name, err, m.HoldCount())
		}
		for range 2 {
			if err := m.UnlockContext(ctx); err != nil {
				t.Errorf("UnlockContext(%.40q): got %v, want nil", name, err)
			}
		}
		if m.Key() != "" || m.Token() != 0 || !isClosed(m.Done()) || keyLeft() {
			t.Errorf("after the last unlock of %.40q: Key %.40q, Token %d, Done closed %v, key in etcd %v; want \"\", 0, true, false",
				name, m.Key(), m.Token(), isClosed(m.Done()), keyLeft())
		}
		if err := m.UnlockContext(ctx); !errors.Is(err, etcdlock.ErrNotHeld) {
			t.Errorf("UnlockContext(%.40q) once more: got %v, want ErrNotHeld", name, err)
		}
	})
}
