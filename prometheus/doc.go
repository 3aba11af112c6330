// Package etcdlockprom turns the events of etcdlock Sessions into Prometheus
// metrics: how long acquisitions wait and how they end, how long holds last,
// why holds are lost, how releases end, how many holds and acquisitions the
// process has now, and the lease keep-alive's round trip and margin.
//
// A Collector is both an etcdlock.Observer and a prometheus.Collector:
//
//	c := etcdlockprom.New()
//	prometheus.MustRegister(c)
//	s, err := etcdlock.NewSession(client, etcdlock.WithObserver(c))
//
// One Collector may observe any number of Sessions. The metrics, with
// their default namespace "etcdlock":
//
//	etcdlock_acquire_wait_seconds        histogram {primitive, outcome}
//	etcdlock_acquisitions_total          counter   {primitive, outcome, contended}
//	etcdlock_acquisitions_in_progress    gauge     {primitive}
//	etcdlock_hold_duration_seconds       histogram {primitive}
//	etcdlock_holds                       gauge     {primitive}
//	etcdlock_losses_total                counter   {primitive, reason}
//	etcdlock_releases_total              counter   {primitive, result}
//	etcdlock_keepalive_rtt_seconds       histogram
//	etcdlock_keepalive_margin_seconds    gauge
//	etcdlock_keepalive_failures_total    counter
//	etcdlock_events_dropped_total        counter
//
// primitive is mutex, read, write, semaphore or multi (etcdlock.KindMutex
// and the others); outcome is an etcdlock.Outcome, reason an etcdlock.LossReason,
// result ok, fenced_miss or error. WithLockLabel adds the lock's name as the
// label lock to every metric that has primitive. docs/observability.md
// says what each metric means, and gives queries for a dashboard.
//
// The metrics follow the events, which a Session delivers shortly after
// they happen, not at once: a scrape may miss the last few milliseconds. A
// Session that drops events (its observers were too slow) says how many,
// in etcdlock_events_dropped_total; the gauges may then be off until the
// process restarts.
//
// The package is named etcdlockprom, not prometheus, so that a file can
// import it beside client_golang's prometheus package without renaming
// either.
package etcdlockprom
