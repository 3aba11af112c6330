package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// The network of the real-network test (net_test.go): a network namespace
// per etcd member and per client, each with a veth pair to a bridge that
// lives in a namespace of its own, on addresses of netSubnet that exist
// only inside these namespaces. Nothing is added to the host's namespace:
// the test's own client reaches the members from a namespace of its own
// (netLab.dialer). Removing the namespaces removes every link with them.
//
// Everything is named with netPrefix, so that a run that was killed before
// its cleanup is swept by the next one; a lock file keeps two runs apart.

const (
	netPrefix = "etcdlock-net-" // of every namespace and directory the lab makes
	netSubnet = "10.77.0."      // a /24, used only inside the lab's namespaces
	netLock   = "/run/etcdlock-net.lock"
)

// netLab is the network, its processes and their files.
type netLab struct {
	dir    string // the members' data and logs
	lock   *os.File
	obsNS  int            // the observer's namespace (a descriptor), for dialer
	hostNS int            // the test process's own
	dials  sync.WaitGroup // dialer's

	mu      sync.Mutex
	spaces  []string    // namespaces made
	procs   []*exec.Cmd // processes started, running or not
	cleaned bool
	stopSig chan os.Signal
	sigDone chan struct{}
}

// netAvailable tells why the lab cannot run here, or returns nil.
func netAvailable() error {
	if os.Geteuid() != 0 {
		return errors.New("not root: network namespaces need CAP_SYS_ADMIN")
	}
	for _, tool := range []string{"ip", "tc", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found (Debian: iproute2, nftables)", tool)
		}
	}
	probe := netPrefix + "probe"
	if err := runCmd("ip", "netns", "add", probe); err != nil {
		return fmt.Errorf("ip netns add: %w", err)
	}
	return runCmd("ip", "netns", "del", probe)
}

// runCmd runs a command; its error carries its output.
func runCmd(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// runIn runs a command in namespace ns, with stdin.
func runIn(ns, stdin string, args ...string) error {
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("in %s: %s: %w: %s", ns, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// sweepNet kills the processes of the lab's namespaces left by an earlier
// run, and removes those namespaces and its directories.
func sweepNet() error {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return fmt.Errorf("ip netns list: %w", err)
	}
	var errs []error
	for _, line := range strings.Split(string(out), "\n") {
		ns, _, _ := strings.Cut(line, " ")
		if !strings.HasPrefix(ns, netPrefix) {
			continue
		}
		killIn(ns)
		errs = append(errs, runCmd("ip", "netns", "del", ns))
	}
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), netPrefix+"*"))
	for _, d := range dirs {
		errs = append(errs, os.RemoveAll(d))
	}
	return errors.Join(errs...)
}

