package once

import (
	"strings"
	"testing"

	"github.com/etcdlock/etcdlock/internal/queue"
)

// TestKey: two (name, slot) pairs never share a key, and no key is in a
// lock's queue: it has no "/".
func TestKey(t *testing.T) {
	pairs := [][2]string{
		{"jobs/nightly", "2026-11-26T03:00"},
		{"jobs", "nightly/2026-11-26T03:00"},
		{"jobs@nightly", "2026-11-26T03:00"},
		{"jobs", "nightly@2026-11-26T03:00"},
		{"jobs%2Fnightly", "2026-11-26T03:00"},
		{"a", "b@c"},
		{"a@b", "c"},
		{"a%40b", "c"},
	}
	seen := map[string][2]string{}
	for _, p := range pairs {
		key := Key(p[0], p[1])
		if other, ok := seen[key]; ok {
			t.Errorf("Key(%q, %q) = Key(%q, %q) = %q, want distinct keys", p[0], p[1], other[0], other[1], key)
		}
		seen[key] = p
		if strings.Contains(key, "/") || !strings.HasPrefix(key, Prefix) {
			t.Errorf("Key(%q, %q) = %q, want %q and no \"/\"", p[0], p[1], key, Prefix+"...")
		}
		if queue.IsMember(p[0]+"/", []byte(key)) {
			t.Errorf("Key(%q, %q) = %q is in the lock's queue", p[0], p[1], key)
		}
	}
	if got, want := Key("jobs/nightly", "2026-11-26T03:00"), "etcdlock.done.jobs%2Fnightly@2026-11-26T03:00"; got != want {
		t.Errorf("Key: got %q, want %q", got, want)
	}
}
