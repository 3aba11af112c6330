package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/petermattis/goid"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const (
	// tryLockTimeout bounds TryLock, which has no context of its own.
	tryLockTimeout = 2 * time.Second
	// replyGrace is how long the acquire Txn may still run after the call's
	// context ends, so that its outcome is known and not left to chance (D3).
	replyGrace = 250 * time.Millisecond
	// abortTimeout bounds the cleanup of a call that returns without the
	// lock. With replyGrace, LockContext returns within its deadline + 1 s.
	abortTimeout = 500 * time.Millisecond
	// unlockTimeout bounds the delete of UnlockContext.
	unlockTimeout = 3 * time.Second
	// retryTimeout bounds each background retry of a delete.
	retryTimeout = 2 * time.Second
)

var (
	errMalformed = errors.New("etcdlock: malformed reply from etcd")
	// errKeyGone: our key vanished while we waited (deleted by someone, or
	// the lease was revoked).
	errKeyGone = errors.New("etcdlock: lock key deleted while waiting")
	// errBusy: a try found another holder.
	errBusy = errors.New("etcdlock: held by another holder")
)

// A Mutex is a distributed lock on etcd, and a sync.Locker.
//
// The holder is a goroutine. The holding goroutine may lock again, through
// this handle or any other handle with the same Session and name; each lock
// adds one hold and needs one unlock, and only the first lock and the last
// unlock talk to etcd. Every other goroutine, of this process or another,
// waits its turn in FIFO order.
//
// It uses the key scheme of etcd's concurrency.Mutex and etcdctl lock: the
// key name/<lease ID in hex> with the Session's lease, the owner being the
// key with the smallest create revision. A lock taken by any of the three
// excludes the other two, as long as they use different leases.
//
// A Mutex cannot promise mutual exclusion to a resource outside etcd: a
// holder may be paused, or cut off, past its lease's TTL while another
// process takes the lock. Guard such resources with Token or IsOwner.
//
// The zero Mutex is not usable; make one with NewMutex. Its methods are safe
// for use by many goroutines.
type Mutex struct {
	s    *Session
	name string
	pfx  string // name + "/"
	key  string // pfx + lease ID in hex: this process's key for the lock

	st atomic.Pointer[lockState]
}

// NewMutex returns a handle on the lock called name, taken with the lease of
// s. Handles with the same Session and name are the same lock. NewMutex
// writes nothing to etcd and never fails: a nil Session or the empty name
// makes every context method return an error (ErrInvalidArgument,
// ErrInvalidName), TryLock return false, and Lock panic.
func NewMutex(s *Session, name string) *Mutex {
	m := &Mutex{s: s, name: name, pfx: name + "/"}
	if s != nil {
		m.key = fmt.Sprintf("%s%x", m.pfx, s.Lease())
	}
	return m
}

// Name returns the lock's name, as given to NewMutex.
func (m *Mutex) Name() string {
	if m == nil {
		return ""
	}
	return m.name
}

// check returns the error that makes a call on m impossible, if any.
func (m *Mutex) check(ctx context.Context) error {
	switch {
	case m == nil || m.s == nil:
		return fmt.Errorf("%w: nil Session", ErrInvalidArgument)
	case ctx == nil:
		return fmt.Errorf("%w: nil context", ErrInvalidArgument)
	case m.name == "":
		return ErrInvalidName
	}
	return nil
}

// Lock takes the lock, blocking until it is held. It retries what can be
// retried (etcd unreachable, a malformed reply) for as long as the Session
// lives. It panics only where the lock can never be taken: an expired or
// closed Session, the empty name, a nil Session. Use LockContext to get
// those as errors, or to bound the wait.
func (m *Mutex) Lock() {
	backoff := 50 * time.Millisecond
	for {
		err := m.LockContext(context.Background())
		if err == nil {
			return
		}
		if errors.Is(err, ErrSessionExpired) || errors.Is(err, ErrInvalidName) || errors.Is(err, ErrInvalidArgument) {
			panic(fmt.Sprintf("etcdlock: Lock of %q: %v (use LockContext to handle this as an error)", m.Name(), err))
		}
		select {
		case <-time.After(backoff):
		case <-m.s.Done():
		}
		backoff = min(2*backoff, time.Second)
	}
}

