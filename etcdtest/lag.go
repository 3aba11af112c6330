package etcdtest

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"path"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/server/v3/etcdserver/api/rafthttp"
)

// Lag makes member i lag behind the others: the raft messages sent to it
// are held on their way, from every other member, until CatchUp(i). The
// member keeps running and serving clients from what it has applied:
// serializable reads and watches answer, at the revision it had reached,
// and watches get the events they missed once it catches up. Requests
// through it that need the leader (writes, linearizable reads, lease
// keep-alives) wait until it catches up, or fail on a time-out or with
// "no leader". Its own messages still reach the others, so a write it
// forwards to the leader may commit while its client waits for the answer.
//
// Within an election timeout (100–200 ms) the member stops hearing the
// leader and has no leader itself; etcd's pre-vote keeps it from disrupting
// the others, which keep their leader and term. The others must make a
// quorum without it: lag a follower (see Leader), and no more than a
// minority at once, or the cluster stops committing until CatchUp.
//
// Messages are held, not dropped, but etcd closes a connection between
// members that stays silent for 250 ms: what it held is then lost and raft
// sends it again, so after a longer lag the member catches up from the
// leader's retries, as after a real partition. Client traffic is not
// touched; for faults between a client and etcd see ProxiedClient.
//
// The lag is in the network, not in the member: it lasts across Stop and
// Kill, and Restart of a member that lags panics, since the member could
// not become ready before CatchUp. Lag does nothing if member i already
// lags or after Close, and panics if i is out of range.
func (c *Cluster) Lag(i int) {
	c.member("Lag", i)
	c.lag.set(i, true)
}

// CatchUp ends the lag of member i: the messages held for it go on, and
// raft sends it what it missed. CatchUp returns at once; the member is
// usually back with the leader within tens of milliseconds, but CatchUp
// does not wait for it, nor promise a time. CatchUp does nothing if member
// i does not lag, and panics if i is out of range.
func (c *Cluster) CatchUp(i int) {
	c.member("CatchUp", i)
	c.lag.set(i, false)
}

// lagState is which members of a cluster lag.
type lagState struct {
	mu      sync.Mutex
	ids     []string // member IDs in hex, as in raft's stream paths, by index
	lagging []bool
	changed chan struct{} // closed and replaced on every change
}

func newLagState(n int) *lagState {
	return &lagState{ids: make([]string, n), lagging: make([]bool, n), changed: make(chan struct{})}
}

func (s *lagState) setIDs(ids []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	copy(s.ids, ids)
}

func (s *lagState) set(i int, lag bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lagging[i] == lag {
		return
	}
	s.lagging[i] = lag
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *lagState) lags(i int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lagging[i]
}

// held reports whether bytes bound for member i are held now, and returns
// a channel closed on the next change.
func (s *lagState) held(i int) (bool, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lagging[i], s.changed
}

// heldID is held for the member with the given ID; bytes for a member not
// of the cluster are never held.
func (s *lagState) heldID(id string) (bool, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, m := range s.ids {
		if m == id {
			return s.lagging[i], s.changed
		}
	}
	return false, s.changed
}

// A peerProxy stands in front of one member's peer listener: the member
// advertises the proxy's URL, so that the others dial it. It forwards bytes
// as they come, except those bound for a member that lags.
//
// Raft traffic is HTTP. A stream is a long GET of
// /raft/stream/<type>/<reader's ID> whose response carries messages from
// the member to the reader; every other request (pipelined messages and
// snapshots as POSTs, probes, lease renewals, version checks) carries what
// it has for the member in the request. A connection is classified by its
// first request: a stream keeps its connection for its whole life, and
// other requests never share one with a stream.
type peerProxy struct {
	index  int    // the member's
	target string // the member's peer listener
	lag    *lagState
	l      net.Listener
	quit   chan struct{} // closed by close: held bytes are dropped
	wg     sync.WaitGroup

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// newPeerProxy starts a proxy to target on a port of 127.0.0.1 picked by
// the kernel.
func newPeerProxy(index int, target string, lag *lagState) (*peerProxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &peerProxy{index: index, target: target, lag: lag, l: l, quit: make(chan struct{}),
		conns: make(map[net.Conn]struct{})}
	p.wg.Go(p.accept)
	return p, nil
}

// addr is the proxy's address, host:port.
func (p *peerProxy) addr() string {
	return p.l.Addr().String()
}

func (p *peerProxy) accept() {
	for {
		c, err := p.l.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil { // such as too many open files: wait for some to close
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if !p.track(c) {
			return
		}
		p.wg.Go(func() { p.serve(c) })
	}
}

// track registers c for close, or closes it and returns false after close.
func (p *peerProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *peerProxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
	c.Close()
}

// serve forwards one connection from another member to the member.
func (p *peerProxy) serve(in net.Conn) {
	defer p.untrack(in)
	br := bufio.NewReader(in)
	line, err := br.ReadSlice('\n')
	if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
		return
	}
	first := bytes.Clone(line)
	out, err := net.DialTimeout("tcp", p.target, dialTimeout)
	if err != nil || !p.track(out) {
		return
	}
	defer p.untrack(out)

	never := func() (bool, <-chan struct{}) { return false, nil }
	toMember := func() (bool, <-chan struct{}) { return p.lag.held(p.index) }
	fromMember := never
	if reader, ok := streamReader(first); ok {
		toMember = never
		fromMember = func() (bool, <-chan struct{}) { return p.lag.heldID(reader) }
	}
	done := make(chan struct{})
	var once sync.Once
	end := func() {
		once.Do(func() {
			close(done)
			in.Close()
			out.Close()
		})
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		defer end()
		p.forward(out, io.MultiReader(bytes.NewReader(first), br), toMember, done)
	})
	wg.Go(func() {
		defer end()
		p.forward(in, out, fromMember, done)
	})
	wg.Wait()
}

// streamReader returns the reader's ID if line is the request line of a
// raft stream.
func streamReader(line []byte) (string, bool) {
	f := strings.Fields(string(line))
	if len(f) < 2 || f[0] != "GET" || !strings.HasPrefix(f[1], rafthttp.RaftStreamPrefix+"/") {
		return "", false
	}
	return path.Base(f[1]), true
}

// forward copies src to dst, holding each chunk while held says so, until
// either side fails, done closes or the proxy closes.
func (p *peerProxy) forward(dst io.Writer, src io.Reader, held func() (bool, <-chan struct{}), done <-chan struct{}) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			for {
				h, changed := held()
				if !h {
					break
				}
				select {
				case <-changed:
				case <-done:
					return
				case <-p.quit:
					return
				}
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// close stops the proxy, closes its connections and waits for its
// goroutines.
func (p *peerProxy) close() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.quit)
		p.l.Close()
		for c := range p.conns {
			c.Close()
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
}
