// Package etcdlock is a family of distributed locks on etcd: as easy as
// sync.Mutex, safe where etcd's concurrency package is not, and fast under
// contention.
//
// A Session holds one etcd lease and keeps it alive; any number of locks
// share it. A Session made WithRenewal outlives its leases: after a loss it
// takes a new one, for a long-running service. A Mutex is a sync.Locker, reentrant per goroutine with hold
// counts, with TryLock for paths that must not block, TryLockFor for a
// bounded wait, and context methods that leave no key behind when they fail
// or are cancelled:
//
//	s, err := etcdlock.NewSession(client, etcdlock.WithTTL(10*time.Second))
//	if err != nil {
//		return err
//	}
//	defer s.Close()
//	m := etcdlock.NewMutex(s, "jobs/nightly")
//	if err := m.LockContext(ctx); err != nil {
//		return err
//	}
//	defer m.UnlockContext(context.WithoutCancel(ctx))
//
// The rest of the family keeps the same guarantees: RWMutex (many readers or
// one writer, FIFO), Semaphore (at most N holders), MultiMutex (several
// locks at once, in one Txn, with no deadlock), Mutex.Do (a scoped hold
// whose function stops when the lock is lost), Lead and Session.Lead
// (leader duty with failover), Inspect (who holds and who waits), Follow, FollowLeader and
// LeaderOf (the same for followers: who leads, and every change), and
// Observer and WithLogger for what happens to the locks.
//
// # Compatibility
//
// A Mutex uses the keys of etcd's concurrency.Mutex and of etcdctl lock: the
// name "jobs/nightly" is the prefix "jobs/nightly/" and the key
// "jobs/nightly/<lease ID in hex>"; the owner is the oldest key. The three
// exclude each other on the same name. Unlike them, a Mutex ignores keys
// nested deeper under its prefix, so the lock "a/b" does not block "a".
//
// # Permissions
//
// With etcd's authentication on, a lock's role needs read and write
// permission on the keys that start with "name/", and on those that start
// with "etcdlock.fence.": one key per lease, compared by every acquisition
// and written after a lost reply. Its name has no "/", so no lock counts it.
// A request etcd refuses is returned as an error, every time.
//
// # What a lease-based lock cannot promise
//
// etcd guarantees that at most one key is the oldest at any revision. It
// cannot stop a holder that was paused (GC, swap, a stopped VM) or cut off
// for longer than the lease TTL from acting as if it still held the lock
// while another process has taken it. A Mutex alone therefore protects only
// what is checked against etcd itself. For everything else:
//
//   - Token returns a fencing token, the create revision of the owner key,
//     which strictly increases from one owner to the next. Pass it along with
//     every write and let the resource reject tokens lower than the highest it
//     has seen.
//   - IsOwner returns a comparison that makes an etcd Txn fail once the hold
//     has ended or been lost.
//   - Done returns a channel that closes when the hold is lost, or is about to
//     be because keep-alives stopped: stop working when it closes.
package etcdlock