// Unlock ends one hold of the calling goroutine. Like sync.Mutex.Unlock, it
// panics if the goroutine holds nothing; use UnlockContext to get
// ErrNotHeld instead. Other failures are not reported: the hold ends all the
// same, and the key is deleted in the background or expires with the lease.
func (m *Mutex) Unlock() {
	err := m.UnlockContext(context.Background())
	if errors.Is(err, ErrNotHeld) || errors.Is(err, ErrInvalidName) || errors.Is(err, ErrInvalidArgument) {
		panic(fmt.Sprintf("etcdlock: Unlock of %q: %v (use UnlockContext to handle this as an error)", m.Name(), err))
	}
}

// TryLock takes the lock if it can without waiting for another holder, and
// reports whether it did. It returns false at once when another goroutine or
// process holds the lock, and writes nothing to etcd then. It also returns
// false when it cannot succeed for any other reason (etcd unreachable for
// 2 s, invalid name, closed Session); it never panics.
func (m *Mutex) TryLock() bool {
	ctx, cancel := context.WithTimeout(context.Background(), tryLockTimeout)
	defer cancel()
	ok, _ := m.acquire(ctx, 0)
	return ok
}

// LockContext takes the lock, waiting until it is held or ctx ends. On
// success it returns nil. On failure it returns ctx.Err() if ctx ended,
// ErrSessionExpired if the Session ended, or etcd's error; it then leaves no
// key of its own in etcd, where etcd is reachable, including when ctx ends
// after etcd applied the request but before the reply came back. Where etcd
// is unreachable, the delete is retried in the background until it succeeds
// or the Session ends.
func (m *Mutex) LockContext(ctx context.Context) error {
	_, err := m.acquire(ctx, -1)
	return err
}

// TryLockFor takes the lock, waiting at most wait for the holder to leave
// (wait <= 0: only try). It returns (true, nil) when held; (false, nil) when
// the wait ran out; (false, err) on failure, with ctx.Err() when ctx ended
// first. A try that fails because another holder has the lock writes nothing
// to etcd; like LockContext, every call that returns without the lock leaves
// no key of its own behind.
func (m *Mutex) TryLockFor(ctx context.Context, wait time.Duration) (bool, error) {
	return m.acquire(ctx, max(wait, 0))
}

