package etcdlock_test

// The seams of the protocol, for the fault matrix (matrix_test.go): every
// etcd call a lock makes, told apart by its shape and by the phase of the
// case it comes in, and the faults injected at one of them.

import (
	"bytes"
	"context"
	"reflect"
	"slices"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/etcdlock/etcdlock/internal/queue"
)

// A call is one kind of etcd call that a lock makes.
type call string

const (
	callGrant      call = "grant"       // the grant of a lease: Lead's Session's, or a renewing Session's next
	callEnqueue    call = "enqueue"     // the Txn that puts our key and reads its place
	callRequeue    call = "requeue"     // the enqueue after our key was deleted while we waited
	callTry        call = "try"         // a try's Txn that puts our key only if nothing blocks it
	callTryRead    call = "try-read"    // a try's read-only Txn, after a try found the queue blocked
	callRead       call = "read"        // the read of our place, guarded by our key
	callCheck      call = "check"       // the post-watch check: is the key we watch still there
	callPromote    call = "promote"     // a semaphore's wake-up write to the key behind ours
	callCleanup    call = "cleanup"     // the delete of a failed acquisition's key
	callRelease    call = "release"     // the release's fenced delete
	callBackground call = "background"  // a background retry of a delete
	callWatch      call = "watch"       // the wait's watch of what blocks us
	callOwnWatch   call = "own-watch"   // the wait's watch of our own key
	callLossWatch  call = "loss-watch"  // the loss watch's watch of held keys: a key, or a prefix of them
	callLossRead   call = "loss-read"   // the loss watch's read of held keys: a Txn of single-key reads, keys only
	callKeepAlive  call = "keepalive"   // the lease's keep-alive
	callHistory    call = "history"     // a read at a past revision: lock-delay's read of the queue as our key found it
	callLeaseTTL   call = "lease-ttl"   // a lease's time to live: lock-delay's question, whether a lease ahead is gone
	callQueueRead  call = "queue-read"  // a read of a lock's queue at the current revision: CheckFence's, a hand-over's; with a Semaphore's limit record: SetLimit's, ReadLimit's
	callSetLimit   call = "set-limit"   // SetLimit's write of the limit record, guarded by the holders read
	callLimitWatch call = "limit-watch" // a Semaphore's waiter's watch of the limit record, near the head
	callTermRead   call = "term-read"   // a new leader's read of the hand-over record and the term count, guarded by its key
	callTerm       call = "term"        // its put of the term count (and delete of the record), guarded by its key and the count's version
	callAside      call = "aside"       // its check that the candidate handed over to is still queued: compares only
	callHandOver   call = "handover"    // a leader's put of the hand-over record, guarded by its key and the candidate's
)

// A fault is what the matrix does to one call.
type fault string

const (
	faultLost    fault = "lost"    // etcd applies the request; its reply is lost (Unavailable)
	faultDropped fault = "dropped" // the request never reaches etcd (Unavailable)
	faultLate    fault = "late"    // the caller gives up first; etcd applies the request ≥ 1 s later
	faultLagging fault = "lagging" // a watch served from an old revision, as by a member that lags
	faultEvent   fault = "event"   // the first watch response with events is lost
	faultDeleted fault = "deleted" // our key is deleted by hand just before the call
	faultRevoked fault = "revoked" // our lease is revoked just before the call
)

// firstWrite is the revision of etcd's first write, the oldest a watch can
// start from and see it: compactFirstRevision, which makes watches from
// revision 1 fail, keeps it, so that on a shared etcd (ETCDTEST_ENDPOINTS)
// a lagging watch serves old events whether or not another test compacted.
const firstWrite = 2

// lateBy is how long after the caller gave up a late request is applied.
const lateBy = time.Second

// A phase is the part of a case that calls come in: which delete is a
// cleanup and which a release.
type phase int

const (
	phaseSetup   phase = iota // warm-up holds: no fault
	phaseAcquire              // the acquisition under test, and its cleanup
	phaseHold                 // while held
	phaseRelease              // the release, and its background retries
)

// A seam classifies the calls of one client and injects one fault at the
// nth call of one kind. It is a unary and a stream interceptor; it sits
// below clientv3's retry interceptor, so it sees every attempt.
type seam struct {
	at    call
	fault fault
	nth   int
	// hand deletes the actor's keys (faultDeleted) or revokes its leases
	// (faultRevoked); it runs before the call is sent.
	hand func(fault)
	// holder reports whether a key is among the lock's holders (with
	// prefix, whether a holder's key begins with it): a watch of our own
	// key is the wait's before, the loss watch's after.
	holder func(key string, prefix bool) bool
	// lagFrom is the revision a lagging member serves each watch from:
	// firstWrite for the oldest state.
	lagFrom map[call]int64

	mu sync.Mutex
	// bump, if set, moves etcd's revision before the wait's watch is
	// created, so that the watch starts after the read (the check). A
	// watch's creation may be sent after its acquisition returned: set it
	// with setBump.
	bump   func()
	phase  phase
	counts map[call]int
	fired  int
	cancel context.CancelFunc // the caller's context, for faultLate
	late   sync.WaitGroup     // late requests not yet applied
	lateOK int                // late requests applied without error
	queued int                // late requests given up by their caller, to be applied
	leases []clientv3.LeaseID // leases granted through this client
	acks   []time.Time        // when each keep-alive acknowledgement was let through
}

