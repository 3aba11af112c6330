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
// one writer), Semaphore (at most N permits held at once) and MultiMutex
// (several locks at once, with no deadlock); Do, DoOnce and Lead for jobs,
// and tools for the people on call (sections below). Make each lock with its
// New function, which writes nothing and never fails (a nil Session or the
// empty name makes the calls fail); handles of one Session and name are one
// lock. All methods are safe for concurrent use. A Session made WithRenewal
// outlives its leases.
//
// # Guarantees of every lock
//
// Every lock, Do and Lead take and release holds one way; the methods state
// only what differs. RLock, Acquire and their Try and Context forms behave as
// Lock's; Permit.Release as the last UnlockContext.
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
//     ErrLockLost, changing nothing, to a goroutine that locks again a hold
//     known lost; ErrWouldDeadlock to one that holds what it would wait for;
//     else etcd's error, every time etcd refuses. With a deadline on ctx they
//     return by that deadline + 1 s, even where etcd does not answer.
//   - TryLockFor(ctx, wait) waits at most wait for others (wait <= 0: only
//     try; ctx bounds etcd's answers): (true, nil) held, (false, nil) the wait
//     ran out while others held or waited ahead, (false, err) failed; while
//     an earlier key's delete is retried in the background, an error saying
//     so rather than (false, nil).
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
// the scope of Do and Lead. A Permit is a hold of its own.
//
// Held returns the calling goroutine's hold as one snapshot (a Hold), which
// cannot straddle a hand-off as separate calls can; HoldFrom(ctx) returns a
// Do or Lead scope's. Key, Token, IsOwner and Done are shorthands: a Mutex's,
// and a MultiMutex's Token and Done, describe the Session's one hold of it,
// whichever goroutine asks (a Mutex's that of a MultiMutex of the Session
// holding its name, and its key of that name); an RWMutex's, of which a
// Session may hold several reads, the calling goroutine's (its write hold,
// else its read hold); a Permit's, that permit. With no hold: "", 0, an
// always-false comparison, a closed channel.
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
//     carries it with the lock's name and key in one printable word, for the
//     package github.com/etcdlock/etcdlock/fence or CheckFence.
//   - IsOwner makes an etcd Txn fail once the hold has ended or been lost.
//   - Done, the hold's loss signal, stays open through re-locks and closes on
//     the last unlock. While the hold lasts it closes within about 100 ms of
//     its key's delete (by anyone) or its lease's revoke; at least TTL/3
//     before etcd can expire the lease (2/3 of the TTL after the last
//     acknowledged keep-alive was sent; never while etcd answers keep-alives,
//     sent every TTL/4, within 5/12 of the TTL); when the Session ends; and
//     at a cap. Then stop touching the resource; Done does not unlock. Its
//     watch starts at the first call to Done (with a cap: at the acquisition).
//
// # For jobs
//
// Mutex.Do runs a function f under a hold; DoOnce runs it at most once per
// slot (a night, say) across processes; Lead runs it whenever this process
// leads a name, with failover, and f ends a term early by returning StepDown
// or HandOver. All of them share one scope:
//
//   - f runs only while held, and the lock is released only once f has
//     returned, never while it runs; if f panics, the lock is released and
//     the panic goes on.
//   - f's context, derived from ctx, is cancelled when ctx ends, when the
//     hold's Done closes, or when f returns: f must then return soon. The
//     goroutines that use a context derived from f's hold the lock with f
//     (they do not exclude each other); holds they leave end with the scope,
//     and a context kept after f returned grants nothing. HoldFrom gives
//     them the hold, to fence with.
//   - WithWatchdog(period): f reports progress with Progress(ctx); after a
//     period without, f's context is cancelled and the lock released once f
//     returns (ErrStalled); if f has not returned a period later, the Session
//     is closed, which revokes its lease and frees all its locks.
//
// # For the people on call
//
// These work on a lock of any kind, by its name, from any process; what they
// do to a hold its holder learns through Done (HoldLost, with the reason), as
// any loss, so they make a lock safe only for a resource fenced on the token
// or guarded by IsOwner.
//
//   - Inspect, LeaderOf, Follow and FollowLeader read the queue (who holds,
//     who waits) and write nothing; Release deletes one key of it, fenced on
//     its token: it breaks a stuck hold.
//   - WithMaxHold caps every hold of a Session, CapHold one call's: once d
//     has passed since the acquisition, Done closes (LossMaxHold), then the
//     key is deleted, fenced on its token, so that the next in the queue
//     holds, and the unlock returns ErrLockLost. A hold ended before d is not
//     touched. With both, the lesser applies. The cap is the key's: a re-lock
//     keeps it, and a hold handed on in the process (WithLocalHandoff)
//     counts it from the hand-off.
//   - WithLockDelay makes an acquisition wait after a crash of the holder
//     ahead; Waiting (of a Hold or a Permit) says that someone waits behind
//     a hold; Session.Health and HealthHandler serve probes; SetLimit changes
//     a Semaphore's limit.
//
// The command etcdlock (cmd/etcdlock) does the same from a shell.
//
// # Compatibility and permissions
//
// A Mutex "jobs/nightly" is the key "jobs/nightly/<lease ID in hex>", as for
// etcd's concurrency.Mutex and etcdctl lock: the three exclude each other.
// Unlike them, a Mutex ignores keys nested deeper: "a/b" does not block "a".
// With etcd's authentication on, a lock's role needs read and write on the
// keys that start with "name/" and "etcdlock.fence." (docs/design.md §7);
// Lead also on etcdlock.term.NAME and etcdlock.handover.NAME; DoOnce and
// etcdlock run --once-per also on the keys that start with "etcdlock.done.",
// and lease grants for their records; a Semaphore reads etcdlock.limit.NAME,
// and SetLimit writes it (README, Permissions). "/" and "%" in NAME are
// written %2F and %25.
package etcdlock
