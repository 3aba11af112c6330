package etcdlock_test

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The real-network test: the holder processes of the process test
// (process_test.go), each in a network namespace of its own, against 3
// etcd members that are separate processes of an etcd binary, each in a
// namespace of its own, all on one bridge (netlab_test.go). Faults, one at
// a time, in a fixed rotation with durations drawn from the printed seed:
//
//   - partition: a holder cut off from every member just before a write
//     (nft drops its packets both ways), for TTL + 1.5 s;
//   - minority partition, leader isolated: (n-1)/2 followers, or the
//     leader, cut off from every other host, for 2 TTL to 3 TTL;
//   - bridge partition: the lower and the upper half of the members cut
//     from each other, the middle one reaching both (non-transitive), for
//     as long;
//   - ring partition, with 5 members or more: each member reaches only its
//     two neighbours on a ring, for as long;
//   - loss 30%, duplicate 50%: of the leader's outgoing packets, at random
//     (nft), for as long;
//   - slow link: the leader's outgoing traffic limited to 200 kbit/s (tc
//     tbf), the rest queued for up to 1 s, for as long (netem, which would
//     delay every packet alike, is not in every kernel: not in CI's);
//   - leader SIGSTOP: the leader stopped for TTL + 1.5 s, then SIGCONT;
//   - leader SIGKILL: the leader killed, and started again with its data
//     0.5–1.5 s later;
//   - freeze, freeze at write: a holder SIGSTOPped for TTL + 1.5 s (at any
//     moment, or just before a write), then SIGCONT;
//   - holder kill, holder kill at write: a holder SIGKILLed and a new one
//     started in its namespace.
//
// The checks are the process test's: the history of every holder is
// linearizable for the fenced register model (porcupine), no acknowledged
// write is lost, no write acknowledged after a newer hold was granted, the
// lock is taken again after each fault, no key or lease is left once the
// holders have exited; and here, no negative early-warning margin.
//
//	ETCDLOCK_NET=1m go test -count=1 -run '^TestNet$' -v .
//
// runs 1 minute of faults per kind of lock (ETCDLOCK_NET_KINDS, default
// mutex; comma-separated names of kinds) as root, on /usr/bin/etcd
// (ETCDLOCK_NET_ETCD), with 3 members (ETCDLOCK_NET_MEMBERS: 3 to 9). ETCDLOCK_NET_UNFENCED=1 turns the holders' fencing
// off: the run then must find lost writes or an illegal history.
const netEnv = "ETCDLOCK_NET"

// netRotation is the order of the faults.
var netRotation = []string{
	"partition", "leader SIGKILL", "freeze at write", "minority partition", "loss 30%", "holder kill at write",
	"leader isolated", "leader SIGSTOP", "slow link", "freeze", "bridge partition", "duplicate 50%", "holder kill",
}

func TestNet(t *testing.T) {
	v := os.Getenv(netEnv)
	if v == "" {
		t.Skip("real-network run: ETCDLOCK_NET=<duration of faults> runs it, as root, with ip, tc and nft")
	}
	faults, err := time.ParseDuration(v)
	if err != nil || faults <= 0 {
		t.Fatalf("%s=%q: want a duration such as 1m", netEnv, v)
	}
	if err := netAvailable(); err != nil {
		t.Fatalf("network namespaces cannot be made here: %v", err)
	}
	bin := os.Getenv("ETCDLOCK_NET_ETCD")
	if bin == "" {
		bin = "/usr/bin/etcd"
	}
	version, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v", bin, err)
	}
	t.Logf("%s: %s", bin, strings.SplitN(string(version), "\n", 2)[0])
	members := 3
	if v := os.Getenv("ETCDLOCK_NET_MEMBERS"); v != "" {
		if members, err = strconv.Atoi(v); err != nil || members < 3 || members%2 == 0 || members > 9 {
			t.Fatalf("ETCDLOCK_NET_MEMBERS=%q: want 3, 5, 7 or 9", v)
		}
	}
	kindNames := strings.Split(os.Getenv("ETCDLOCK_NET_KINDS"), ",")
	if kindNames[0] == "" {
		kindNames = []string{"mutex"}
	}
	for _, name := range kindNames {
		if _, ok := kinds[name]; !ok {
			t.Fatalf("ETCDLOCK_NET_KINDS: %q is not one of the kinds", name)
		}
		t.Run(name, func(t *testing.T) {
			cfg := processConfig{kind: name, holders: 3, ttl: 2 * time.Second, faults: faults, gap: time.Second,
				unfenced: os.Getenv("ETCDLOCK_NET_UNFENCED") == "1", title: "Real-network test"}
			runNet(t, bin, members, cfg)
		})
	}
}