func newSeam(at call, f fault, nth int) *seam {
	return &seam{at: at, fault: f, nth: nth, counts: make(map[call]int)}
}

// setBump sets bump (nil: none).
func (s *seam) setBump(bump func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bump = bump
}

// enter starts phase p; counts start again from 0.
func (s *seam) enter(p phase, cancel context.CancelFunc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.phase, s.cancel = p, cancel
	clear(s.counts)
}

// fires reports how many times the fault was injected.
func (s *seam) fires() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fired
}

// settle waits until every late request has been applied, and returns how
// many were applied without error.
func (s *seam) settle() int {
	s.late.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lateOK
}

// lateQueued returns how many late requests their callers have given up
// on: each is applied lateBy later.
func (s *seam) lateQueued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queued
}

// silence returns how long no keep-alive acknowledgement had come at time
// at: the keep-alive's silence as etcd's replies show it.
func (s *seam) silence(at time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := len(s.acks) - 1; i >= 0; i-- {
		if !s.acks[i].After(at) {
			return at.Sub(s.acks[i])
		}
	}
	return 0
}

// granted returns the leases granted through the client.
func (s *seam) granted() []clientv3.LeaseID {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]clientv3.LeaseID(nil), s.leases...)
}

// isLimitRecord reports whether key, as a client sent it, is a Semaphore's
// limit record. On an external etcd (ETCDTEST_ENDPOINTS) the client's
// prefix, which ends in "/", comes first; the record's own key has no "/"
// (queue.RecordName escapes the name's), so it is the key's last segment.
func isLimitRecord(key []byte) bool {
	return bytes.HasPrefix(key[bytes.LastIndexByte(key, '/')+1:], []byte(queue.LimitRecordPrefix))
}

// classify names a unary call by its request's shape.
func classify(method string, req any) (call, bool) {
	switch method {
	case "/etcdserverpb.Lease/LeaseGrant":
		return callGrant, true
	case "/etcdserverpb.Lease/LeaseTimeToLive":
		return callLeaseTTL, true
	case "/etcdserverpb.KV/Range":
		switch r := req.(*pb.RangeRequest); {
		case r.Revision > 0:
			return callHistory, true
		case len(r.RangeEnd) > 0:
			return callQueueRead, true
		}
		return "", false
	case txnMethod:
	default:
		return "", false
	}
	txn := req.(*pb.TxnRequest)
	if c, ok := classifyRecords(txn); ok {
		return c, true
	}
	var puts, deletes, ranges, prefixRanges, keysOnly int
	limitRead := false
	for _, op := range txn.Success {
		switch {
		case op.GetRequestPut() != nil && isLimitRecord(op.GetRequestPut().Key):
			return callSetLimit, true
		case op.GetRequestRange() != nil && isLimitRecord(op.GetRequestRange().Key):
			limitRead = true
		}
		switch {
		case op.GetRequestPut() != nil:
			puts++
		case op.GetRequestDeleteRange() != nil:
			deletes++
		case op.GetRequestRange() != nil:
			ranges++
			if len(op.GetRequestRange().RangeEnd) > 0 {
				prefixRanges++
			}
			if op.GetRequestRange().KeysOnly {
				keysOnly++
			}
		}
	}
	var prefixCmp, absentCmp, revCmp bool
	for _, c := range txn.Compare {
		switch {
		case len(c.RangeEnd) > 0:
			prefixCmp = true
		case c.Target == pb.Compare_CREATE && c.GetCreateRevision() == 0:
			absentCmp = true
		case c.Target == pb.Compare_CREATE && c.Result == pb.Compare_EQUAL && c.GetCreateRevision() > 0:
			revCmp = true
		}
	}
	switch {
	case deletes > 0:
		return callCleanup, true // or release, or background: by phase and count
	case puts > 0 && prefixCmp:
		return callTry, true
	case puts > 0 && revCmp:
		return callPromote, true
	case puts > 0 && absentCmp:
		return callEnqueue, true // or requeue: by count
	case len(txn.Compare) == 0 && puts == 0 && limitRead && ranges == 2:
		return callQueueRead, true // a Semaphore's queue and its limit record
	case len(txn.Compare) == 0 && puts == 0 && deletes == 0 && prefixRanges == 0 && keysOnly == ranges:
		return callLossRead, true
	case len(txn.Compare) == 0 && puts == 0:
		return callTryRead, true
	case revCmp && prefixRanges > 0:
		return callRead, true
	case revCmp && ranges == 1:
		return callCheck, true
	}
	return "", false
}

