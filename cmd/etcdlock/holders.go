package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
)

// queryTimeout bounds the reads of holders once etcd has answered.
const queryTimeout = 5 * time.Second

const holdersAbout = `Shows who holds the lock NAME and who waits for it: the holders first, then
the waiters in the order they will be served. For each: the kind of lock,
the etcd key, its create revision (for a holder, the fencing token it was
given), its lease, the seconds left on that lease, and the identity the
holder stored in its key (etcdlock run stores its host, pid and command).
Prints "no holder" if nobody holds or waits.

Every kind of lock of the etcdlock package is shown: mutex (also etcd's
concurrency.Mutex and etcdctl lock), read and write (RWMutex, and etcd's
recipe RWMutex), semaphore (several holders). Keys of other locks nested
under NAME are not shown.

With --watch, prints the same, then again after every change, each time
after an empty line, until interrupted (SIGINT or SIGTERM, exit status 0).
While etcd is unreachable it waits and retries; a change it could not see
then is shown once etcd answers again.

Exit statuses: 0 whether the lock is held or free; 64 usage; 69 etcd
unreachable or refused us; 130 interrupted.
`

// holdersOptions are the flags of holders.
type holdersOptions struct {
	watch bool
	conn  connFlags
}

func newHoldersFlags() (*commandFlags, *holdersOptions) {
	c := newCommandFlags("holders", "[flags] NAME", holdersAbout)
	o := &holdersOptions{}
	c.BoolVar(&o.watch, "watch", false, "print the holders and waiters again after every change, until interrupted")
	c.groups = append(c.groups, flagGroup{title: "Flags", names: []string{"watch"}})
	o.conn.register(c, true)
	return c, o
}

func holdersCommand(args []string, sio stdio) error {
	fs, o := newHoldersFlags()
	name, rest, err := fs.parseName(args)
	if fs.showHelp(err, sio) {
		return nil
	}
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usagef("holders", "unexpected argument %q after NAME", rest[0])
	}
	c, err := o.conn.dial(fs, "holders", name, sio)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cli := c.ctx, c.cli
	if o.watch {
		watchQueue(ctx, cli, name, sio.out)
		return nil
	}
	qctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	entries, err := etcdlock.Inspect(qctx, cli, name)
	if err != nil {
		return c.failed(err)
	}
	q, err := withTTLs(qctx, cli, entries)
	if err != nil {
		return c.failed(err)
	}
	printQueue(sio.out, q)
	return nil
}

// watchQueue prints the queue of the lock name as etcdlock.Follow sends
// it, the first one and each change after an empty line, until ctx ends.
// A TTL that cannot be read within queryTimeout is shown as unknown.
func watchQueue(ctx context.Context, cli *clientv3.Client, name string, w io.Writer) {
	first := true
	for entries := range etcdlock.Follow(ctx, cli, name) {
		qctx, cancel := context.WithTimeout(ctx, queryTimeout)
		q, err := withTTLs(qctx, cli, entries)
		cancel()
		if err != nil {
			q = make([]queued, len(entries))
			for i, e := range entries {
				q[i] = queued{QueueEntry: e, ttl: ttlUnknown}
			}
		}
		if !first {
			fmt.Fprintln(w)
		}
		first = false
		printQueue(w, q)
	}
}

// queued is one key in a lock's queue, with what is left of its lease.
type queued struct {
	etcdlock.QueueEntry
	ttl int64 // seconds left on the lease; -1 if it is gone, ttlUnknown if it could not be read
}

// ttlUnknown is the ttl of a queued key whose lease could not be read.
const ttlUnknown = -2

// withTTLs returns the entries of a lock's queue, with the seconds left on
// each one's lease.
func withTTLs(ctx context.Context, cli *clientv3.Client, entries []etcdlock.QueueEntry) ([]queued, error) {
	q := make([]queued, len(entries))
	ttls := map[clientv3.LeaseID]int64{}
	for i, e := range entries {
		q[i].QueueEntry = e
		if e.Lease == clientv3.NoLease {
			continue
		}
		ttl, ok := ttls[e.Lease]
		if !ok {
			var err error
			if ttl, err = leaseTTL(ctx, cli, e.Lease); err != nil {
				return nil, err
			}
			ttls[e.Lease] = ttl
		}
		q[i].ttl = ttl
	}
	return q, nil
}

// leaseTTL returns the seconds left on lease id, or -1 if it is gone.
func leaseTTL(ctx context.Context, cli *clientv3.Client, id clientv3.LeaseID) (int64, error) {
	resp, err := cli.TimeToLive(ctx, id)
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return -1, nil
	case err != nil:
		return 0, err
	}
	return resp.TTL, nil
}

// printQueue writes q as a table, or "no holder".
func printQueue(w io.Writer, q []queued) {
	if len(q) == 0 {
		fmt.Fprintln(w, "no holder")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ROLE\tKIND\tKEY\tTOKEN\tLEASE\tTTL\tIDENTITY")
	waiters := 0
	for _, e := range q {
		role := "holder"
		if !e.Holds {
			waiters++
			role = fmt.Sprintf("waiter %d", waiters)
		}
		lease, ttl := "-", "-"
		if e.Lease != clientv3.NoLease {
			lease = fmt.Sprintf("%x", int64(e.Lease))
			switch {
			case e.ttl == ttlUnknown:
				ttl = "?"
			case e.ttl < 0:
				ttl = "expired"
			default:
				ttl = fmt.Sprintf("%ds", e.ttl)
			}
		}
		kind := string(e.Kind)
		if e.Weight > 1 {
			kind += fmt.Sprintf("(%d)", e.Weight) // permits taken by one AcquireN
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", role, kind, printable(e.Key), e.Token, lease, ttl, showIdentity(e.Identity))
	}
	tw.Flush()
}

// showIdentity returns an identity for one line of output: "-" if there is
// none.
func showIdentity(id string) string {
	if id == "" {
		return "-"
	}
	return printable(id)
}

// printable returns s as it is if it is printable text, else quoted with Go
// escapes, so that a key or identity cannot break a line or the terminal.
func printable(s string) string {
	for _, r := range s {
		if !unicode.IsPrint(r) || r == utf8.RuneError {
			return strconv.Quote(s)
		}
	}
	return s
}
