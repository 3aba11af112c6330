package etcdlock_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// probe calls the Session's HealthHandler and returns its status and body.
func probe(s *etcdlock.Session) (int, string) {
	rec := httptest.NewRecorder()
	s.HealthHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	return rec.Code, rec.Body.String()
}

// TestHealth: healthy while etcd acknowledges keep-alives (etcd has the
// lease); an error once they stop, within 2/3 of the TTL plus slack, then
// ErrSessionExpired; the handler says the same with 200 and 503.
func TestHealth(t *testing.T) {
	testflags.Parallel(t)
	healthy, proxied, proxy := startProxied(t)
	defer proxy.Unblackhole()
	const ttl = 3 * time.Second
	s := aliveSession(t, proxied, ttl)
	if err := s.Health(); err != nil {
		t.Fatalf("Health of a live Session: got %v, want nil", err)
	}
	if code, body := probe(s); code != http.StatusOK || !strings.HasPrefix(body, "ok") {
		t.Fatalf("probe of a live Session: got %d %q, want 200 ok", code, body)
	}
	if left, alive := leaseTTL(t, healthy, s.Lease()); !alive || left <= 0 {
		t.Fatalf("etcd's lease of a healthy Session: TTL %d, alive %v", left, alive)
	}

	proxy.Blackhole()
	cut := time.Now()
	eventually(t, "Health failing after the cut", func() bool { return s.Health() != nil })
	checkBound(t, "Health failing after the cut", time.Since(cut), 2*(ttl-ttl/3+time.Second))
	if code, _ := probe(s); code != http.StatusServiceUnavailable {
		t.Fatalf("probe once keep-alives stopped: got %d, want 503", code)
	}
	eventually(t, "ErrSessionExpired", func() bool { return errors.Is(s.Health(), etcdlock.ErrSessionExpired) })
}

// TestHealthClosed: a closed Session reports ErrSessionExpired, and etcd
// has no lease; a nil one, ErrInvalidArgument.
func TestHealthClosed(t *testing.T) {
	testflags.Parallel(t)
	_, client := startServer(t)
	s := newSession(t, client)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Health(); !errors.Is(err, etcdlock.ErrSessionExpired) {
		t.Fatalf("Health after Close: got %v, want ErrSessionExpired", err)
	}
	if code, body := probe(s); code != http.StatusServiceUnavailable || !strings.Contains(body, "session expired") {
		t.Fatalf("probe after Close: got %d %q, want 503 naming the expiry", code, body)
	}
	if leaseAlive(t, client, s.Lease()) {
		t.Fatalf("etcd still has the lease of a closed Session")
	}
	if err := (*etcdlock.Session)(nil).Health(); !errors.Is(err, etcdlock.ErrInvalidArgument) {
		t.Fatalf("Health of a nil Session: got %v, want ErrInvalidArgument", err)
	}
}
