package etcdlock_test

// The keys the library writes, judged by listing every key in etcd: each
// family in docs/keys.md's table, and no other, with the lifetime it says.

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
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
