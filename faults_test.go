package etcdlock_test

// Fault injection: gRPC interceptors that act on a client's calls to etcd
// (txnFault, watchRecorder, eventDropper), and an etcd in a child process
// that serves the v3lock gRPC service.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3lock/v3lockpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/etcdlock/etcdlock/etcdtest"
)

const txnMethod = "/etcdserverpb.KV/Txn"

// txnFault acts on chosen Txn calls of a client: armed, it lets skip Txns
// through, then hands the next n to act, which decides whether and how to
// call etcd. It sits below clientv3's own retry interceptor, so it sees every
// attempt.
type txnFault struct {
	mu    sync.Mutex
	skip  int
	n     int
	act   func(ctx context.Context, invoke func() error) error
	fired int
}

func (f *txnFault) arm(skip, n int, act func(ctx context.Context, invoke func() error) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.skip, f.n, f.act, f.fired = skip, n, act, 0
}

// count returns how many Txns the armed action acted on.
func (f *txnFault) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fired
}

func (f *txnFault) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	invoke := func() error { return invoker(ctx, method, req, reply, cc, opts...) }
	if method != txnMethod {
		return invoke()
	}
	f.mu.Lock()
	var act func(context.Context, func() error) error
	switch {
	case f.n == 0:
	case f.skip > 0:
		f.skip--
	default:
		f.n--
		f.fired++
		act = f.act
	}
	f.mu.Unlock()
	if act == nil {
		return invoke()
	}
	return act(ctx, invoke)
}

// cancelAfterApply makes the Txn reach etcd, then cancels the caller's
// context. With lose, the reply is lost: the call waits until its RPC context
// ends and fails as a cancelled RPC does, so the caller cannot know that etcd
// applied it. Without, the reply comes back after the cancel.
func cancelAfterApply(cancel context.CancelFunc, lose bool) func(context.Context, func() error) error {
	return func(ctx context.Context, invoke func() error) error {
		err := invoke()
		cancel()
		if err != nil || !lose {
			return err
		}
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-time.After(testTimeout):
			return errors.New("test: the RPC context never ended after the caller's was cancelled")
		}
	}
}

// failWith fails the Txn with err without sending it.
func failWith(err error) func(context.Context, func() error) error {
	return func(context.Context, func() error) error { return err }
}

// watchCreate is one watch creation seen on a client's watch stream.
type watchCreate struct {
	key     string
	end     string // the range's end; "" for one key
	start   int64  // the requested start revision; 0 is "from now"
	before  int64  // the store's revision, read just before the request was sent
	created int64  // the header revision of etcd's "created" reply; 0 if none came
}

// watchRecorder is a stream interceptor that records every watch created on
// a client, with the store's revision just before.
type watchRecorder struct {
	rev    func() int64
	prefix string // of the client's keys as sent (serverPrefix): "" on an embedded etcd

	mu      sync.Mutex
	creates []*watchCreate
}

// watching reports whether a watch of key, alone or in a range, has been
// created. The recorded keys are as sent, with the client's prefix.
func (r *watchRecorder) watching(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	key = r.prefix + key
	for _, c := range r.creates {
		covers := c.key == key || c.end != "" && c.key <= key && key < c.end
		if covers && c.created != 0 {
			return true
		}
	}
	return false
}

func (r *watchRecorder) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || method != "/etcdserverpb.Watch/Watch" {
		return cs, err
	}
	return &recordingStream{ClientStream: cs, r: r}, nil
}

func (r *watchRecorder) list() []watchCreate {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []watchCreate
	for _, c := range r.creates {
		out = append(out, *c)
	}
	return out
}

// recordingStream matches creations to their "created" replies in order:
// clientv3 sends a stream's next creation only once the last one is created.
type recordingStream struct {
	grpc.ClientStream
	r       *watchRecorder
	pending []*watchCreate
}

func (s *recordingStream) SendMsg(m any) error {
	if req, ok := m.(*pb.WatchRequest); ok {
		if cr := req.GetCreateRequest(); cr != nil {
			c := &watchCreate{key: string(cr.Key), end: string(cr.RangeEnd), start: cr.StartRevision, before: s.r.rev()}
			s.r.mu.Lock()
			s.r.creates = append(s.r.creates, c)
			s.pending = append(s.pending, c)
			s.r.mu.Unlock()
		}
	}
	return s.ClientStream.SendMsg(m)
}

func (s *recordingStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if resp, ok := m.(*pb.WatchResponse); ok && err == nil && resp.Created && resp.Header != nil {
		s.r.mu.Lock()
		if len(s.pending) > 0 {
			s.pending[0].created = resp.Header.Revision
			s.pending = s.pending[1:]
		}
		s.r.mu.Unlock()
	}
	return err
}

// eventDropper swallows, once armed, the first watch response that reports
// the delete of one key, as etcd's watch bugs have (#17529, #18089, #19179,
// #20221). It sees the key as sent, which ends with the key the test names:
// on an external etcd, the client's prefix comes first.
type eventDropper struct {
	mu      sync.Mutex
	key     string
	dropped int
}

func (d *eventDropper) arm(key string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.key = key
}

func (d *eventDropper) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dropped
}

