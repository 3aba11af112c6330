package main

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// embeddedReady bounds the start of the demo's embedded etcd; it is usually
// ready in well under a second.
const embeddedReady = 10 * time.Second

// embedded is a single-member etcd in this process, tuned as the etcdtest
// package tunes its servers: fast raft ticks, no fsync, no logs, loopback
// ports chosen by the kernel, data in a temporary directory.
type embedded struct {
	e        *embed.Etcd
	dir      string
	endpoint string
}

func startEmbedded() (*embedded, error) {
	dir, err := os.MkdirTemp("", "etcdlock-demo-")
	if err != nil {
		return nil, err
	}
	client := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	peer := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	cfg := embed.NewConfig()
	cfg.Name = "demo"
	cfg.Dir = dir
	cfg.ListenClientUrls = []url.URL{client}
	cfg.AdvertiseClientUrls = []url.URL{client}
	cfg.ListenPeerUrls = []url.URL{peer}
	cfg.AdvertisePeerUrls = []url.URL{peer}
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	cfg.UnsafeNoFsync = true
	cfg.TickMs = 10
	cfg.ElectionMs = 100
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.EnableGRPCGateway = false

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start embedded etcd: %w", err)
	}
	em := &embedded{e: e, dir: dir, endpoint: "http://" + e.Clients[0].Addr().String()}
	select {
	case <-e.Server.ReadyNotify():
		return em, nil
	case err = <-e.Err():
	case <-time.After(embeddedReady):
		err = errors.New("not ready in time")
	}
	em.close()
	return nil, fmt.Errorf("embedded etcd: %w", err)
}

// close stops etcd and removes its data. Close every client first: etcd
// waits for open streams before it stops.
func (em *embedded) close() {
	em.e.Close()
	os.RemoveAll(em.dir)
}