// acquire takes one hold for the calling goroutine. wait < 0 waits without
// limit; wait == 0 only tries. It returns (false, nil) when the wait ran out.
func (m *Mutex) acquire(ctx context.Context, wait time.Duration) (bool, error) {
	if err := m.check(ctx); err != nil {
		return false, err
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if m.s.expired() {
		return false, ErrSessionExpired
	}
	gid := goid.Get()
	st := m.record()
	if st.owner == gid {
		st.holds++
		st.mu.Unlock()
		return true, nil
	}
	if wait == 0 && st.busy {
		st.mu.Unlock()
		return false, nil
	}

	opCtx, cancel := m.opContext(ctx, wait)
	defer cancel()
	held, err := st.waitTurn(opCtx)
	if err != nil {
		return m.failed(ctx, opCtx, err)
	}
	if held {
		st.mu.Lock()
		st.owner, st.holds = gid, 1
		st.hold = &hold{done: make(chan struct{})}
		st.mu.Unlock()
		return true, nil
	}
	rev, dirty, err := m.lockEtcd(opCtx, wait == 0)
	for errors.Is(err, errKeyGone) && opCtx.Err() == nil && !m.s.expired() {
		// Our key was deleted while we waited, by hand or by a revoke that
		// the keep-alive has not seen yet: queue again. A revoked lease
		// fails the put with ErrLeaseNotFound.
		rev, dirty, err = m.lockEtcd(opCtx, wait == 0)
	}
	if err != nil {
		m.abort(ctx, st, dirty, rev)
		return m.failed(ctx, opCtx, err)
	}

	st.mu.Lock()
	st.owner, st.holds, st.rev = gid, 1, rev
	st.hold = &hold{done: make(chan struct{})}
	st.mu.Unlock()
	return true, nil
}

// opContext returns ctx, also cancelled when the Session ends and, for
// wait > 0, after wait.
func (m *Mutex) opContext(ctx context.Context, wait time.Duration) (context.Context, context.CancelFunc) {
	var cancel context.CancelFunc
	if wait > 0 {
		ctx, cancel = context.WithTimeout(ctx, wait)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	stop := context.AfterFunc(m.s.cs.Ctx(), cancel)
	return ctx, func() { stop(); cancel() }
}

// failed maps the error of an acquisition that did not take the lock: the
// caller's context first, then the Session, then a try or wait that ran out.
func (m *Mutex) failed(ctx, opCtx context.Context, err error) (bool, error) {
	switch {
	case ctx.Err() != nil:
		return false, ctx.Err()
	case m.s.expired() || errors.Is(err, rpctypes.ErrLeaseNotFound):
		return false, ErrSessionExpired
	case errors.Is(err, errBusy), errors.Is(opCtx.Err(), context.DeadlineExceeded):
		// opCtx has a deadline of its own only for TryLockFor's wait.
		return false, nil
	}
	return false, fmt.Errorf("etcdlock: lock %q: %w", m.name, err)
}

// lockEtcd puts our key in etcd's queue for the lock and waits until it is
// the oldest (try: fails with errBusy instead of waiting). It returns the
// key's create revision. dirty reports that our key may be in etcd after a
// failure; rev is 0 where its revision is unknown.
func (m *Mutex) lockEtcd(ctx context.Context, try bool) (rev int64, dirty bool, err error) {
	c := m.s.client
	if try {
		// D5: a linearizable read, no write, when another holder is there.
		held, err := m.othersHold(ctx)
		if err != nil {
			return 0, false, err
		}
		if held {
			return 0, false, errBusy
		}
	}
	// D3: if ctx ends while etcd applies the Txn, wait a little for the
	// reply rather than guess: a known revision makes the cleanup fenced, and
	// a cleanup sent while the Txn is still in flight could be applied first.
	rctx, cancel := graceContext(ctx, replyGrace)
	defer cancel()
	// Our new key is the newest in etcd, so the two newest keys of the
	// prefix are ours and, usually, our predecessor: no second read.
	resp, err := c.Txn(rctx).
		If(clientv3.Compare(clientv3.CreateRevision(m.key), "=", 0)).
		Then(clientv3.OpPut(m.key, "", clientv3.WithLease(m.s.Lease())),
			clientv3.OpGet(m.pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(2),
				clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend))).
		Else(clientv3.OpGet(m.key)).
		Commit()
	if err != nil {
		// D3: the Txn may have been applied though the reply was lost.
		return 0, true, err
	}
	q, err := acquired(m.pfx, m.key, resp)
	if err != nil {
		return 0, true, err
	}
	if err := ctx.Err(); err != nil {
		return q.rev, true, err
	}
	if !q.known {
		// Our key was already there (WithLease), or the next key was one of
		// a lock nested under ours (D11).
		if q, err = m.predecessor(ctx, q.rev); err != nil {
			return q.rev, true, err
		}
	}
	if q.pred == "" {
		return q.rev, false, nil
	}
	if try {
		return q.rev, true, errBusy
	}
	return q.rev, true, m.waitOwner(ctx, q)
}

// A queuePos is our key's place in the lock's queue, as seen at a revision.
type queuePos struct {
	rev   int64  // our key's create revision
	pred  string // the newest key of the lock created before ours; "": none, we own the lock
	seen  int64  // the revision at which pred was read
	known bool   // false: pred is unknown and must be read
}

// acquired reads the reply of the acquire Txn. A put reply has the two
// newest keys of the prefix: ours, then maybe our predecessor.
func acquired(pfx, key string, resp *clientv3.TxnResponse) (queuePos, error) {
	if resp == nil || resp.Header == nil || resp.Header.Revision <= 0 {
		return queuePos{}, errMalformed
	}
	if !resp.Succeeded {
		// Our key was already there: left by an earlier process with this
		// lease (WithLease). Adopt it, as concurrency.Mutex does.
		if len(resp.Responses) != 1 {
			return queuePos{}, errMalformed
		}
		mine := resp.Responses[0].GetResponseRange()
		if mine == nil || len(mine.Kvs) != 1 || mine.Kvs[0].CreateRevision <= 0 {
			return queuePos{}, errMalformed
		}
		return queuePos{rev: mine.Kvs[0].CreateRevision}, nil
	}
	rev := resp.Header.Revision
	if len(resp.Responses) != 2 {
		return queuePos{}, errMalformed
	}
	newest := resp.Responses[1].GetResponseRange()
	if newest == nil || len(newest.Kvs) == 0 || len(newest.Kvs) > 2 ||
		string(newest.Kvs[0].Key) != key || newest.Kvs[0].CreateRevision != rev {
		return queuePos{}, errMalformed
	}
	q := queuePos{rev: rev, seen: rev, known: true}
	if len(newest.Kvs) == 2 {
		next := newest.Kvs[1]
		if next.CreateRevision >= rev {
			return queuePos{}, errMalformed
		}
		q.pred = string(next.Key)
		q.known = isLockKey(pfx, next.Key)
	}
	return q, nil
}

// isLockKey reports whether key is a waiter's or holder's key of the lock
// with prefix pfx, and not a key of a lock nested under it (D11): a name
// like "a/b" must not block "a".
func isLockKey(pfx string, key []byte) bool {
	rest, ok := strings.CutPrefix(string(key), pfx)
	return ok && !strings.Contains(rest, "/")
}

// othersHold reports whether any key of the lock is in etcd.
func (m *Mutex) othersHold(ctx context.Context) (bool, error) {
	opts := append(clientv3.WithFirstCreate(), clientv3.WithKeysOnly())
	for {
		resp, err := m.s.client.Get(ctx, m.pfx, opts...)
		if err != nil {
			return false, err
		}
		if resp == nil {
			return false, errMalformed
		}
		if len(resp.Kvs) == 0 {
			return false, nil
		}
		kv := resp.Kvs[0]
		if isLockKey(m.pfx, kv.Key) {
			return string(kv.Key) != m.key, nil
		}
		key, err := m.lockKeyAt(ctx, kv.CreateRevision)
		if err != nil {
			return false, err
		}
		if key != "" {
			return key != m.key, nil
		}
		opts = append(opts, clientv3.WithMinCreateRev(kv.CreateRevision+1))
	}
}

// predecessor reads our key's place in the queue: the newest key of the lock
// created before rev, or none when the key at rev holds the lock. It fails
// with errKeyGone if our key at rev is no longer in etcd. It is one
// linearizable read, and no write.
func (m *Mutex) predecessor(ctx context.Context, rev int64) (queuePos, error) {
	q := queuePos{rev: rev, known: true}
	maxRev := rev - 1
	for {
		resp, err := m.s.client.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(m.key), "=", rev)).
			Then(clientv3.OpGet(m.pfx, append(clientv3.WithLastCreate(),
				clientv3.WithMaxCreateRev(maxRev), clientv3.WithKeysOnly())...)).
			Commit()
		if err != nil {
			return q, err
		}
		if resp == nil || resp.Header == nil {
			return q, errMalformed
		}
		if !resp.Succeeded {
			return q, errKeyGone
		}
		if len(resp.Responses) != 1 || resp.Responses[0].GetResponseRange() == nil {
			return q, errMalformed
		}
		q.seen = resp.Header.Revision
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			q.pred = ""
			return q, nil
		}
		if isLockKey(m.pfx, kvs[0].Key) {
			q.pred = string(kvs[0].Key)
			return q, nil
		}
		key, err := m.lockKeyAt(ctx, kvs[0].CreateRevision)
		if err != nil {
			return q, err
		}
		if key != "" {
			q.pred = key
			return q, nil
		}
		maxRev = kvs[0].CreateRevision - 1
	}
}