func (d *eventDropper) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || method != "/etcdserverpb.Watch/Watch" {
		return cs, err
	}
	return &droppingStream{ClientStream: cs, d: d}, nil
}

type droppingStream struct {
	grpc.ClientStream
	d *eventDropper
}

func (s *droppingStream) RecvMsg(m any) error {
	for {
		err := s.ClientStream.RecvMsg(m)
		resp, ok := m.(*pb.WatchResponse)
		if err != nil || !ok || !s.d.drop(resp) {
			return err
		}
	}
}

// drop reports whether resp is the armed delete, and disarms.
func (d *eventDropper) drop(resp *pb.WatchResponse) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, ev := range resp.Events {
		if d.key != "" && ev.Type == mvccpb.DELETE && strings.HasSuffix(string(ev.Kv.Key), d.key) {
			d.key = ""
			d.dropped++
			return true
		}
	}
	return false
}

// chainStreams returns a stream interceptor that runs first, then second.
func chainStreams(first, second grpc.StreamClientInterceptor) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		inner := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			return second(ctx, desc, cc, method, streamer, opts...)
		}
		return first(ctx, desc, cc, method, inner, opts...)
	}
}

const v3lockServerEnv = "ETCDLOCK_TEST_V3LOCK_SERVER"

// v3lockServer starts an embedded etcd in a child process and returns a
// client of it, closed by t.Cleanup. The v3lock service runs on an
// in-process client that etcd never closes: its lease keep-alive goroutines
// outlive the server, which goleak would report in this process.
func v3lockServer(t *testing.T) *clientv3.Client {
	t.Helper()
	endpoint, _ := childServer(t)
	return interceptedClient(t, []string{endpoint}, nil, nil)
}

// childServer starts an embedded etcd in a child process (runV3lockServer)
// and returns its client URL and the child's process id, whose CPU time and
// memory a benchmark may read. The child stops etcd and exits at tb.Cleanup.
func childServer(tb testing.TB) (endpoint string, pid int) {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), v3lockServerEnv+"=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	endpoints := make(chan string, 1)
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if ep, ok := strings.CutPrefix(sc.Text(), "endpoint "); ok {
				endpoints <- ep
			}
		}
	}()
	tb.Cleanup(func() {
		_ = stdin.Close() // the child stops etcd and exits
		select {
		case <-drained:
		case <-time.After(testTimeout):
			_ = cmd.Process.Kill()
			<-drained
		}
		_ = cmd.Wait()
	})
	select {
	case ep := <-endpoints:
		return ep, cmd.Process.Pid
	case <-drained:
		tb.Fatalf("etcd child process exited without an endpoint: %s", stderr.String())
	case <-time.After(testTimeout):
		tb.Fatal("etcd child process gave no endpoint in time")
	}
	return "", 0
}

// runV3lockServer is the child process of v3lockServer, run from TestMain:
// it serves etcd until its stdin closes, then exits before goleak looks at
// the v3lock service's leftover goroutines.
func runV3lockServer() {
	srv, err := etcdtest.New()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("endpoint", srv.Endpoints()[0])
	_, _ = io.Copy(io.Discard, os.Stdin)
	srv.Close()
	os.Exit(0)
}

// v3Lock is a lock through etcd's v3lock gRPC service, which runs the same
// algorithm inside the server (`etcdctl lock` runs concurrency.Mutex in the
// client). Each Lock call gets a lease of its own, revoked when
// the call fails or the lock is released, so that the server's cleanup of a
// timed-out call can never remove the key of a later one.
type v3Lock struct {
	client *clientv3.Client
	lc     v3lockpb.LockClient
	name   string
	lease  clientv3.LeaseID // of the current hold
	key    []byte
}

func newV3Lock(t *testing.T, client *clientv3.Client, name string) *v3Lock {
	l := &v3Lock{client: client, lc: v3lockpb.NewLockClient(client.ActiveConnection()), name: name}
	t.Cleanup(func() { l.revoke(l.lease) })
	return l
}

func (l *v3Lock) revoke(id clientv3.LeaseID) {
	if id == clientv3.NoLease {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = l.client.Revoke(ctx, id)
}

func (l *v3Lock) Lock(ctx context.Context) error {
	grant, err := l.client.Grant(ctx, 30)
	if err != nil {
		return err
	}
	resp, err := l.lc.Lock(ctx, &v3lockpb.LockRequest{Name: []byte(l.name), Lease: int64(grant.ID)})
	if err != nil {
		l.revoke(grant.ID)
		if code := status.Code(err); (code == codes.DeadlineExceeded || code == codes.Canceled) && ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
	l.lease, l.key = grant.ID, resp.Key
	return nil
}

// TryLock is a Lock with a short deadline: the service has no try.
func (l *v3Lock) TryLock(ctx context.Context) (bool, error) {
	tctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	err := l.Lock(tctx)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return false, nil
	}
	return err == nil, err
}

func (l *v3Lock) Unlock(ctx context.Context) error {
	_, err := l.lc.Unlock(ctx, &v3lockpb.UnlockRequest{Key: l.key})
	l.revoke(l.lease)
	l.lease, l.key = clientv3.NoLease, nil
	return err
}

func (l *v3Lock) Key() string { return string(l.key) }