// killIn kills every process in namespace ns (SIGCONT first: a stopped
// process dies only once it runs).
func killIn(ns string) {
	out, _ := exec.Command("ip", "netns", "pids", ns).Output()
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() {
			_ = syscall.Kill(pid, syscall.SIGCONT)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// newNetLab takes the lab's lock, sweeps what an earlier run left, makes
// the bridge and the observer's namespace, and removes all it made when
// the test ends, or when the process gets SIGINT or SIGTERM.
func newNetLab(t *testing.T) *netLab {
	t.Helper()
	lock, err := os.OpenFile(netLock, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		t.Fatalf("%s: another run of the lab holds it: %v", netLock, err)
	}
	if err := sweepNet(); err != nil {
		t.Logf("sweep of an earlier run: %v", err)
	}
	l := &netLab{lock: lock, obsNS: -1, hostNS: -1, stopSig: make(chan os.Signal, 1), sigDone: make(chan struct{})}
	signal.Notify(l.stopSig, syscall.SIGINT, syscall.SIGTERM)
	go l.trap()
	t.Cleanup(l.cleanup)
	if l.dir, err = os.MkdirTemp("", netPrefix); err != nil {
		t.Fatal(err)
	}
	br := netPrefix + "br"
	l.fatal(t, l.netns(br))
	l.fatal(t, runCmd("ip", "-n", br, "link", "add", "br0", "type", "bridge"))
	l.fatal(t, runCmd("ip", "-n", br, "link", "set", "br0", "up"))
	if l.hostNS, err = unix.Open("/proc/self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		t.Fatal(err)
	}
	obs := l.host(t, "obs", observerAddr)
	if l.obsNS, err = unix.Open("/run/netns/"+obs, unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		t.Fatal(err)
	}
	return l
}

// trap runs the cleanup on SIGINT or SIGTERM and exits; it ends with the
// cleanup.
func (l *netLab) trap() {
	select {
	case sig := <-l.stopSig:
		fmt.Fprintf(os.Stderr, "%v: removing the lab's namespaces and processes\n", sig)
		l.cleanup()
		os.Exit(1)
	case <-l.sigDone:
	}
}

func (l *netLab) fatal(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// netns makes namespace name, with its loopback up.
func (l *netLab) netns(name string) error {
	if err := runCmd("ip", "netns", "add", name); err != nil {
		return err
	}
	l.mu.Lock()
	l.spaces = append(l.spaces, name)
	l.mu.Unlock()
	return runCmd("ip", "-n", name, "link", "set", "lo", "up")
}

// host makes namespace netPrefix+name with address netSubnet+n on eth0,
// linked to the bridge, and returns the namespace's name.
func (l *netLab) host(t *testing.T, name string, n int) string {
	t.Helper()
	ns, br, veth := netPrefix+name, netPrefix+"br", "v-"+name
	l.fatal(t, l.netns(ns))
	l.fatal(t, runCmd("ip", "-n", br, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns))
	l.fatal(t, runCmd("ip", "-n", br, "link", "set", veth, "master", "br0", "up"))
	l.fatal(t, runCmd("ip", "-n", ns, "addr", "add", netSubnet+strconv.Itoa(n)+"/24", "dev", "eth0"))
	l.fatal(t, runCmd("ip", "-n", ns, "link", "set", "eth0", "up"))
	return ns
}

// start starts cmd (which runs in a namespace of the lab's) as the lab's:
// it is killed with the lab, and with the test process if that dies first.
func (l *netLab) start(cmd *exec.Cmd) error {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cleaned {
		return errors.New("the lab is removed")
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	l.procs = append(l.procs, cmd)
	return nil
}

// cleanup kills the lab's processes and removes its namespaces and files;
// it runs once.
func (l *netLab) cleanup() {
	l.mu.Lock()
	if l.cleaned {
		l.mu.Unlock()
		return
	}
	l.cleaned = true
	procs, spaces := slices.Clone(l.procs), slices.Clone(l.spaces)
	l.mu.Unlock()
	signal.Stop(l.stopSig)
	close(l.sigDone)
	for _, cmd := range procs {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
	}
	for _, ns := range slices.Backward(spaces) {
		killIn(ns)
		if err := runCmd("ip", "netns", "del", ns); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	l.dials.Wait()
	for _, fd := range []int{l.obsNS, l.hostNS} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	if l.dir != "" {
		_ = os.RemoveAll(l.dir)
	}
	_ = os.Remove(netLock)
	l.lock.Close()
}

// dialer dials from the observer's namespace: each connection's socket is
// made on a thread that joins it for the dial and then goes back to the
// host's namespace. A thread that cannot go back is not unlocked, and so
// ends with its goroutine. (No thread may end otherwise: a process whose
// parent thread ends gets its Pdeathsig.)
func (l *netLab) dialer(ctx context.Context, addr string) (net.Conn, error) {
	if _, rest, ok := strings.Cut(addr, "://"); ok {
		addr = rest
	}
	type dialed struct {
		c   net.Conn
		err error
	}
	ch := make(chan dialed, 1)
	l.dials.Go(func() { // cleanup waits for it
		runtime.LockOSThread()
		if err := unix.Setns(l.obsNS, unix.CLONE_NEWNET); err != nil {
			ch <- dialed{err: fmt.Errorf("setns: %w", err)}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if unix.Setns(l.hostNS, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		ch <- dialed{c, err}
	})
	r := <-ch
	return r.c, r.err
}

// nftCut drops, in namespace ns, every packet to or from the addresses
// given (of the lab's hosts): a silent partition, as a cable pulled, not a
// refused connection.
func nftCut(ns string, addrs []string) error {
	set := strings.Join(addrs, ", ")
	return nftRules(ns, fmt.Sprintf(`chain in { type filter hook input priority 0; ip saddr { %s } drop; }
	chain out { type filter hook output priority 0; ip daddr { %s } drop; }`, set, set))
}

// nftLoss drops pct % of the packets namespace ns sends to the lab's hosts,
// at random: loss one way.
func nftLoss(ns string, pct int) error {
	return nftRules(ns, fmt.Sprintf(`chain out { type filter hook output priority 0; ip daddr %s0/24 numgen random mod 100 < %d drop; }`,
		netSubnet, pct))
}

// nftDuplicate sends pct % of the packets namespace ns sends to the lab's
// hosts twice, at random.
func nftDuplicate(ns string, pct int) error {
	return nftRules(ns, fmt.Sprintf(`chain out { type filter hook output priority 0; ip daddr %s0/24 numgen random mod 100 < %d dup to ip daddr device "eth0"; }`,
		netSubnet, pct))
}

// nftRules sets the chains of namespace ns's table of faults. One fault
// per namespace at a time.
func nftRules(ns, chains string) error {
	return runIn(ns, "table ip etcdlock_net {\n\t"+chains+"\n}\n", "nft", "-f", "-")
}

// nftHeal removes the table of faults of namespace ns, if any.
func nftHeal(ns string) error {
	err := runIn(ns, "", "nft", "delete", "table", "ip", "etcdlock_net")
	if err != nil && strings.Contains(err.Error(), "No such file or directory") {
		return nil
	}
	return err
}

// slowLink limits what namespace ns sends to rate with tc's token bucket
// filter, which queues the rest for up to a second: a congested link,
// whose delay grows with the traffic (this kernel may lack netem, which
// would delay every packet alike); with rate "", removes it.
func slowLink(ns, rate string) error {
	if rate == "" {
		return runIn(ns, "", "tc", "qdisc", "del", "dev", "eth0", "root")
	}
	return runIn(ns, "", "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", rate, "burst", "4kb", "latency", "1s")
}
