package main

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

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
	if _, err := cli.Get(pctx, key, clientv3.WithCountOnly()); err != nil {
		cli.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, unavailable(cfg, err)
	}
	return cli, nil
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
