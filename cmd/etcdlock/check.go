package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/etcdlock/etcdlock"
)

const checkAbout = `Asks etcd whether the hold that FENCE names still holds its lock, with one
read, and says so: FENCE is the fence of a hold, such as the ETCDLOCK_FENCE
that etcdlock run gives its command (etcdlock:<token>:<name>:<key>). A
command under etcdlock run can check before a write that must not follow a
lost lock; the answer is true when etcd read the queue, so a write after it
still needs a resource that refuses stale tokens.

Exit statuses: 0 the hold holds; 74 it does not (its key is gone, was made
anew, or waits); 64 usage, or a FENCE that does not parse; 69 etcd
unreachable or refused us; 130 interrupted.
`

func newCheckFlags() (*commandFlags, *connFlags) {
	c := newCommandFlags("check", "[flags] FENCE", checkAbout)
	conn := &connFlags{}
	conn.register(c, true)
	return c, conn
}

func checkCommand(args []string, sio stdio) error {
	fs, conn := newCheckFlags()
	text, rest, err := fs.parseArg(args, "FENCE")
	if fs.showHelp(err, sio) {
		return nil
	}
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usagef("check", "unexpected argument %q after FENCE", rest[0])
	}
	f, err := etcdlock.ParseFence(text)
	if err != nil {
		return usagef("check", "%v", err)
	}
	c, err := conn.dial(fs, "check", f.Name, sio)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cli, cfg := c.ctx, c.cli, c.cfg
	qctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	err = etcdlock.CheckFence(qctx, cli, f)
	switch {
	case err == nil:
		fmt.Fprintf(sio.out, "holds: %s (token %d) holds %s\n", f.Key, f.Token, f.Name)
		return nil
	case errors.Is(err, etcdlock.ErrLockLost):
		fmt.Fprintf(sio.out, "lost: %v\n", err)
		return withStatus(exitLost, nil)
	case ctx.Err() == nil && qctx.Err() != nil:
		return withStatus(exitUnavailable, fmt.Errorf("etcd at %s: no answer to the check within %v: %w", endpointList(cfg), queryTimeout, err))
	}
	return c.failed(err)
}
