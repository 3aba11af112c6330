package queue

import (
	"bytes"
	"fmt"
	"math"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
)

// FuzzIsMember checks IsMember, which decides which keys under a lock's
// prefix take part in the lock (D11), against what it must mean:
//   - the key name + "/" + lease hex is a key of the lock name;
//   - a key of a lock nested under name, name/sub, is not;
//   - a key of the lock name is a key of no other lock;
//   - in general, key is a key of the lock with prefix pfx exactly when it
//     is pfx followed by one path segment without "/".
func FuzzIsMember(f *testing.F) {
	f.Add("jobs/nightly", int64(0x694d7c1a3e7b2b04), "sub", "jobs", []byte("jobs/nightly/694d7c1a3e7b2b04"))
	f.Add("a", int64(1), "b", "a/b", []byte("a/b/1"))
	f.Add("", int64(1), "", "/", []byte("/1"))
	f.Add("/", int64(0x10), "/", "", []byte("//10"))
	f.Add("a/", int64(math.MaxInt64), "", "a", []byte("a//7fffffffffffffff"))
	f.Add("a\x00b", int64(-1), "\x00", "a", []byte("a\x00b/\x00/1"))
	f.Add("日本語/ロック", int64(42), "ü", "日本語", []byte("日本語/ロック/2a"))
	f.Add("\xff\xfe", int64(0), "\xff", "\xff", []byte("\xff\xfe/"))
	f.Fuzz(func(t *testing.T, name string, lease int64, sub, other string, key []byte) {
		id := clientv3.LeaseID(lease & math.MaxInt64)
		if id == 0 {
			id = 1
		}
		pfx := name + "/"
		own := fmt.Sprintf("%s%x", pfx, id)
		if !IsMember(pfx, []byte(own)) {
			t.Errorf("IsMember(%q, %q) = false, want true: our own key", pfx, own)
		}
		nested := fmt.Sprintf("%s%s/%x", pfx, sub, id)
		if IsMember(pfx, []byte(nested)) {
			t.Errorf("IsMember(%q, %q) = true, want false: a key of the nested lock %q", pfx, nested, name+"/"+sub)
		}
		if other != name && IsMember(other+"/", []byte(own)) {
			t.Errorf("IsMember(%q, %q) = true, want false: a key of the lock %q", other+"/", own, name)
		}
		rest, ok := bytes.CutPrefix(key, []byte(pfx))
		want := ok && !bytes.Contains(rest, []byte("/"))
		if got := IsMember(pfx, key); got != want {
			t.Errorf("IsMember(%q, %q) = %v, want %v", pfx, key, got, want)
		}
	})
}