// classifyRecords names a Txn of Lead's records (internal/handover): one
// that names the hand-over record or the term count in a compare or an op.
func classifyRecords(txn *pb.TxnRequest) (call, bool) {
	record := func(k []byte) bool {
		return bytes.Contains(k, []byte("etcdlock.handover.")) || bytes.Contains(k, []byte("etcdlock.term."))
	}
	var records, puts, reads, handOver bool
	for _, c := range txn.Compare {
		records = records || record(c.Key)
	}
	for _, op := range txn.Success {
		switch {
		case op.GetRequestPut() != nil:
			k := op.GetRequestPut().Key
			records, puts = records || record(k), true
			handOver = handOver || bytes.Contains(k, []byte("etcdlock.handover."))
		case op.GetRequestRange() != nil:
			records, reads = records || record(op.GetRequestRange().Key), true
		}
	}
	switch {
	case !records:
		return "", false
	case handOver:
		return callHandOver, true
	case puts:
		return callTerm, true
	case reads:
		return callTermRead, true
	}
	return callAside, true
}

// inSetup reports whether the case is in its warm-up, where nothing is
// faulted.
func (s *seam) inSetup() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.phase == phaseSetup
}

// name refines a call's kind by the phase and by how many came before it,
// and counts it. It reports whether the fault is to be injected.
func (s *seam) name(c call) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.phase == phaseSetup {
		return false
	}
	switch c {
	case callEnqueue:
		if s.counts[callEnqueue]++; s.counts[callEnqueue] > 1 {
			c = callRequeue
		}
	case callCleanup:
		// The first delete of a phase is the cleanup, or the release;
		// any later one retries it in the background.
		if s.counts[callCleanup]++; s.counts[callCleanup] > 1 {
			c = callBackground
		} else if s.phase != phaseAcquire {
			c = callRelease
		}
	}
	if c != callEnqueue && c != callCleanup {
		s.counts[c]++
	}
	switch {
	case c != s.at || s.counts[c] < s.nth:
		return false
	case c == callKeepAlive && (s.fault == faultLost || s.fault == faultDropped):
		// From the nth keep-alive on: one lost is no fault.
	case s.counts[c] > s.nth:
		return false
	}
	s.fired++
	return true
}

// precondition reports whether call c is to be dropped to set up the call
// under test: a background retry needs a release that failed.
func (s *seam) precondition(c call) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.at == callBackground && c == callCleanup && s.phase == phaseRelease && s.counts[callCleanup] == 0
}

func (s *seam) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	invoke := func() error { return invoker(ctx, method, req, reply, cc, opts...) }
	c, ok := classify(method, req)
	if ok && s.precondition(c) {
		s.name(c)
		return status.Error(codes.Unavailable, "test: release dropped, to be retried in the background")
	}
	if !ok || !s.name(c) {
		err := invoke()
		if g, ok := reply.(*pb.LeaseGrantResponse); ok && err == nil {
			s.mu.Lock()
			s.leases = append(s.leases, clientv3.LeaseID(g.ID))
			s.mu.Unlock()
		}
		return err
	}
	switch s.fault {
	case faultLost:
		if err := invoke(); err != nil {
			return err
		}
		return status.Error(codes.Unavailable, "test: reply lost")
	case faultDropped:
		return status.Error(codes.Unavailable, "test: request dropped")
	case faultLate:
		return s.applyLate(ctx, method, req, reply, cc, invoker, opts)
	case faultDeleted, faultRevoked:
		s.hand(s.fault)
	}
	return invoke()
}

// applyLate makes the caller give up (its context cancelled, or the RPC's
// own deadline), and applies the request lateBy after that, on a context of
// its own: as a request held up in the network, or in a member's queue.
func (s *seam) applyLate(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption) error {
	s.mu.Lock()
	cancel := s.cancel
	s.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	select {
	case <-ctx.Done():
	case <-time.After(testTimeout):
	}
	req = proto.Clone(req.(proto.Message))
	s.mu.Lock()
	s.queued++
	s.mu.Unlock()
	s.late.Go(func() {
		time.Sleep(lateBy)
		lctx, lcancel := context.WithTimeout(context.Background(), testTimeout)
		defer lcancel()
		again := reflect.New(reflect.TypeOf(reply).Elem()).Interface()
		if err := invoker(lctx, method, req, again, cc, opts...); err == nil {
			s.mu.Lock()
			s.lateOK++
			s.mu.Unlock()
		}
	})
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	return status.Error(codes.DeadlineExceeded, "test: gave up on a late request")
}

