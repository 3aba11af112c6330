package etcdlock_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// lagWatches is a stream interceptor that serves every watch with a start
// revision from revision 1 instead, as a member that lags far behind the one
// that answered the read before it would: the watch delivers history the
// read has already seen.
func lagWatches(rewritten *atomic.Int64) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil || method != "/etcdserverpb.Watch/Watch" {
			return cs, err
		}
		return &laggingWatch{ClientStream: cs, rewritten: rewritten}, nil
	}
}

type laggingWatch struct {
	grpc.ClientStream
	rewritten *atomic.Int64
	held      []*pb.WatchResponse // responses split one event each, not yet received
}

// RecvMsg hands the caller one event per response, as a member catching up
// may send them: the replayed history is seen step by step, not at once.
func (w *laggingWatch) RecvMsg(m any) error {
	out, ok := m.(*pb.WatchResponse)
	if !ok {
		return w.ClientStream.RecvMsg(m)
	}
	if len(w.held) == 0 {
		if err := w.ClientStream.RecvMsg(m); err != nil {
			return err
		}
		if len(out.Events) <= 1 {
			return nil
		}
		for _, ev := range out.Events {
			one := proto.Clone(out).(*pb.WatchResponse)
			one.Events = []*mvccpb.Event{ev}
			w.held = append(w.held, one)
		}
	}
	proto.Reset(out)
	proto.Merge(out, w.held[0])
	w.held = w.held[1:]
	return nil
}

func (w *laggingWatch) SendMsg(m any) error {
	if req, ok := m.(*pb.WatchRequest); ok {
		if cr := req.GetCreateRequest(); cr != nil && cr.StartRevision > 1 {
			cr = proto.Clone(cr).(*pb.WatchCreateRequest)
			cr.StartRevision = 1
			w.rewritten.Add(1)
			m = &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: cr}}
		}
	}
	return w.ClientStream.SendMsg(m)
}

// TestFollowLaggingWatch: FollowLeader's watch is served by a member that
// lags: it replays, one event at a time, an earlier leader's put and delete. The follower must
// never report that earlier leader, nor nobody, while the current one leads;
// and it still sees the next change.
func TestFollowLaggingWatch(t *testing.T) {
	testflags.Parallel(t)
	srv, client := startServer(t)
	ctx := testContext(t)
	name := lockName(t)

	earlier := etcdlock.NewMutex(newSession(t, client), name)
	if err := earlier.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	if err := earlier.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
	current := etcdlock.NewMutex(newSession(t, client), name)
	if err := current.LockContext(ctx); err != nil {
		t.Fatal(err)
	}

	var rewritten atomic.Int64
	lagging := serverClient(t, srv, nil, lagWatches(&rewritten))
	s := followLeader(t, lagging, name)
	s.wait(t, "the current leader", 0, func(e etcdlock.QueueEntry) bool { return e.Key == current.Key() })
	time.Sleep(500 * time.Millisecond) // the replayed history arrives meanwhile
	if rewritten.Load() == 0 {
		t.Fatal("no watch was served from an older revision: the test tested nothing")
	}
	for _, g := range s.all() {
		if g.v.Key != current.Key() {
			t.Fatalf("the follower reported %q (want only the current leader %q): an event the read had already seen", g.v.Key, current.Key())
		}
	}

	// The next change still comes through.
	n := s.len()
	if err := current.UnlockContext(ctx); err != nil {
		t.Fatal(err)
	}
	s.wait(t, "nobody leads", n, func(e etcdlock.QueueEntry) bool { return e.Key == "" })
}