// netRun is the state of a real-network run: the process test's run, and
// the lab.
type netRun struct {
	*processRun
	cluster *netCluster
	spaces  []string // the holders' namespaces, by slot
}

func runNet(t *testing.T, bin string, members int, cfg processConfig) {
	lab := newNetLab(t)
	c := startNetCluster(t, lab, bin, members)
	n := &netRun{cluster: c}
	for i := range cfg.holders {
		n.spaces = append(n.spaces, lab.host(t, fmt.Sprintf("c%d", i), clientAddr+i))
	}
	n.processRun = newProcessRun(t, cfg, n)
	rotation := netRotation
	if members >= 5 { // with 3, a member's neighbours on a ring are all the others
		rotation = slices.Insert(slices.Clone(netRotation), slices.Index(netRotation, "bridge partition")+1, "ring partition")
	}
	t.Logf("faults, in turn: %s", strings.Join(rotation, ", "))
	fig := n.run(c.observer, rotation, n.inject)
	c.stopAll()

	kindsSeen := slices.Sorted(maps.Keys(fig.afterHeal))
	fencing := "fenced"
	if cfg.unfenced {
		fencing = "unfenced"
	}
	t.Logf("figures (%s): acquisitions %d, acknowledged writes %d, lost %d, stale writes acknowledged %d, keys/leases left %d/%d, history %s",
		fencing, fig.acquisitions, fig.acked, fig.lost, fig.staleAccepted, fig.keysLeft, fig.leasesLeft, fig.history)
	t.Logf("early-warning margin of the partitioned holders: %s", spread(fig.margins))
	t.Logf("time with a holder: while faults last %.1f%%, between them %.1f%%", 100*fig.heldDuring, 100*fig.heldBetween)
	for _, k := range kindsSeen {
		t.Logf("  %-22s end → next acquisition: %s", k, spread(fig.afterHeal[k]))
	}
	for _, m := range fig.margins {
		if m < 0 {
			t.Errorf("early-warning margin: got %v, want ≥ 0", m)
		}
	}
	if cfg.unfenced && fig.lost == 0 && fig.staleAccepted == 0 {
		t.Errorf("fencing off: got 0 lost and 0 stale writes acknowledged, want some: the run would not find what fencing prevents")
	}
}

// split cuts the members of side off from every other host of the lab.
func (n *netRun) split(side []int) {
	others := []string{fmt.Sprintf("%s%d", netSubnet, observerAddr)}
	for j, m := range n.cluster.members {
		if !slices.Contains(side, j) {
			others = append(others, m.ip)
		}
	}
	for j := range n.spaces {
		others = append(others, fmt.Sprintf("%s%d", netSubnet, clientAddr+j))
	}
	for _, i := range side {
		n.must(nftCut(n.cluster.members[i].ns, others))
	}
}

// healAll removes the cuts of every member.
func (n *netRun) healAll() {
	for _, m := range n.cluster.members {
		n.must(nftHeal(m.ns))
	}
}

