package etcdlock_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/etcdlock/etcdlock"
)

// The holder process of the process test and of the real-network test:
// this test binary, run again with holderEnv set. It takes holds of one
// lock, reads and writes the register under each, and reports every
// operation, with its times, as a line of JSON on its standard output.

// holderEnv carries a holder process's configuration (JSON).
const holderEnv = "ETCDLOCK_TEST_HOLDER"

// holderConfig configures a holder process.
type holderConfig struct {
	Endpoints []string      `json:"endpoints"`
	Kind      string        `json:"kind"`
	Lock      string        `json:"lock"`
	Register  string        `json:"register"`
	TTL       time.Duration `json:"ttl"`
	ID        int           `json:"id"`
	Seed      uint64        `json:"seed"`
	Unfenced  bool          `json:"unfenced,omitempty"` // reads and writes not guarded by IsOwner
	// Renew makes the holder's Session WithRenewal: it outlives its
	// leases, so each hold's lease is followed, as a Lead term's is.
	Renew bool `json:"renew,omitempty"`
}

// holderLine is one line a holder process writes: one field set.
type holderLine struct {
	Op      *historyOp `json:"op,omitempty"`      // an operation returned
	Call    *historyOp `json:"call,omitempty"`    // a write is sent
	Done    int64      `json:"done,omitempty"`    // the Done of the hold with this token closed
	Ack     int64      `json:"ack,omitempty"`     // a keep-alive acknowledgement of the lease of the holds arrived
	Ended   int64      `json:"ended,omitempty"`   // the Session of this lease ended (its Done closed, or its keep-alive)
	Waiting int64      `json:"waiting,omitempty"` // the hold with this token waits before its write, for "go" on stdin
	Skip    int64      `json:"skip,omitempty"`    // the hold with this token skipped its write: Done had closed
	Error   string     `json:"error,omitempty"`   // the holder cannot go on
	At      int64      `json:"at,omitempty"`      // when (Unix ns)
}

// holderMain runs the holder process when holderEnv is set, and then exits;
// otherwise it returns at once.
func holderMain() {
	cfg := os.Getenv(holderEnv)
	if cfg == "" {
		return
	}
	out := &lineWriter{w: os.Stdout}
	if err := runHolder(cfg, out, os.Stdin); err != nil {
		out.write(holderLine{Error: err.Error(), At: now()})
		os.Exit(1)
	}
	os.Exit(0)
}

// lineWriter writes a holder's lines, one at a time.
type lineWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lineWriter) write(line holderLine) {
	b, _ := json.Marshal(line)
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.w.Write(append(b, '\n'))
}

func (l *lineWriter) called(op historyOp)   { l.write(holderLine{Call: &op}) }
func (l *lineWriter) returned(op historyOp) { l.write(holderLine{Op: &op}) }

// runHolder is a holder process: it takes holds until its standard input
// closes. "stop" on stdin makes it stop before its next write, write a
// Waiting line, and wait for "go".
func runHolder(cfgJSON string, out *lineWriter, in io.Reader) error {
	var cfg holderConfig
	if err := json.Unmarshal([]byte(cfgJSON), &cfg); err != nil {
		return err
	}
	k, ok := kinds[cfg.Kind]
	if !ok {
		return fmt.Errorf("kind %q: not one of the kinds", cfg.Kind)
	}
	client, err := clientv3.New(clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer client.Close()

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var stopAtWrite atomic.Bool
	resume := make(chan struct{}, 1)
	go func() { // ends with stdin, which the test closes, or with the process
		sc := bufio.NewScanner(in)
		for sc.Scan() {
			switch sc.Text() {
			case "stop":
				stopAtWrite.Store(true)
			case "go":
				resume <- struct{}{}
			}
		}
		stop()
	}()

	rng := rand.New(rand.NewPCG(cfg.Seed, uint64(cfg.ID)))
	reg := &register{client: client, key: cfg.Register, lock: cfg.Lock, kind: k, fenced: !cfg.Unfenced, id: cfg.ID, sink: out}
	perHold := k.ownSession || cfg.Renew // the lease to follow is each hold's
	var s *etcdlock.Session
	var bg sync.WaitGroup // the watchers of acks and of each hold's Done
	defer bg.Wait()
	stopAcks := func() {}
	endSession := func() {
		if s != nil {
			_ = s.Close()
			stopAcks()
			s = nil
		}
	}
	defer endSession()
	for ctx.Err() == nil {
		if s == nil || isClosed(s.Done()) {
			endSession()
			opts := []etcdlock.SessionOption{etcdlock.WithTTL(cfg.TTL)}
			if cfg.Renew {
				opts = append(opts, etcdlock.WithRenewal())
			}
			if s, err = etcdlock.NewSession(client, opts...); err != nil {
				s = nil
				time.Sleep(50 * time.Millisecond)
				continue
			}
			if !perHold { // else followed hold by hold
				lease, sd := s.Lease(), s.Done()
				bg.Go(func() {
					<-sd // closed by endSession at the latest
					out.write(holderLine{Ended: int64(lease), At: now()})
				})
				stopAcks = reportAcks(client, lease, false, out)
			}
		}
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		h, err := reg.acquire(lctx, k.make(s, cfg.Lock, -1))
		cancel()
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		bg.Go(func() {
			<-h.done // closed, at the latest, by the release
			out.write(holderLine{Done: h.token, At: now()})
		})
		stopHoldAcks := func() {}
		if perHold {
			stopHoldAcks = reportAcks(client, h.lease, true, out)
		}
		err = holderCritical(ctx, reg, h, rng, &stopAtWrite, resume, out)
		stopHoldAcks() // before the release, whose revoke would end the lease's keep-alive
		if err != nil {
			return err
		}
		_, _ = reg.release(ctx, h)
	}
	return nil
}

// reportAcks writes an Ack line for each keep-alive acknowledgement of
// lease, and with ended an Ended line if clientv3 stops keeping it alive,
// until the function it returns is called.
func reportAcks(client *clientv3.Client, lease clientv3.LeaseID, ended bool, out *lineWriter) func() {
	var end func(time.Time)
	if ended {
		end = func(at time.Time) { out.write(holderLine{Ended: int64(lease), At: at.UnixNano()}) }
	}
	stop, err := followAcks(client, lease, func(at time.Time) { out.write(holderLine{Ack: int64(lease), At: at.UnixNano()}) }, end)
	if err != nil {
		return func() {}
	}
	return stop
}

// holderCritical reads the register, waits a little and writes it plus
// one, retrying a write that etcd did not answer (a retry writes the same
// value, under a new id) for up to testTimeout.
func holderCritical(ctx context.Context, reg *register, h *hold, rng *rand.Rand, stopAtWrite *atomic.Bool, resume <-chan struct{}, out *lineWriter) error {
	v, res, first, err := reg.read(ctx, h)
	if err != nil {
		return err
	}
	if res != resOK {
		return nil
	}
	if !first {
		return fmt.Errorf("hold %d: its key is not the oldest of the lock", h.token)
	}
	time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
	if isClosed(h.done) {
		out.write(holderLine{Skip: h.token, At: now()})
		return nil
	}
	if stopAtWrite.CompareAndSwap(true, false) {
		// The worst moment to be cut off or frozen: Done was checked, the
		// write is next.
		out.write(holderLine{Waiting: h.token, At: now()})
		select {
		case <-resume:
		case <-ctx.Done():
		}
	}
	deadline := time.Now().Add(testTimeout)
	for {
		if _, res := reg.write(context.WithoutCancel(ctx), h, v+1); res != resUnknown || time.Now().After(deadline) {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}