// lockKeyAt returns a key of the lock created at revision rev, or "" if
// every key created then belongs to a nested lock. One Txn can create keys
// of both, with one revision, so skipping a nested key must not skip its
// revision (D11).
func (m *Mutex) lockKeyAt(ctx context.Context, rev int64) (string, error) {
	resp, err := m.s.client.Get(ctx, m.pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithMinCreateRev(rev), clientv3.WithMaxCreateRev(rev))
	if err != nil {
		return "", err
	}
	if resp == nil {
		return "", errMalformed
	}
	for _, kv := range resp.Kvs {
		if isLockKey(m.pfx, kv.Key) {
			return string(kv.Key), nil
		}
	}
	return "", nil
}

// waitOwner waits until our key, with predecessor q.pred, is the oldest of
// the lock.
//
// D4: it watches the predecessor from now, not from the revision of the read
// that found it: a watch that starts behind the server's revision is
// "unsynced" and served only every 100 ms. If etcd's revision moved between
// that read and the watch, the predecessor is read again once the watch is
// created, so a delete in between is not missed.
func (m *Mutex) waitOwner(ctx context.Context, q queuePos) error {
	var err error
	for err == nil && q.pred != "" {
		q, err = m.waitDelete(ctx, q)
	}
	return err
}

// waitDelete waits until q.pred is deleted and returns our next place.
func (m *Mutex) waitDelete(ctx context.Context, q queuePos) (queuePos, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := m.s.client.Watch(wctx, q.pred, clientv3.WithCreatedNotify(), clientv3.WithFilterPut())
	created := false
	for {
		wr, ok := <-wch
		if !ok {
			if err := ctx.Err(); err != nil {
				return q, err
			}
			return q, errors.New("etcdlock: watch closed")
		}
		if err := wr.Err(); err != nil {
			return q, err
		}
		if wr.Created && !created {
			created = true
			// The watch sees every change after wr.Header.Revision.
			if wr.Header.Revision != q.seen {
				again, err := m.predecessor(ctx, q.rev)
				if err != nil || again.pred != q.pred {
					return again, err
				}
			}
		}
		for _, ev := range wr.Events {
			if ev.Type == mvccpb.DELETE {
				return m.predecessor(ctx, q.rev)
			}
		}
	}
}

