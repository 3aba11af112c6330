package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// queryTimeout bounds the reads of holders once etcd has answered.
const queryTimeout = 5 * time.Second

const holdersAbout = `Shows who holds the lock NAME and who waits for it, in queue order: the
etcd key, its create revision (for the holder, the fencing token it was
given), its lease and the seconds left on that lease. Prints "no holder" if
the lock is free. Keys nested deeper than NAME/<lease> belong to other locks
and are not shown. Works for locks taken by etcdlock, etcd's
concurrency.Mutex and etcdctl lock alike.

Exit statuses: 0 whether the lock is held or free; 64 usage; 69 etcd
unreachable or refused us.
`

func newHoldersFlags() (*commandFlags, *connFlags) {
	c := newCommandFlags("holders", "[flags] NAME", holdersAbout)
	cf := &connFlags{}
	cf.register(c, true)
	return c, cf
}

func holdersCommand(args []string, sio stdio) error {
	fs, cf := newHoldersFlags()
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
	if err := cf.fromEnv(fs, sio.getenv); err != nil {
		return err
	}
	cfg, err := cf.config("holders")
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cli, err := connect(ctx, cfg, name+"/")
	if err != nil {
		return err
	}
	defer cli.Close()
	qctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	q, err := lockQueue(qctx, cli, name)
	if err != nil {
		return unavailable(cfg, err)
	}
	printQueue(sio.out, q)
	return nil
}

// queued is one key in a lock's queue.
type queued struct {
	key   string
	rev   int64 // create revision
	lease clientv3.LeaseID
	ttl   int64 // seconds left on the lease; -1 if it is gone
}

// lockQueue returns the keys of the lock name, the holder first and then the
// waiters in the order they will get it: by create revision. Keys nested
// deeper than name/<lease> belong to other locks and are skipped, as the
// etcdlock package does.
func lockQueue(ctx context.Context, cli *clientv3.Client, name string) ([]queued, error) {
	pfx := name + "/"
	// Not WithKeysOnly: etcd then answers from its index, without leases.
	// Lock keys have empty values anyway.
	resp, err := cli.Get(ctx, pfx, clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, err
	}
	var q []queued
	ttls := map[clientv3.LeaseID]int64{}
	for _, kv := range resp.Kvs {
		if strings.Contains(strings.TrimPrefix(string(kv.Key), pfx), "/") {
			continue
		}
		e := queued{key: string(kv.Key), rev: kv.CreateRevision, lease: clientv3.LeaseID(kv.Lease)}
		if e.lease != clientv3.NoLease {
			ttl, ok := ttls[e.lease]
			if !ok {
				ttl, err = leaseTTL(ctx, cli, e.lease)
				if err != nil {
					return nil, err
				}
				ttls[e.lease] = ttl
			}
			e.ttl = ttl
		}
		q = append(q, e)
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
	fmt.Fprintln(tw, "ROLE\tKEY\tTOKEN\tLEASE\tTTL")
	for i, e := range q {
		role := "holder"
		if i > 0 {
			role = fmt.Sprintf("waiter %d", i)
		}
		lease, ttl := "-", "-"
		if e.lease != clientv3.NoLease {
			lease = fmt.Sprintf("%x", int64(e.lease))
			ttl = fmt.Sprintf("%ds", e.ttl)
			if e.ttl < 0 {
				ttl = "expired"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", role, e.key, e.rev, lease, ttl)
	}
	tw.Flush()
}
