package etcdtest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"sync"
	"time"

	"go.etcd.io/etcd/pkg/v3/proxy"
	"go.uber.org/zap"
)

// Proxy injects network faults between one client from ProxiedClient and
// etcd: it controls one TCP proxy per member, and every method applies to all
// of them, both directions, for connections already open and new ones.
//
// The proxies forward bytes and know nothing of gRPC or TLS. They listen on
// every interface, not only 127.0.0.1, as the proxy package does. A Proxy is
// closed together with its client, by tb.Cleanup or by Close; closing the
// client by hand leaves the proxy running until then. Its methods are safe
// for concurrent use and have no effect once the client is closed.
type Proxy struct {
	servers   []proxy.Server
	endpoints []string
	wg        sync.WaitGroup // error drains

	mu         sync.Mutex
	conns      map[*proxyConn]struct{} // the client's open connections
	blackholed bool
}

// newProxy starts one proxy in front of each target, a client URL such as
// http://127.0.0.1:2379. The proxies listen on free ports of every interface
// (the proxy package binds ":port") and their URLs keep the targets' scheme.
func newProxy(targets []string, lg *zap.Logger) (*Proxy, error) {
	p := &Proxy{conns: make(map[*proxyConn]struct{})}
	for _, target := range targets {
		to, err := url.Parse(target)
		if err != nil {
			p.close()
			return nil, fmt.Errorf("etcdtest: proxy target: %w", err)
		}
		srv, from, err := startProxy(to, lg)
		if err != nil {
			p.close()
			return nil, err
		}
		p.servers = append(p.servers, srv)
		p.endpoints = append(p.endpoints, to.Scheme+"://"+from.Host)
		p.wg.Add(1)
		go p.drain(srv)
	}
	return p, nil
}

// startProxy starts a proxy to to on a free port, retrying when another
// process takes the port first.
func startProxy(to *url.URL, lg *zap.Logger) (proxy.Server, url.URL, error) {
	var lastErr error
	for range 5 {
		ports, err := freePorts(1)
		if err != nil {
			return nil, url.URL{}, err
		}
		from := localURL("tcp", ports[0])
		srv := proxy.NewServer(proxy.ServerConfig{
			Logger: lg,
			From:   from,
			To:     url.URL{Scheme: "tcp", Host: to.Host},
		})
		select {
		case <-srv.Ready():
			return srv, from, nil
		case <-srv.Done():
			lastErr = <-srv.Error()
		}
	}
	return nil, url.URL{}, fmt.Errorf("etcdtest: start proxy to %s: %w", to.Host, lastErr)
}

// drain empties the error channel of srv until it closes: the proxy blocks
// once 16 errors are pending, and its errors (such as a refused dial while a
// member is stopped) are expected in fault tests.
func (p *Proxy) drain(srv proxy.Server) {
	defer p.wg.Done()
	for {
		select {
		case <-srv.Error():
		case <-srv.Done():
			return
		}
	}
}

// close stops the proxies. Connections still open keep it waiting, so the
// client closes first.
func (p *Proxy) close() {
	for _, srv := range p.servers {
		srv.Close()
	}
	p.wg.Wait()
}

// dial connects the client to one of the proxies and keeps track of the
// connection for Unblackhole.
func (p *Proxy) dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	pc := &proxyConn{Conn: c, p: p}
	p.mu.Lock()
	p.conns[pc] = struct{}{}
	p.mu.Unlock()
	return pc, nil
}

type proxyConn struct {
	net.Conn
	p *Proxy
}

func (c *proxyConn) Close() error {
	c.p.mu.Lock()
	delete(c.p.conns, c)
	c.p.mu.Unlock()
	return c.Conn.Close()
}

// Endpoints returns the proxies' client URLs, one per member in member order,
// such as http://127.0.0.1:40123 (https under WithTLS).
func (p *Proxy) Endpoints() []string {
	return append([]string(nil), p.endpoints...)
}

// Blackhole drops all traffic both ways until Unblackhole. Connections stay
// open and new ones are accepted, so requests hang until their deadline
// rather than fail fast.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blackholed = true
	for _, srv := range p.servers {
		srv.BlackholeTx()
		srv.BlackholeRx()
	}
}

// Unblackhole forwards traffic again. Bytes dropped in the middle of a
// connection leave it broken, so Unblackhole also closes the client's
// connections that were open during the blackhole, as keep-alives would after
// a real partition; the client reconnects on its own, after gRPC's reconnect
// backoff (usually about a second). Unblackhole does nothing without
// Blackhole.
func (p *Proxy) Unblackhole() {
	p.mu.Lock()
	if !p.blackholed {
		p.mu.Unlock()
		return
	}
	p.blackholed = false
	for _, srv := range p.servers {
		srv.UnblackholeTx()
		srv.UnblackholeRx()
	}
	broken := make([]*proxyConn, 0, len(p.conns))
	for c := range p.conns {
		broken = append(broken, c)
	}
	p.mu.Unlock()
	for _, c := range broken {
		c.Close()
	}
}

// Delay holds every chunk of data for d before forwarding it, in each
// direction, so a request and its reply take at least 2*d longer; it replaces
// any earlier delay. Undelay removes it.
func (p *Proxy) Delay(d time.Duration) {
	for _, srv := range p.servers {
		srv.DelayTx(d, 0)
		srv.DelayRx(d, 0)
	}
}

// Undelay removes the delay set by Delay.
func (p *Proxy) Undelay() {
	for _, srv := range p.servers {
		srv.UndelayTx()
		srv.UndelayRx()
	}
}

// Pause stops forwarding both ways until Unpause. Connections stay open and
// nothing is dropped: data sent meanwhile waits in the proxy and in socket
// buffers. New connections are still accepted.
func (p *Proxy) Pause() {
	for _, srv := range p.servers {
		srv.PauseTx()
		srv.PauseRx()
	}
}

// Unpause forwards again, starting with the data held by Pause.
func (p *Proxy) Unpause() {
	for _, srv := range p.servers {
		srv.UnpauseTx()
		srv.UnpauseRx()
	}
}

// PauseWhile pauses the client's traffic, as Pause does, while f runs: the
// holder that calls it stops, and its keep-alives wait in the proxy, as if
// a GC pause or a frozen VM had stopped its process. With f waiting for
// longer than the lease's TTL, or until the next holder has the lock
// (Resource.WaitNewer), the holder goes on after its lease expired, without
// having seen its loss: what fencing tokens exist for.
func (p *Proxy) PauseWhile(f func()) {
	p.Pause()
	defer p.Unpause()
	f()
}
