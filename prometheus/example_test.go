package etcdlockprom_test

import (
	"bufio"
	"context"
	"fmt"
	"log"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdtest"
	etcdlockprom "github.com/etcdlock/etcdlock/prometheus"
)

func Example() {
	// An in-process etcd for the example; connect to your own instead.
	srv, err := etcdtest.New()
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	client, err := srv.NewClient()
	if err != nil {
		log.Fatal(err)
	}

	c := etcdlockprom.New()
	// A registry of the example's own; prometheus.MustRegister(c) uses the
	// default one, which promhttp.Handler() serves.
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	s, err := etcdlock.NewSession(client, etcdlock.WithObserver(c))
	if err != nil {
		log.Fatal(err)
	}

	m := etcdlock.NewMutex(s, "jobs/nightly")
	ctx := context.Background()
	if err := m.LockContext(ctx); err != nil {
		log.Fatal(err)
	}
	if err := m.UnlockContext(ctx); err != nil {
		log.Fatal(err)
	}
	// Events reach the Collector shortly after they happen; Close delivers
	// those still queued. A running process is scraped while it runs.
	if err := s.Close(); err != nil {
		log.Fatal(err)
	}

	// What Prometheus would scrape from /metrics.
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for sc := bufio.NewScanner(rec.Body); sc.Scan(); {
		if line := sc.Text(); strings.HasPrefix(line, "etcdlock_acquisitions_total") || strings.HasPrefix(line, "etcdlock_holds") {
			fmt.Println(line)
		}
	}
	// Output:
	// etcdlock_acquisitions_total{contended="false",outcome="acquired",primitive="mutex"} 1
	// etcdlock_holds{primitive="mutex"} 0
}
