package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/etcdlock/etcdlock"
)

// exitDataErr is limit's status when the queue of NAME is not a
// Semaphore's of one limit: SetLimit refuses it.
const exitDataErr = 65 // EX_DATAERR

const limitAbout = `Shows the limit in force of the Semaphore NAME, or with N records N as its
limit: every holder of NAME, made with any limit, then admits permits while
they fit within N. Holders above a lowered limit keep their permits; new
acquisitions wait until the permits held fit within it. A raised limit
admits waiters at once. The record stays until it is deleted by hand
(etcdctl del etcdlock.limit.NAME, "/" and "%" in NAME written %2F and
%25); every holder must run etcdlock v1.1 or later.

Exit statuses: 0 shown or set; 64 usage (N not a positive integer); 65 the
queue of NAME is not a Semaphore's of one limit, or its holders and first
waiter are more than 120 keys (too many to lower the limit under); 69 etcd unreachable or refused us, or
no quiet moment to lower the limit in within 5 s; 130 interrupted.
`

func newLimitFlags() (*commandFlags, *connFlags) {
	c := newCommandFlags("limit", "[flags] NAME [N]", limitAbout)
	conn := &connFlags{}
	conn.register(c, true)
	return c, conn
}

func limitCommand(args []string, sio stdio) error {
	fs, conn := newLimitFlags()
	name, rest, err := fs.parseName(args)
	if fs.showHelp(err, sio) {
		return nil
	}
	if err != nil {
		return err
	}
	set := 0
	switch {
	case len(rest) > 1:
		return usagef("limit", "unexpected argument %q after N", rest[1])
	case len(rest) == 1:
		if set, err = strconv.Atoi(rest[0]); err != nil || set < 1 {
			return usagef("limit", "N must be a positive integer, got %q", rest[0])
		}
	}
	c, err := conn.dial(fs, "limit", name, sio)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cli := c.ctx, c.cli
	qctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	if set > 0 {
		err := etcdlock.SetLimit(qctx, cli, name, set)
		switch {
		case errors.Is(err, etcdlock.ErrLimitMismatch), errors.Is(err, etcdlock.ErrInvalidArgument):
			return withStatus(exitDataErr, err)
		case err != nil:
			return c.failed(err)
		}
	}
	n, err := etcdlock.ReadLimit(qctx, cli, name)
	switch {
	case errors.Is(err, etcdlock.ErrLimitMismatch):
		return withStatus(exitDataErr, err)
	case err != nil:
		return c.failed(err)
	case n == 0:
		fmt.Fprintf(sio.out, "%s: no limit recorded, and no permit held\n", printable(name))
	default:
		fmt.Fprintf(sio.out, "%s: limit %d\n", printable(name), n)
	}
	return nil
}
