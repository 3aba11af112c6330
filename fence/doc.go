// Package fence checks etcdlock fencing tokens where a write lands, so that a
// holder paused or cut off past its lease's TTL cannot write after the next
// holder: the other half of a lease-based lock, which etcd cannot give.
//
// A lock on etcd excludes etcd clients; it cannot stop a holder that was
// paused (GC, a frozen VM) or cut off after it checked its hold, and that
// then writes as if it still held the lock. What can stop it is the
// resource: each write carries the hold's fence (etcdlock.Fence, whose Token
// strictly increases from one holder to the next), and the resource keeps,
// per lock name, the highest token it has accepted and refuses lower ones.
// This package does that:
//
//   - in SQL, through database/sql: Table keeps the highest token per lock in
//     a table of three columns, and admits a write in the transaction that
//     makes it, with one UPDATE written for PostgreSQL, MySQL and SQLite
//     (tested on SQLite, and on PostgreSQL when FENCE_POSTGRES names one;
//     not on MySQL);
//   - over HTTP: Transport adds the fence to a client's requests, and
//     Handler refuses a missing, malformed, foreign or stale one before the
//     handler runs, with a Store of the highest tokens: Memory for one
//     process, SQLStore (a Table) for several.
//
// Fence the reads that a write depends on as well as the write: with only
// the writes fenced, a holder's late write can land between the next
// holder's read and its write, admitted because the next holder has not
// written yet, and that write then undoes it.
//
// The rule is for exclusive holds (a Mutex, an RWMutex's writer, a
// MultiMutex, Do, Lead): an RWMutex's readers and a Semaphore's permits hold
// together, and a fence would refuse the older of two. A server that can
// reach etcd can also ask whether a fence still holds (etcdlock.CheckFence);
// that answer can be stale by the time the write lands, the resource's
// check cannot.
//
// The package imports database/sql but no driver: a program brings its own.
// etcdtest.Resource checks a program's own critical sections in its tests.
package fence
