// Package etcdlockgocron runs the jobs of github.com/go-co-op/gocron/v2
// schedulers on several replicas through etcd, with etcdlock: a Locker
// (gocron.WithDistributedLocker) lets each run of a job happen on one
// replica, and an Elector (gocron.WithDistributedElector) lets only the
// replica that leads run jobs.
//
// The package is named etcdlockgocron, not gocron, so that a file can import
// it beside gocron itself without renaming either. It is a module of its
// own, so that the users of etcdlock alone do not get gocron in their
// module graph.
//
// Locker: gocron calls Lock on every replica at each run of a job, and a
// replica that gets an error skips the run. Lock tries the job's lock once
// (etcdlock.Mutex.TryLockFor with no wait) and returns ErrBusy when another
// replica holds it. The hold lasts for the run, kept alive by the Session's
// lease: a run longer than the TTL keeps its lock, with nothing to renew.
// gocron does not give the locker the run's scheduled time, so a lock
// cannot say which tick a run is for: a job that ends before a slower
// replica tries the same tick lets that replica run it again. WithMinHold
// keeps each lock for at least the given time after it was taken, which
// covers replicas that start the same tick within that time of each other.
//
// Elector: NewElector campaigns in the background (etcdlock.Session.Lead)
// until Close; IsLeader returns nil only while this replica leads.
//
// Neither can stop a run that has started: a run outlives a hold lost while
// it runs (the Session's lease gone, the key deleted), and gocron ignores
// Unlock's error. Make the Session WithRenewal, so that a replica cut off
// for longer than the TTL takes part again with a new lease once it is
// back; without it, the Session ends with its lease, and Lock and IsLeader
// fail from then on.
package etcdlockgocron
