package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// probeAfter is how long connect waits for etcd's first answer before it
// dials the endpoints itself to tell why there is none: a healthy etcd
// answers well within it, and never sees those dials.
const probeAfter = 300 * time.Millisecond

// A lockConn is a command's connection to etcd for one lock: the client,
// its configuration (for messages), and a context that ends on SIGINT or
// SIGTERM.
type lockConn struct {
	ctx  context.Context
	cli  *clientv3.Client
	cfg  clientv3.Config
	stop context.CancelFunc
}

// dial reads the connection flags of the command cmd, and their ETCDCTL_
// variables, and connects for the lock name (see connect). Close the
// lockConn when done.
func (cf *connFlags) dial(fs *commandFlags, cmd, name string, sio stdio) (*lockConn, error) {
	if err := cf.fromEnv(fs, sio.getenv); err != nil {
		return nil, err
	}
	cfg, err := cf.config(cmd)
	if err != nil {
		return nil, err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	cli, err := connect(ctx, cfg, name+"/")
	if err != nil {
		stop()
		return nil, err
	}
	return &lockConn{ctx: ctx, cli: cli, cfg: cfg, stop: stop}, nil
}

// failed returns the status of a call on c that failed with err: 130 when
// the command was interrupted (SIGINT, SIGTERM) meanwhile, so that an
// interrupt is not reported as etcd unreachable; else unavailable's.
func (c *lockConn) failed(err error) error {
	if c.ctx.Err() != nil {
		return withStatus(exitInterrupted, fmt.Errorf("interrupted: %w", err))
	}
	return unavailable(c.cfg, err)
}

// Close closes the client and stops catching the signals.
func (c *lockConn) Close() {
	c.cli.Close()
	c.stop()
}

// connect returns a client of cfg once etcd has answered a read of key within
// the dial timeout, which proves that it is reachable, accepts our
// credentials and lets us read the lock. Failures are exitUnavailable errors;
// if ctx ends first, connect returns ctx.Err().
func connect(ctx context.Context, cfg clientv3.Config, key string) (*clientv3.Client, error) {
	cli, err := clientv3.New(cfg)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, unavailable(cfg, err)
	}
	pctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	// A refused connection or an unknown host is said as such, at once,
	// rather than as a timeout once the dial timeout has passed.
	down := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-pctx.Done():
			return
		case <-time.After(probeAfter):
		}
		if err := unreachable(pctx, cfg.Endpoints); err != nil {
			down <- err
			cancel()
		}
	})
	_, err = cli.Get(pctx, key, clientv3.WithCountOnly())
	cancel()
	wg.Wait()
	if err != nil {
		cli.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		select {
		case err := <-down:
			return nil, withStatus(exitUnavailable, err)
		default:
		}
		return nil, unavailable(cfg, err)
	}
	return cli, nil
}

// unreachable dials each endpoint once, and if every one refuses the
// connection or names a host that does not exist, returns an error that
// says so; else nil (one answered, or failed in a way the dial timeout
// will tell). It does not dial through a proxy, so it tells nothing when
// one is configured.
func unreachable(ctx context.Context, endpoints []string) error {
	for _, v := range []string{"HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"} {
		if os.Getenv(v) != "" {
			return nil
		}
	}
	var why []string
	for _, ep := range endpoints {
		addr, ok := endpointAddr(ep)
		if !ok {
			return nil
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
			return nil
		}
		shown := endpointList(clientv3.Config{Endpoints: []string{ep}})
		dnsErr, isDNS := errors.AsType[*net.DNSError](err)
		switch {
		case errors.Is(err, syscall.ECONNREFUSED):
			why = append(why, shown+": connection refused (is etcd running there?)")
		case isDNS && dnsErr.IsNotFound:
			why = append(why, fmt.Sprintf("%s: unknown host %q", shown, dnsErr.Name))
		default:
			return nil
		}
	}
	if len(why) == 0 {
		return nil
	}
	return fmt.Errorf("etcd unreachable: %s", strings.Join(why, "; "))
}

// endpointAddr returns the host:port that endpoint ep dials over TCP, and
// false for one that is not TCP (unix sockets) or has no port.
func endpointAddr(ep string) (string, bool) {
	if strings.Contains(ep, "://") {
		u, err := url.Parse(ep)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
			return "", false
		}
		ep = u.Host
	}
	if at := strings.LastIndex(ep, "@"); at >= 0 {
		ep = ep[at+1:]
	}
	if _, port, err := net.SplitHostPort(ep); err != nil || port == "" {
		return "", false
	}
	return ep, true
}

// unavailable is the error of etcd being unreachable or refusing a request.
func unavailable(cfg clientv3.Config, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("no answer from etcd at %s in time (--dial-timeout %v): unreachable, or a TLS mismatch: %w", endpointList(cfg), cfg.DialTimeout, err)
	} else {
		err = fmt.Errorf("etcd at %s: %w", endpointList(cfg), err)
	}
	return withStatus(exitUnavailable, err)
}
