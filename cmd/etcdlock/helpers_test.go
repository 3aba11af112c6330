//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
)

// lockName returns a lock name of the test's own.
func lockName(t *testing.T) string {
	return "cli-test/" + strings.ReplaceAll(t.Name(), "/", "-")
}

// newSession returns a session on cli with a TTL of 10 s and opts, closed
// when the test ends.
func newSession(t *testing.T, cli *clientv3.Client, opts ...etcdlock.SessionOption) *etcdlock.Session {
	t.Helper()
	s, err := etcdlock.NewSession(cli, append([]etcdlock.SessionOption{etcdlock.WithTTL(10 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatalf("NewSession: got %v, want nil", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// holdLock takes the lock name on a session of its own and returns the
// Mutex; the lock is released, and the session closed, when the test ends.
func holdLock(t *testing.T, cli *clientv3.Client, name string) *etcdlock.Mutex {
	t.Helper()
	m := etcdlock.NewMutex(newSession(t, cli), name)
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	if err := m.LockContext(ctx); err != nil {
		t.Fatalf("LockContext: got %v, want nil", err)
	}
	return m
}

// lockKeys returns the keys of the lock name, oldest first: those under
// name/ and not nested deeper.
func lockKeys(t *testing.T, cli *clientv3.Client, name string) []*keyInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	// Not WithKeysOnly, which leaves out the leases.
	resp, err := cli.Get(ctx, name+"/", clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		t.Fatalf("get %s/: got %v, want nil", name, err)
	}
	var keys []*keyInfo
	for _, kv := range resp.Kvs {
		if strings.Contains(strings.TrimPrefix(string(kv.Key), name+"/"), "/") {
			continue
		}
		keys = append(keys, &keyInfo{key: string(kv.Key), rev: kv.CreateRevision, lease: clientv3.LeaseID(kv.Lease)})
	}
	return keys
}

type keyInfo struct {
	key   string
	rev   int64
	lease clientv3.LeaseID
}

func (k *keyInfo) String() string { return fmt.Sprintf("%s@%d", k.key, k.rev) }

// waitKeys waits until there are n keys under name/ and returns them.
func waitKeys(t *testing.T, cli *clientv3.Client, name string, n int) []*keyInfo {
	t.Helper()
	deadline := time.Now().Add(opTimeout)
	for {
		keys := lockKeys(t, cli, name)
		if len(keys) == n {
			return keys
		}
		if time.Now().After(deadline) {
			t.Fatalf("keys under %s/: got %v, want %d keys", name, keys, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitFile waits until path contains want.
func waitFile(t *testing.T, path, want string) {
	t.Helper()
	deadline := time.Now().Add(opTimeout)
	for {
		b, _ := os.ReadFile(path)
		if strings.Contains(string(b), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: got %q, want it to contain %q", path, b, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// readPID reads a process ID written to path by a test command.
func readPID(t *testing.T, path string) int {
	t.Helper()
	waitFile(t, path, "\n")
	b, _ := os.ReadFile(path)
	var pid int
	if _, err := fmt.Sscan(string(b), &pid); err != nil || pid <= 0 {
		t.Fatalf("pid in %s: got %q, want a process ID", path, b)
	}
	return pid
}

// processGone reports whether pid has exited: it no longer exists, or it is
// a zombie that nobody has reaped yet.
func processGone(pid int) bool {
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		// pid (comm) state ...: the state follows the last ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		return i >= 0 && i+2 < len(s) && s[i+2] == 'Z'
	} else if _, serr := os.Stat("/proc/self/stat"); serr == nil {
		return true // procfs works, and pid is not in it
	}
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}