// FuzzPlaced feeds the parser of the acquire Txn's reply arbitrary replies:
// a malformed one must be an error, never a panic or a hold. A reply it
// accepts gives our key's revision, a key to wait for only if it is a key of
// the lock created before ours, and says that it is the holder only if it is
// the only one.
func FuzzPlaced(f *testing.F) {
	const pfx, key = "l/", "l/a"
	kv := func(key string, create int64) *mvccpb.KeyValue {
		return &mvccpb.KeyValue{Key: []byte(key), CreateRevision: create, ModRevision: create}
	}
	rangeOp := func(kvs ...*mvccpb.KeyValue) *pb.ResponseOp {
		return &pb.ResponseOp{Response: &pb.ResponseOp_ResponseRange{ResponseRange: &pb.RangeResponse{Kvs: kvs, Count: int64(len(kvs))}}}
	}
	putOp := &pb.ResponseOp{Response: &pb.ResponseOp_ResponsePut{ResponsePut: &pb.PutResponse{}}}
	for _, resp := range []*pb.TxnResponse{
		// We put our key and own the lock.
		{Header: &pb.ResponseHeader{Revision: 10}, Succeeded: true, Responses: []*pb.ResponseOp{putOp, rangeOp(kv(key, 10))}},
		// We put our key behind an older one, the holder.
		{Header: &pb.ResponseHeader{Revision: 12}, Succeeded: true, Responses: []*pb.ResponseOp{putOp, rangeOp(kv(key, 12), kv("l/b", 7))}},
		// We put our key behind two older ones.
		{Header: &pb.ResponseHeader{Revision: 12}, Succeeded: true, Responses: []*pb.ResponseOp{putOp, rangeOp(kv(key, 12), kv("l/b", 9), kv("l/c", 7))}},
		// We put our key; the next newest is a nested lock's key (D11).
		{Header: &pb.ResponseHeader{Revision: 12}, Succeeded: true, Responses: []*pb.ResponseOp{putOp, rangeOp(kv(key, 12), kv("l/x/b", 11))}},
		// Our key was already there (WithLease).
		{Header: &pb.ResponseHeader{Revision: 12}, Responses: []*pb.ResponseOp{rangeOp(kv(key, 9))}},
		// A header and no results, as seen after a healed partition.
		{Header: &pb.ResponseHeader{Revision: 12}, Succeeded: true},
		{},
		{Header: &pb.ResponseHeader{Revision: 12}, Responses: []*pb.ResponseOp{rangeOp(), rangeOp()}},
		{Header: &pb.ResponseHeader{Revision: 12}, Succeeded: true, Responses: []*pb.ResponseOp{putOp, {}}},
		{Header: &pb.ResponseHeader{Revision: 12}, Succeeded: true, Responses: []*pb.ResponseOp{putOp, rangeOp(kv("l/b", 7), kv(key, 12))}},
		{Header: &pb.ResponseHeader{Revision: 12}, Succeeded: true, Responses: []*pb.ResponseOp{putOp, rangeOp(kv(key, 12), kv("l/b", 13))}},
	} {
		data, err := proto.Marshal(resp)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	r := Lock(pfx, pfx)
	f.Fuzz(func(t *testing.T, data []byte) {
		var resp pb.TxnResponse
		if err := proto.Unmarshal(data, &resp); err != nil {
			return
		}
		tk := NewTicket(&Conn{FenceKey: "fence"}, r, key, "")
		// A role refused the fence reads no fence: the same checks hold.
		fenced := len(data)%2 == 0
		ps, moved, err := tk.placed((*clientv3.TxnResponse)(&resp), 0, fenced)
		if err != nil || moved {
			return
		}
		p := ps[0]
		if resp.Header == nil {
			t.Fatalf("placed accepted a reply without a header, want an error")
		}
		if tk.rev <= 0 {
			t.Errorf("placed(%v): rev %d, want > 0", &resp, tk.rev)
		}
		if !resp.Succeeded {
			if p.verdict != unread {
				t.Errorf("placed(%v): place known from a reply without the put, want unknown", &resp)
			}
			return
		}
		if tk.rev != resp.Header.Revision {
			t.Errorf("placed(%v): rev %d, want the put's revision %d", &resp, tk.rev, resp.Header.Revision)
		}
		older := func(key string) {
			for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
				if string(kv.Key) == key {
					if !IsMember(pfx, kv.Key) || kv.CreateRevision >= tk.rev {
						t.Errorf("placed(%v): waits for %q at %d, want a key of the lock created before %d", &resp, kv.Key, kv.CreateRevision, tk.rev)
					}
					return
				}
			}
			t.Errorf("placed(%v): waits for %q, which the reply does not have", &resp, key)
		}
		if p.watch != "" {
			older(p.watch)
		}
		if p.owner {
			// The holder only if the reply holds every older key, and it
			// is the only one of the lock.
			kvs := resp.Responses[1].GetResponseRange().Kvs
			members := 0
			for _, kv := range kvs {
				if string(kv.Key) != key && IsMember(pfx, kv.Key) {
					members++
				}
			}
			if len(kvs) >= 3 || members != 1 {
				t.Errorf("placed(%v): %q taken for the holder, want it only if it is the only older key", &resp, p.watch)
			}
		}
	})
}
