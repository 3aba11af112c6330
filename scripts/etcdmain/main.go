//go:build etcdmain

// Command etcdmain is etcd's own server command, built from the etcd module
// of a scripts/etcdserver/v3.N/go.mod, for the real-network test
// (scripts/net.sh builds it): it takes etcd's flags. The build tag keeps it
// out of the root module, whose go.sum lacks what etcdmain needs.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
