package etcdlock

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock/etcdtest"
)

// TestD6StaleRelease: a release fenced on an older create revision, direct
// or retried in the background, never deletes a newer key of the same name.
func TestD6StaleRelease(t *testing.T) {
	srv := etcdtest.Start(t)
	client := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := NewSession(client)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	m := NewMutex(s, "test/"+t.Name())

	if err := m.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	old := m.Token()
	// Someone deletes our key, and a newer hold of the same name (same
	// lease) is written.
	if _, err := client.Delete(ctx, m.key); err != nil {
		t.Fatal(err)
	}
	put, err := client.Put(ctx, m.key, "", clientv3.WithLease(s.Lease()))
	if err != nil {
		t.Fatal(err)
	}
	newer := put.Header.Revision
	// keyRev returns the create revision of our key, 0 if it is gone.
	keyRev := func() int64 {
		resp, err := client.Get(ctx, m.key)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			return 0
		}
		return resp.Kvs[0].CreateRevision
	}

	deleted, err := m.ticket(old).release(ctx, time.Second)
	if err != nil || deleted {
		t.Errorf("release fenced on %d of the key created at %d: got %v, %v, want false, nil", old, newer, deleted, err)
	}
	if got := keyRev(); got != newer {
		t.Fatalf("key after the stale release: got create revision %d, want %d (intact)", got, newer)
	}

	// The background retry, as UnlockContext starts it when etcd does not
	// confirm the delete.
	retried := make(chan struct{})
	m.ticket(old).releaseLater(func() { close(retried) })
	select {
	case <-retried:
	case <-ctx.Done():
		t.Fatal("the background retry did not end")
	}
	if got := keyRev(); got != newer {
		t.Fatalf("key after the stale background retry: got create revision %d, want %d (intact)", got, newer)
	}

	// Fenced on the right revision, the release deletes it.
	deleted, err = m.ticket(newer).release(ctx, time.Second)
	if err != nil || !deleted {
		t.Errorf("release fenced on %d of the key created at %d: got %v, %v, want true, nil", newer, newer, deleted, err)
	}
	if got := keyRev(); got != 0 {
		t.Errorf("key after the release: got create revision %d, want deleted", got)
	}
}
