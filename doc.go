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
// one writer), Semaphore (at most N permits held), MultiMutex (several locks
// at once, with no deadlock); Do, DoOnce and Lead for jobs; tools for the
// people on call. New functions write nothing and never fail (bad input
// fails calls); a Session's handles of a name are one lock; all methods are
// safe for concurrent use.
//
// # Guarantees of every lock
//
// Every lock, Do and Lead take and release holds one way, stated here once:
// RLock and Acquire act as Lock, with their Try and Context forms, and
// Permit.Release as the last UnlockContext.
//
//   - First come, first served across processes (but for WithLocalHandoff).
//   - A call that returns without the lock leaves no key of its own in etcd
//     where etcd is reachable, even when ctx ends after etcd applied the
//     request (an unconfirmed delete is retried in the background until it
//     succeeds or the lease ends). A try that finds the lock held writes
//     nothing.
//   - The calls with a context return ctx.Err() if ctx ended;
//     ErrSessionExpired if the Session ended (WithRenewal: the call's lease);
//     ErrLockLost, changing nothing, to a re-lock of a hold known lost;
//     ErrWouldDeadlock to a goroutine that holds what it would wait for; else
//     etcd's error, whenever etcd refuses; with a deadline on ctx, by that
//     deadline + 1 s, even if etcd is silent.
//   - TryLockFor(ctx, wait) waits at most wait for others (wait <= 0: only
//     try; ctx bounds etcd's answers): (true, nil) held, (false, nil) the wait
//     ran out while others held or waited ahead, (false, err) failed, also
//     while an earlier key's delete is retried.
//   - The last unlock (but for a hand-off) deletes the key, fenced on its
//     create revision, detached from ctx and within 3 s: etcd's error if not
//     confirmed (retried as above); ErrLockLost (or ErrSessionExpired) if the
//     key was gone: the critical section may not have been exclusive. The
//     hold ends in every case. With nothing held: ErrNotHeld.
//   - Lock retries other failures with backoff while the Session lives, and
//     panics where the lock can never be taken: a closed Session (or, without
//     WithRenewal, its lease gone), bad input, ErrWouldDeadlock, ErrLockLost.
//     Unlock panics on ErrNotHeld or bad input, and reports nothing else.
//     TryLock never panics; where etcd does not answer, it returns false
//     within about 3 s.
//
// # Holds
//
// A hold is one acquisition's key in etcd (a MultiMutex's: one per name),
// until the unlock that deletes it. It belongs to the goroutine that took it,
// which may lock again through any handle of the Session and name (each lock
// needs its unlock; only the first and last talk to etcd), or to the scope of
// Do and Lead; a Permit is a hold of its own. Held returns it as one snapshot
// (never straddling a hand-off). Key, Token, IsOwner and Done describe: for a Mutex or MultiMutex, the Session's one hold of it,
// whichever goroutine asks (for a Mutex, a MultiMutex's hold of its name if
// any); for an RWMutex, the calling goroutine's (write, else read); for a
// Permit, itself. With no hold: "", 0, a false comparison, a closed channel.
//
// # What a lease-based lock cannot promise
//
// A holder paused (GC, swap, a stopped VM) or cut off for longer than the TTL
// may act as if it held the lock while another process has it. A lock alone
// protects only what is checked against etcd. For the rest:
//
//   - Token, the create revision of the hold's key, strictly increases from
//     one owner to the next: pass it with every write, and let the resource
//     reject tokens lower than the highest it has seen (a Fence carries it).
//   - IsOwner makes an etcd Txn fail once the hold has ended or been lost.
//   - Done, the hold's loss signal, stays open through re-locks and closes at
//     the last unlock; within about 100 ms of the key's delete (by anyone) or
//     the lease's revoke; at least TTL/3 before etcd can expire the lease
//     (never while keep-alives, sent every TTL/4, are answered within 5/12 of
//     the TTL); when the Session ends; at a cap. Then stop touching the
//     resource: Done does not unlock. It watches from its first call (with a
//     cap: from the acquisition).
//
// # For jobs
//
// Mutex.Do runs f under a hold; DoOnce at most once per slot across
// processes; Lead whenever this process leads a name, with failover (f ends
// its term early by returning StepDown or HandOver). They share one scope:
//
//   - The lock is released only once f has returned, never while it runs;
//     if f panics, the lock is released and the panic goes on.
//   - f's context, derived from ctx, is cancelled when ctx ends, the hold is
//     lost (Done) or f returns: f must then return soon. Goroutines with a
//     context derived from f's hold the lock with f (HoldFrom); holds they
//     leave end with the scope; a context kept after f returned grants none.
//   - WithWatchdog(period): f calls Progress(ctx); a period without, and
//     its context is cancelled, the lock released once it returns
//     (ErrStalled); f still running a period later, the Session is closed.
//
// # For the people on call
//
// They work on any lock, from any process (the command etcdlock too); a
// holder learns what they do to its hold by Done: safe only with fencing.
//
//   - Inspect, LeaderOf, Follow and FollowLeader read the queue, writing
//     nothing; Release deletes one key of it, fenced: it breaks a stuck hold.
//   - WithMaxHold caps every hold of a Session, CapHold one call's (with
//     both, the lesser): d after the acquisition (or a hand-off within the
//     process), Done closes (LossMaxHold), then the key is deleted, fenced,
//     so that the next holds, and the unlock returns ErrLockLost. A re-lock
//     keeps the cap.
//   - WithLockDelay makes an acquisition wait after a crash of the holder
//     ahead; Waiting signals waiters behind a hold; Health serves probes;
//     SetLimit changes a Semaphore's limit.
//
// # Compatibility and permissions
//
// A Mutex "jobs/nightly" is the key "jobs/nightly/<lease ID in hex>", as for
// etcd's concurrency.Mutex and etcdctl lock: the three exclude each other.
// Unlike them, a Mutex ignores keys nested deeper: "a/b" does not block "a".
// Under etcd's authentication, every lock, Do and Lead need what etcd's own
// lock needs, read and write on "name/"; a feature that needs a record asks
// for it only when used (docs/keys.md lists every key and its permission).
package etcdlock
