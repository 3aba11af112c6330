// Package etcdlockotel turns the events of etcdlock Sessions into
// OpenTelemetry traces and metrics, through the OpenTelemetry API alone: the
// application chooses and configures the SDK, and passes its providers.
//
//	o := etcdlockotel.New(etcdlockotel.WithTracerProvider(tp), etcdlockotel.WithMeterProvider(mp))
//	s, err := etcdlock.NewSession(client, etcdlock.WithObserver(o))
//
// Nothing is global: without WithTracerProvider no span is made, without
// WithMeterProvider no metric; pass otel.GetTracerProvider() and
// otel.GetMeterProvider() to use the global ones. One Observer may observe
// any number of Sessions.
//
// # Traces
//
// Each lock call that goes to etcd, or waits for a goroutine of this
// process, is a span "etcdlock.acquire", a child of the span in the call's
// context (a Mutex's LockContext, TryLockFor, an RWMutex's read and write
// locks, a Semaphore's permits, a MultiMutex, and the acquisitions of Do,
// DoOnce and Lead), from the call to its end. Its attributes:
//
//	etcdlock.lock.name    the lock's name (a MultiMutex's, joined by commas)
//	etcdlock.lock.kind    mutex, read, write, semaphore or multi
//	etcdlock.outcome      acquired, busy, timed_out, canceled or error
//	etcdlock.contended    whether it found the lock held by another
//	etcdlock.wait         the seconds from the call to its end
//	etcdlock.key          the key, once held
//	etcdlock.token        the fencing token, once held
//	etcdlock.lease        the lease, in hex as etcdctl prints it
//
// An error outcome sets the span's status to Error with the call's error.
//
// A hold is a span of its own, "etcdlock.hold", a sibling of its
// acquisition's under the same parent, from the acquisition to the release:
// a trace viewer draws it as a bar beside the work the caller did while
// holding the lock, and its length is the hold's. Its end is the release
// (the span ends), or a loss: the event "etcdlock.hold.lost" with
// etcdlock.loss.reason (key_deleted, lease_gone, keepalive_silent,
// session_closed, max_hold) at the moment the loss was found, and the
// status Error; the span then ends. Lead's term adds the event
// "etcdlock.term.started" with etcdlock.term; its hand-over
// "etcdlock.handed_over" or "etcdlock.stepped_aside" with
// etcdlock.handover.target.
//
// The spans are made from the Session's events, which a Session delivers
// shortly after they happen, with the times they happened: a span is
// exported a few milliseconds after its end, never on a lock's path. The
// holder the call waited behind is not an attribute: the events do not name
// it (etcdlock.Inspect and the CLI's holders do).
//
// # Metrics
//
// The measures of package etcdlock/prometheus, named as OpenTelemetry's
// conventions name them (attributes etcdlock.lock.kind, and with
// WithLockAttribute etcdlock.lock.name):
//
//	etcdlock.acquire.duration      histogram      s  {kind, outcome}
//	etcdlock.acquisitions          counter           {kind, outcome, contended}
//	etcdlock.acquisitions.active   updowncounter     {kind}
//	etcdlock.hold.duration         histogram      s  {kind}
//	etcdlock.holds                 updowncounter     {kind}
//	etcdlock.losses                counter           {kind, reason}
//	etcdlock.releases              counter           {kind, result}
//	etcdlock.keepalive.rtt         histogram      s
//	etcdlock.keepalive.margin      gauge          s
//	etcdlock.lease.ttl             gauge          s
//	etcdlock.keepalive.failures    counter
//	etcdlock.events.dropped        counter
//
// docs/observability.md puts them beside the Prometheus names.
package etcdlockotel
