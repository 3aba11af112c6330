package etcdlock

import (
	"fmt"
	"net/http"
	"time"
)

// Health for probes: whether a Session's lease is kept alive within the
// bound its holds rely on.

// Health returns nil while etcd acknowledged a keep-alive sent within 2/3 TTL
// (the bound of holds' Done), read locally; else ErrSessionExpired, wrapped,
// once ended (WithRenewal: lease-less), or how long etcd is silent.
func (s *Session) Health() error {
	if s == nil {
		return fmt.Errorf("%w: nil session", ErrInvalidArgument)
	}
	tm := s.term.Load()
	switch {
	case s.ended():
		return fmt.Errorf("%w: lease %x: the session has ended", ErrSessionExpired, tm.id)
	case tm.Expired():
		return fmt.Errorf("%w: lease %x lost; a new lease is being granted", ErrSessionExpired, tm.id)
	}
	if d := tm.untilSilent(); d <= 0 {
		silent := tm.ttl - tm.ttl/3 - d
		return fmt.Errorf("etcdlock: lease %x: no keep-alive acknowledged for %v (TTL %v): holds are ending", tm.id, silent.Round(time.Millisecond), tm.ttl)
	}
	return nil
}

// HealthHandler serves probes, any method and path: 200 "ok" while Health is
// nil, else 503 and its error, as plain text no cache keeps.
func (s *Session) HealthHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if err := s.Health(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, err)
			return
		}
		fmt.Fprintf(w, "ok: lease %x kept alive\n", s.Lease())
	})
}
