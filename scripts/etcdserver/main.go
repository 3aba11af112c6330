// Command etcdserver runs one embedded etcd, of the version of the go.mod it
// is built with, for scripts/etcd-versions.sh, which builds it with each of
// scripts/etcdserver/v3.N/go.mod (in the root module, it is v3.7's): on 127.0.0.1 with free ports and
// its data in a temporary directory. It prints its client URL on stdout
// when ready and stops cleanly on SIGTERM or SIGINT.
package main

import (
	"fmt"
	"log"
	"net"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// freeURL returns an http URL on 127.0.0.1 with a port free a moment ago.
func freeURL() url.URL {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	return url.URL{Scheme: "http", Host: l.Addr().String()}
}

func main() {
	dir, err := os.MkdirTemp("", "etcdserver-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.LogLevel = "error"
	client, peer := freeURL(), freeURL()
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(time.Minute):
		log.Fatal("etcd not ready after a minute")
	}
	fmt.Println(client.String())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
	case err := <-e.Err():
		log.Print(err)
	}
}
