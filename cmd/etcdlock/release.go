package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/etcdlock/etcdlock"
)

// exitNothing is release's status when there was nothing to release: no
// holder, or no key of the queue matches --lock-key or --token.
const exitNothing = 66 // EX_NOINPUT

const releaseAbout = `Breaks a stuck lock: deletes the keys of the holders of the lock NAME, or
the one key given by --lock-key or --token (a holder's or a waiter's), as
etcdlock holders shows them. Each delete is fenced on the key's token: a key
put again since (a later hold) is never deleted.

A holder of the etcdlock package learns of it at once: its loss signal
(Done) fires, its unlock returns ErrLockLost, etcdlock run stops its command
(exit status 74). Its writes fenced on the token, or guarded by IsOwner, are
refused. A holder that checks neither goes on as if it held: release a lock
only where the resource is fenced, or the holder is known dead. Of a
MultiMutex's hold, only the key of NAME goes: its keys of other names stay
until it unlocks or its lease ends.

Shows the keys, then asks for a confirmation on standard input, unless
--yes is given.

Exit statuses: 0 every key released (or gone already); 1 not confirmed;
64 usage; 66 no holder, or no such key; 69 etcd unreachable or refused us;
130 interrupted (before the confirmation: nothing was released).
`

// releaseOptions are the flags of release.
type releaseOptions struct {
	key   string
	token int64
	yes   bool
	conn  connFlags
}

func newReleaseFlags() (*commandFlags, *releaseOptions) {
	c := newCommandFlags("release", "[flags] NAME", releaseAbout)
	o := &releaseOptions{}
	// --key is etcdctl's TLS key file, as in every command.
	c.StringVar(&o.key, "lock-key", "", "release only this `key` of the queue (the KEY column of holders)")
	c.Int64Var(&o.token, "token", 0, "release only the key with this `token` (the TOKEN column of holders)")
	c.BoolVar(&o.yes, "yes", false, "do not ask for a confirmation")
	c.groups = append(c.groups, flagGroup{title: "Flags", names: []string{"lock-key", "token", "yes"}})
	o.conn.register(c, true)
	return c, o
}

func releaseCommand(args []string, sio stdio) error {
	fs, o := newReleaseFlags()
	name, rest, err := fs.parseName(args)
	if fs.showHelp(err, sio) {
		return nil
	}
	if err != nil {
		return err
	}
	switch {
	case len(rest) > 0:
		return usagef("release", "unexpected argument %q after NAME", rest[0])
	case o.token < 0:
		return usagef("release", "--token must be positive, got %d", o.token)
	case o.key != "" && !strings.HasPrefix(o.key, name+"/"):
		return usagef("release", "--lock-key %q is not a key of the lock %q (its keys begin with %q)", o.key, name, name+"/")
	}
	c, err := o.conn.dial(fs, "release", name, sio)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cli := c.ctx, c.cli
	qctx, cancel := context.WithTimeout(ctx, queryTimeout)
	entries, err := etcdlock.Inspect(qctx, cli, name)
	var q []queued
	if err == nil {
		q, err = withTTLs(qctx, cli, o.targets(entries))
	}
	cancel()
	if err != nil {
		return c.failed(err)
	}
	if len(q) == 0 {
		if o.key != "" || o.token != 0 {
			return withStatus(exitNothing, fmt.Errorf("release %q: no key of its queue matches --lock-key %q --token %d", name, o.key, o.token))
		}
		return withStatus(exitNothing, fmt.Errorf("release %q: no holder", name))
	}
	printQueue(sio.out, q)
	if !o.yes {
		// From the question on, an interrupt ends the command at once (the
		// default action, which dial's catching had replaced): before the
		// answer, nothing is released.
		signal.Reset(os.Interrupt, syscall.SIGTERM)
	}
	if !o.yes && !confirm(sio, fmt.Sprintf("Release %d key(s) of %q? [y/N] ", len(q), name)) {
		return withStatus(exitFailed, errors.New("release: not confirmed; nothing released (--yes releases without asking)"))
	}
	for _, e := range q {
		rctx, cancel := context.WithTimeout(ctx, queryTimeout)
		err := etcdlock.Release(rctx, cli, name, e.QueueEntry)
		cancel()
		switch {
		case errors.Is(err, etcdlock.ErrNotHeld):
			fmt.Fprintf(sio.out, "gone already: %s (token %d)\n", printable(e.Key), e.Token)
		case err != nil:
			return c.failed(err)
		default:
			fmt.Fprintf(sio.out, "released: %s (token %d)\n", printable(e.Key), e.Token)
		}
	}
	return nil
}

// targets returns the entries release deletes: those that match --lock-key
// and --token, if either is given; else the holders.
func (o *releaseOptions) targets(entries []etcdlock.QueueEntry) []etcdlock.QueueEntry {
	var out []etcdlock.QueueEntry
	for _, e := range entries {
		match := e.Holds
		if o.key != "" || o.token != 0 {
			match = (o.key == "" || e.Key == o.key) && (o.token == 0 || e.Token == o.token)
		}
		if match {
			out = append(out, e)
		}
	}
	return out
}

// confirm asks question on standard error and reports whether the answer
// read from standard input is yes.
func confirm(sio stdio, question string) bool {
	fmt.Fprint(sio.err, question)
	if sio.in == nil {
		fmt.Fprintln(sio.err)
		return false
	}
	answer, err := bufio.NewReader(sio.in).ReadString('\n')
	if err != nil && answer == "" {
		fmt.Fprintln(sio.err)
		return false
	}
	switch strings.ToLower(strings.TrimSpace(answer)) {
	case "y", "yes":
		return true
	}
	return false
}
