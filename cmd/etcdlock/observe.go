package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/etcdlock/etcdlock"
	etcdlockprom "github.com/etcdlock/etcdlock/prometheus"
)

// levelFlag is --log-level: unset, nothing is logged.
type levelFlag struct {
	level slog.Level
	set   bool
}

func (l *levelFlag) String() string {
	if l == nil || !l.set {
		return ""
	}
	return strings.ToLower(l.level.String())
}

func (l *levelFlag) Set(s string) error {
	switch strings.ToLower(s) {
	case "debug":
		l.level = slog.LevelDebug
	case "info":
		l.level = slog.LevelInfo
	case "warn":
		l.level = slog.LevelWarn
	case "error":
		l.level = slog.LevelError
	default:
		return errors.New("not debug, info, warn or error")
	}
	l.set = true
	return nil
}

// observeFlags are run's flags for logs and metrics.
type observeFlags struct {
	metricsAddr string
	logLevel    levelFlag
}

func (f *observeFlags) register(c *commandFlags) {
	c.StringVar(&f.metricsAddr, "metrics-addr", "", "serve Prometheus metrics at http://`address`/metrics while etcdlock runs, such as :9090 or 127.0.0.1:0 (any free port, logged at info)")
	c.Var(&f.logLevel, "log-level", "log etcdlock's records and the lock's events to stderr at this `level` and above: debug, info, warn or error; without it, no log")
	c.groups = append(c.groups, flagGroup{title: "Observability flags", names: []string{"metrics-addr", "log-level"}})
}

// observing is what the observability flags started: the logger, the
// Session options that feed the logger and the metrics, and the metrics
// server.
type observing struct {
	log  *slog.Logger // discards everything without --log-level
	opts []etcdlock.SessionOption
	srv  *http.Server
	wg   sync.WaitGroup
}

// start starts what the flags ask for. The metrics server listens before
// start returns: a bad or busy address is a usage error.
func (f *observeFlags) start(sio stdio) (*observing, error) {
	o := &observing{log: slog.New(slog.DiscardHandler)}
	if f.logLevel.set {
		o.log = slog.New(slog.NewTextHandler(sio.err, &slog.HandlerOptions{Level: f.logLevel.level}))
		o.opts = append(o.opts, etcdlock.WithLogger(o.log))
	}
	if f.metricsAddr == "" {
		return o, nil
	}
	c := etcdlockprom.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	o.opts = append(o.opts, etcdlock.WithObserver(c))

	ln, err := net.Listen("tcp", f.metricsAddr)
	if err != nil {
		return nil, usagef("run", "--metrics-addr: %v", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	o.srv = &http.Server{Handler: mux, ReadHeaderTimeout: defaultDialTimeout}
	o.log.Info("etcdlock: serving metrics", "addr", ln.Addr().String(), "path", "/metrics")
	o.wg.Go(func() {
		if err := o.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(sio.err, "etcdlock: warning: metrics server stopped: %v\n", err)
		}
	})
	return o, nil
}

// stop stops the metrics server, if any, and waits for it.
func (o *observing) stop() {
	if o.srv != nil {
		o.srv.Close()
		o.wg.Wait()
	}
}