func (s *seam) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return cs, err
	}
	switch method {
	case "/etcdserverpb.Watch/Watch":
		return &seamWatch{ClientStream: cs, s: s}, nil
	case "/etcdserverpb.Lease/LeaseKeepAlive":
		return &seamKeepAlive{ClientStream: cs, s: s}, nil
	}
	return cs, nil
}

// seamWatch is a watch stream through a seam: it names each watch it
// creates, and injects the seam's fault into the one the seam picks.
type seamWatch struct {
	grpc.ClientStream
	s *seam

	mu      sync.Mutex
	pending []bool         // creations sent and not yet answered: whether each is faulted
	faulted map[int64]bool // watch IDs whose first events response is to be lost
	lost    map[int64]bool // those whose events response was lost
}

func (w *seamWatch) SendMsg(m any) error {
	req, ok := m.(*pb.WatchRequest)
	cr := req.GetCreateRequest()
	if !ok || cr == nil {
		return w.ClientStream.SendMsg(m)
	}
	c := callOwnWatch
	switch {
	case isLimitRecord(cr.Key):
		c = callLimitWatch
	case w.s.holder != nil && !w.s.inSetup() && w.s.holder(string(cr.Key), lossRange(cr)):
		c = callLossWatch
	}
	if cr.StartRevision == 0 {
		c = callWatch
		w.s.mu.Lock()
		bump := w.s.bump
		w.s.mu.Unlock()
		if bump != nil {
			bump()
		}
	}
	inject := w.s.name(c)
	if inject {
		switch w.s.fault {
		case faultLagging:
			cr = proto.Clone(cr).(*pb.WatchCreateRequest)
			cr.StartRevision = w.s.lagFrom[c]
			m = &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: cr}}
		case faultDeleted, faultRevoked:
			w.s.hand(w.s.fault)
		}
	}
	w.mu.Lock()
	w.pending = append(w.pending, inject && w.s.fault == faultEvent)
	w.mu.Unlock()
	return w.ClientStream.SendMsg(m)
}

// lossRange reports whether cr watches the deletes under a prefix, as the
// loss watch does once it watches more than one key.
func lossRange(cr *pb.WatchCreateRequest) bool {
	return len(cr.RangeEnd) > 0 && string(cr.RangeEnd) == clientv3.GetPrefixRangeEnd(string(cr.Key)) &&
		slices.Contains(cr.Filters, pb.WatchCreateRequest_NOPUT)
}

func (w *seamWatch) RecvMsg(m any) error {
	for {
		err := w.ClientStream.RecvMsg(m)
		resp, ok := m.(*pb.WatchResponse)
		if err != nil || !ok {
			return err
		}
		w.mu.Lock()
		if resp.Created && len(w.pending) > 0 {
			if w.pending[0] {
				if w.faulted == nil {
					w.faulted, w.lost = make(map[int64]bool), make(map[int64]bool)
				}
				w.faulted[resp.WatchId] = true
			}
			w.pending = w.pending[1:]
		}
		drop := len(resp.Events) > 0 && w.faulted[resp.WatchId] && !w.lost[resp.WatchId]
		if drop {
			w.lost[resp.WatchId] = true
		}
		w.mu.Unlock()
		if !drop {
			return nil
		}
	}
}

// seamKeepAlive is a keep-alive stream through a seam. From the nth
// keep-alive on, faultLost drops every acknowledgement (the lease lives on
// in etcd, unknown to us) and faultDropped every request (the lease
// expires); faultDeleted and faultRevoked act once, before the nth.
type seamKeepAlive struct {
	grpc.ClientStream
	s *seam

	mu     sync.Mutex
	silent bool // acknowledgements are dropped
}

func (k *seamKeepAlive) SendMsg(m any) error {
	if _, ok := m.(*pb.LeaseKeepAliveRequest); ok && k.s.name(callKeepAlive) {
		switch k.s.fault {
		case faultDropped:
			return nil
		case faultLost:
			k.mu.Lock()
			k.silent = true
			k.mu.Unlock()
		case faultDeleted, faultRevoked:
			k.s.hand(k.s.fault)
		}
	}
	return k.ClientStream.SendMsg(m)
}

func (k *seamKeepAlive) RecvMsg(m any) error {
	for {
		err := k.ClientStream.RecvMsg(m)
		if _, ok := m.(*pb.LeaseKeepAliveResponse); !ok || err != nil {
			return err
		}
		k.mu.Lock()
		silent := k.silent
		k.mu.Unlock()
		if !silent {
			k.s.mu.Lock()
			k.s.acks = append(k.s.acks, time.Now())
			k.s.mu.Unlock()
			return nil
		}
	}
}
