// Package etcdlock is a family of distributed locks on etcd: as easy as
// sync.Mutex, safe where etcd's concurrency package is not, and fast under
// contention.
//
// A Session holds one etcd lease and keeps it alive; any number of locks
// share it. A Mutex is a sync.Locker, reentrant per goroutine:
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
// one writer), Semaphore (at most N holders), MultiMutex (several locks at
// once, with no deadlock), Mutex.Do (a scoped hold whose function stops when
// the lock is lost), Lead (leader duty with failover), Inspect, Follow,
// FollowLeader and LeaderOf (who holds, waits and leads), and Observer and
// WithLogger. A Session made WithRenewal outlives its leases. Make each lock
// with its New function; all methods are safe for concurrent use.
//
// # Guarantees of every lock
//
// Every lock, Do and Lead take and release holds one way; the methods state
// only what differs.
//
//   - Waiters are served first come, first served, across processes (but for
//     WithLocalHandoff's hand-offs).
//   - A call that returns without the lock leaves no key of its own in etcd
//     where etcd is reachable, also when ctx ends after etcd applied the
//     request; a delete that etcd does not confirm is retried in the
//     background until it succeeds or the key's lease ends (which deletes the
//     key). A try that finds the lock held writes nothing.
//   - The lock methods with a context return ctx.Err() if ctx ended;
//     ErrSessionExpired if the Session ended (WithRenewal: the call's lease);
//     ErrLockLost, changing
//     nothing, to a goroutine that locks again a hold known lost;
//     ErrWouldDeadlock to one that holds what it would wait for; else etcd's
//     error, every time etcd refuses. With a deadline on ctx they return by
//     that deadline + 1 s, even where etcd does not answer.
//   - TryLockFor(ctx, wait) waits at most wait for others (wait <= 0: only
//     try; ctx bounds etcd's answers): (true, nil) held, (false, nil) the wait
//     ran out while others held or waited ahead, (false, err) failed.
//   - The last unlock (but for a hand-off) deletes the key, fenced on its
//     create revision (never a later hold's), on a context detached from ctx
//     and bounded by 3 s. It returns etcd's error if etcd did not confirm the
//     delete (retried as above); ErrLockLost (or ErrSessionExpired) if the key
//     was gone: the critical section may not have been exclusive. The hold
//     ends in every case. With nothing held, an unlock returns ErrNotHeld.
//   - Lock retries other failures with backoff while the Session lives, and
//     panics where the lock can never be taken: a closed Session (or, without
//     WithRenewal, its lease gone), bad input, ErrWouldDeadlock, ErrLockLost.
//     Unlock panics on ErrNotHeld or bad input, and reports nothing else.
//     TryLock never panics; where etcd does not answer it returns false
//     within about 3 s.
//
// # Holds
//
// A hold is one acquisition's key in etcd (a MultiMutex's: one per name),
// until the unlock that deletes it. It belongs to the goroutine that took it,
// which may lock again through any handle of the same Session and name (each
// lock needs its unlock; only the first and the last talk to etcd), or to
// the scope of Do and Lead: the goroutines that use a context derived from
// f's. A Permit is a hold of its own.
//
// Held returns the calling goroutine's hold as one snapshot (a Hold), which
// cannot straddle a hand-off as separate calls can; HoldFrom(ctx) returns a
// Do or Lead scope's. Key, Token, IsOwner and Done are shorthands: a Mutex's,
// and a MultiMutex's Token and Done, describe the Session's one hold of it,
// whichever goroutine asks; an RWMutex's, of which a Session may hold several
// reads, the calling goroutine's (its write hold, else its read hold); a
// Permit's, that permit. With no hold: "", 0, an always-false comparison, a
// closed channel.
//
// # What a lease-based lock cannot promise
//
// A holder paused (GC, swap, a stopped VM) or cut off for longer than the TTL
// may act as if it held the lock while another process has it. A lock alone
// protects only what is checked against etcd. For the rest:
//
//   - Token, the create revision of the hold's key, strictly increases from
//     one owner to the next: pass it with every write, and let the resource
//     reject tokens lower than the highest it has seen. A Fence (Hold.Fence)
//     carries it with the lock's name and key in one printable word;
//     ParseFence reads it back, CheckFence asks etcd whether it still holds,
//     and the package github.com/etcdlock/etcdlock/fence refuses stale ones
//     in SQL and HTTP.
//   - IsOwner makes an etcd Txn fail once the hold has ended or been lost.
//   - Done, the hold's loss signal, stays open through re-locks and closes on
//     the last unlock. While the hold lasts it closes within about 100 ms of
//     its key's delete (by anyone) or its lease's revoke; 2/3 of the TTL after
//     the last keep-alive etcd acknowledged was sent, at least TTL/3 before
//     etcd can expire the lease (never while etcd answers keep-alives, sent
//     every TTL/4, within 5/12 of the TTL); when the Session ends; and at a
//     WithMaxHold cap. Then stop touching the resource; Done does not
//     unlock. Its watch starts at the first call to Done (WithMaxHold: at the
//     acquisition).
//
// # For the people on call
//
// Release breaks a stuck lock (etcdlock release on the command line): it
// deletes a holder's key, fenced on its token, and the holder learns of it
// through Done. WithMaxHold caps every hold of a Session, CapHold one
// call's; WithLockDelay makes an acquisition wait after a crash of the
// holder before it; Waiting (on a Hold or a Permit) says that someone waits
// behind the hold;
// Session.Health and Session.HealthHandler serve probes; WithWatchdog and
// Progress make Do and Lead give up an f that stopped making progress.
//
// # Compatibility and permissions
//
// A Mutex "jobs/nightly" is the key "jobs/nightly/<lease ID in hex>", as for
// etcd's concurrency.Mutex and etcdctl lock: the three exclude each other.
// Unlike them, a Mutex ignores keys nested deeper: "a/b" does not block "a".
// With etcd's authentication on, a lock's role needs read and write on the
// keys that start with "name/" and "etcdlock.fence." (docs/design.md §7);
// DoOnce and etcdlock run --once-per also on those that start with
// "etcdlock.done.", and lease grants for their records.
package etcdlock