// graceContext returns a context that ends grace after ctx ends (or when
// cancel is called), and carries ctx's values.
func graceContext(ctx context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var timer atomic.Pointer[time.Timer]
	stop := context.AfterFunc(ctx, func() { timer.Store(time.AfterFunc(grace, cancel)) })
	return rctx, func() {
		stop()
		if t := timer.Load(); t != nil {
			t.Stop()
		}
		cancel()
	}
}

// release deletes our key if its create revision is rev (rev 0: whatever
// its revision) on a context detached from ctx and bounded by timeout. It
// reports whether a key was deleted.
func (m *Mutex) release(ctx context.Context, rev int64, timeout time.Duration) (bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	cmp := clientv3.Compare(clientv3.CreateRevision(m.key), "=", rev)
	if rev == 0 {
		cmp = clientv3.Compare(clientv3.CreateRevision(m.key), ">", 0)
	}
	resp, err := m.s.client.Txn(ctx).If(cmp).Then(clientv3.OpDelete(m.key)).Commit()
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

// abort ends a failed acquisition that has the turn: it deletes our key if
// it may be in etcd, then passes the turn on. Where etcd does not confirm
// the delete, a background goroutine keeps the turn and retries until the
// delete succeeds or the Session ends, so no later acquisition of this
// process can race with it.
func (m *Mutex) abort(ctx context.Context, st *lockState, dirty bool, rev int64) {
	if dirty && !m.s.expired() {
		if _, err := m.release(ctx, rev, abortTimeout); err != nil {
			m.releaseLater(st, rev)
			return
		}
	}
	st.passTurn()
}

// releaseLater retries the delete of our key in the background, holding the
// turn, and passes the turn on when done.
func (m *Mutex) releaseLater(st *lockState, rev int64) {
	sctx := m.s.cs.Ctx()
	ok := m.s.goBackground(func() {
		defer st.passTurn()
		backoff := 50 * time.Millisecond
		for {
			t := time.NewTimer(backoff)
			select {
			case <-sctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			if _, err := m.release(sctx, rev, retryTimeout); err == nil || sctx.Err() != nil {
				return
			}
			backoff = min(2*backoff, 2*time.Second)
		}
	})
	if !ok {
		st.passTurn()
	}
}

// UnlockContext ends one hold of the calling goroutine. It returns
// ErrNotHeld, and changes nothing, if the goroutine holds none. When the
// last hold ends it deletes the lock's key, fenced on the key's create
// revision so that it can never delete a later hold (D6), on a context
// detached from ctx and bounded by 3 s. If etcd does not confirm the
// delete, UnlockContext returns that error and the delete is retried in the
// background until it succeeds or the Session ends. It returns ErrLockLost
// (or ErrSessionExpired) if the key was already gone: the hold ends all the
// same.
func (m *Mutex) UnlockContext(ctx context.Context) error {
	if err := m.check(ctx); err != nil {
		return err
	}
	gid := goid.Get()
	st := m.peek()
	if st == nil {
		return ErrNotHeld
	}
	if st.owner != gid {
		st.mu.Unlock()
		return ErrNotHeld
	}
	st.holds--
	if st.holds > 0 {
		st.mu.Unlock()
		return nil
	}
	st.owner = 0
	st.hold.end()
	st.hold = nil
	if st.handOff() {
		st.mu.Unlock()
		return nil
	}
	rev := st.rev
	st.rev = 0
	st.mu.Unlock()

	if m.s.expired() {
		st.passTurn()
		return ErrSessionExpired
	}
	deleted, err := m.release(ctx, rev, unlockTimeout)
	if err != nil {
		m.releaseLater(st, rev)
		return fmt.Errorf("etcdlock: unlock %q: %w", m.name, err)
	}
	st.passTurn()
	if !deleted {
		if m.s.expired() {
			return ErrSessionExpired
		}
		return ErrLockLost
	}
	return nil
}

// HoldCount returns the number of holds of the calling goroutine: 0 when it
// does not hold the lock.
func (m *Mutex) HoldCount() int {
	st := m.peek()
	if st == nil {
		return 0
	}
	defer st.mu.Unlock()
	if st.owner != goid.Get() {
		return 0
	}
	return st.holds
}

// Key returns this process's etcd key for the lock while the process holds
// it, whichever goroutine asks, and "" otherwise.
func (m *Mutex) Key() string {
	if m.Token() == 0 {
		return ""
	}
	return m.key
}

// Token returns the fencing token of this process's current hold, whichever
// goroutine asks, and 0 when the process does not hold the lock. The token
// is the create revision of the owner key: it strictly increases from one
// owner to the next, across processes, so a resource that remembers the
// highest token it has seen can reject a stale holder's writes.
func (m *Mutex) Token() int64 {
	st := m.peek()
	if st == nil {
		return 0
	}
	defer st.mu.Unlock()
	return st.rev
}

// IsOwner returns a comparison for a clientv3 Txn that is true only while
// this process's current hold is the owner of the lock: a Txn guarded by it
// fails once the hold has ended or been lost, even if this process locks
// again later. When nothing is held it returns a comparison that is always
// false.
func (m *Mutex) IsOwner() clientv3.Cmp {
	key := "\x00etcdlock/not-held"
	if m != nil && m.key != "" {
		key = m.key
	}
	// No key has a negative create revision.
	rev := int64(-1)
	if t := m.Token(); t != 0 {
		rev = t
	}
	return clientv3.Compare(clientv3.CreateRevision(key), "=", rev)
}
