package etcdlock_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// netCluster is an etcd cluster of separate processes of an etcd binary,
// each member in a namespace of the lab's, with its data kept across
// restarts.
type netCluster struct {
	t        *testing.T
	lab      *netLab
	bin      string
	members  []*netMember
	initial  string           // the initial cluster, given again on restarts
	observer *clientv3.Client // from the observer's namespace
}

type netMember struct {
	name, ns, ip, dir string
	cmd               *exec.Cmd
	exited            chan struct{}
}

// memberAddr is the last byte of member i's address; holder i's is
// clientAddr+i, the observer's observerAddr.
func memberAddr(i int) int { return 11 + i }

const (
	clientAddr   = 101
	observerAddr = 254
)

// startNetCluster starts n members of bin in the lab and waits until the
// cluster answers.
func startNetCluster(t *testing.T, lab *netLab, bin string, n int) *netCluster {
	t.Helper()
	c := &netCluster{t: t, lab: lab, bin: bin}
	var initial []string
	for i := range n {
		m := &netMember{name: fmt.Sprintf("m%d", i), ip: fmt.Sprintf("%s%d", netSubnet, memberAddr(i))}
		m.ns = lab.host(t, m.name, memberAddr(i))
		m.dir = filepath.Join(lab.dir, m.name)
		c.members = append(c.members, m)
		initial = append(initial, fmt.Sprintf("%s=http://%s:2380", m.name, m.ip))
	}
	c.initial = strings.Join(initial, ",")
	for i := range c.members {
		c.start(i)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(lab.dialer)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	c.observer = cli
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := waitUntil(ctx, func() bool { return c.leader() >= 0 }); err != nil {
		t.Fatalf("no leader within a minute; member logs:\n%s", c.logs())
	}
	return c
}

// start starts member i, or starts it again with its data: etcd then
// ignores the initial cluster.
func (c *netCluster) start(i int) {
	m := c.members[i]
	url := func(port int) string { return fmt.Sprintf("http://%s:%d", m.ip, port) }
	log, err := os.OpenFile(filepath.Join(c.lab.dir, m.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	defer log.Close() // the child has its own descriptor
	m.cmd = exec.Command("ip", "netns", "exec", m.ns, c.bin,
		"--name", m.name, "--data-dir", m.dir,
		"--listen-client-urls", url(2379), "--advertise-client-urls", url(2379),
		"--listen-peer-urls", url(2380), "--initial-advertise-peer-urls", url(2380),
		"--initial-cluster", c.initial, "--initial-cluster-state", "new", "--initial-cluster-token", "etcdlock-net",
		"--logger", "zap", "--log-level", "warn")
	m.cmd.Stdout, m.cmd.Stderr = log, log
	if err := c.lab.start(m.cmd); err != nil {
		c.t.Fatalf("member %s: %v", m.name, err)
	}
	m.exited = make(chan struct{})
	cmd, exited := m.cmd, m.exited
	go func() { // ends with the process, which the lab kills at the latest
		_ = cmd.Wait()
		close(exited)
	}()
}

// signal sends sig to member i.
func (c *netCluster) signal(i int, sig syscall.Signal) {
	_ = c.members[i].cmd.Process.Signal(sig)
}

// kill kills member i and waits until it has exited.
func (c *netCluster) kill(i int) {
	c.signal(i, syscall.SIGCONT)
	c.signal(i, syscall.SIGKILL)
	<-c.members[i].exited
}

// stopAll stops every member with SIGTERM, as an operator would, and waits.
func (c *netCluster) stopAll() {
	for i, m := range c.members {
		c.signal(i, syscall.SIGCONT)
		c.signal(i, syscall.SIGTERM)
		select {
		case <-m.exited:
		case <-time.After(testTimeout):
			c.kill(i)
		}
	}
}

func (c *netCluster) endpoints() []string {
	var eps []string
	for _, m := range c.members {
		eps = append(eps, fmt.Sprintf("http://%s:2379", m.ip))
	}
	return eps
}

// all returns every member's index.
func (c *netCluster) all() []int {
	var out []int
	for i := range c.members {
		out = append(out, i)
	}
	return out
}

// addrs returns the addresses of the members given.
func (c *netCluster) addrs(members ...int) []string {
	var out []string
	for _, i := range members {
		out = append(out, c.members[i].ip)
	}
	return out
}

// leader returns the member that says it leads, or -1.
func (c *netCluster) leader() int {
	for i, ep := range c.endpoints() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := c.observer.Status(ctx, ep)
		cancel()
		if err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
			return i
		}
	}
	return -1
}

// waitLeader waits until a member leads, for up to testTimeout.
func (c *netCluster) waitLeader() int {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	lead := -1
	if err := waitUntil(ctx, func() bool { lead = c.leader(); return lead >= 0 }); err != nil {
		c.t.Fatalf("no leader within %v; member logs:\n%s", testTimeout, c.logs())
	}
	return lead
}

// logs returns the end of each member's log.
func (c *netCluster) logs() string {
	var b strings.Builder
	for _, m := range c.members {
		out, _ := os.ReadFile(filepath.Join(c.lab.dir, m.name+".log"))
		if len(out) > 2000 {
			out = out[len(out)-2000:]
		}
		fmt.Fprintf(&b, "--- %s\n%s\n", m.name, out)
	}
	return b.String()
}