// command runs holder slot in its namespace.
func (n *netRun) command(slot int, cfg holderConfig) *exec.Cmd {
	cfg.Endpoints = n.cluster.endpoints()
	cmd := holderCommand(cfg, "ip", "netns", "exec", n.spaces[slot])
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

func (n *netRun) cut(slot int) {
	n.must(nftCut(n.spaces[slot], n.cluster.addrs(n.cluster.all()...)))
}

func (n *netRun) heal(slot int) { n.must(nftHeal(n.spaces[slot])) }

func (n *netRun) must(err error) {
	if err != nil {
		n.t.Fatal(err)
	}
}

// inject makes one fault and returns once it is over; the process test
// makes the holders' faults.
func (n *netRun) inject(kind string, rng *rand.Rand) *processFault {
	c, ttl := n.cluster, n.cfg.ttl
	long := 2*ttl + time.Duration(rng.Int64N(int64(ttl)))
	f := &processFault{kind: kind}
	switch kind {
	case "minority partition", "leader isolated":
		lead := c.waitLeader()
		side := []int{lead}
		if kind == "minority partition" { // (n-1)/2 followers in a row, from one at random
			var followers []int
			for j := range c.members {
				if j != lead {
					followers = append(followers, j)
				}
			}
			off := rng.IntN(len(followers))
			side = nil
			for j := range (len(c.members) - 1) / 2 {
				side = append(side, followers[(off+j)%len(followers)])
			}
		}
		f.at = time.Now()
		n.split(side)
		time.Sleep(long)
		n.healAll()
		f.end = time.Now()
	case "bridge partition":
		// The lower half and the upper half cannot reach each other;
		// the member between them reaches both.
		mid := len(c.members) / 2
		var lower, upper []int
		for i := range c.members {
			switch {
			case i < mid:
				lower = append(lower, i)
			case i > mid:
				upper = append(upper, i)
			}
		}
		f.at = time.Now()
		for _, i := range lower {
			n.must(nftCut(c.members[i].ns, c.addrs(upper...)))
		}
		for _, i := range upper {
			n.must(nftCut(c.members[i].ns, c.addrs(lower...)))
		}
		time.Sleep(long)
		n.healAll()
		f.end = time.Now()
	case "ring partition":
		// Each member reaches only its two neighbours on a ring (and every
		// client): with 5 members each sees a majority, no two the same.
		f.at = time.Now()
		m := len(c.members)
		for i := range c.members {
			var far []int
			for j := range c.members {
				if d := (j - i + m) % m; d > 1 && d < m-1 {
					far = append(far, j)
				}
			}
			n.must(nftCut(c.members[i].ns, c.addrs(far...)))
		}
		time.Sleep(long)
		n.healAll()
		f.end = time.Now()
	case "loss 30%", "duplicate 50%", "slow link":
		ns := c.members[c.waitLeader()].ns
		set, undo := map[string]func() error{
			"loss 30%":      func() error { return nftLoss(ns, 30) },
			"duplicate 50%": func() error { return nftDuplicate(ns, 50) },
			"slow link":     func() error { return slowLink(ns, "200kbit") },
		}[kind], func() error { return nftHeal(ns) }
		if kind == "slow link" {
			undo = func() error { return slowLink(ns, "") }
		}
		f.at = time.Now()
		n.must(set())
		time.Sleep(long)
		n.must(undo())
		f.end = time.Now()
	case "leader SIGSTOP":
		lead := c.waitLeader()
		f.at = time.Now()
		c.signal(lead, syscall.SIGSTOP)
		time.Sleep(ttl + 1500*time.Millisecond)
		c.signal(lead, syscall.SIGCONT)
		f.end = time.Now()
	case "leader SIGKILL":
		lead := c.waitLeader()
		f.at = time.Now()
		c.kill(lead)
		time.Sleep(500*time.Millisecond + time.Duration(rng.Int64N(int64(time.Second))))
		c.start(lead)
		f.end = time.Now()
	default:
		return n.processRun.inject(kind, rng)
	}
	c.waitLeader()
	return f
}
