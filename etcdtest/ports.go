package etcdtest

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"time"
)

// portHold keeps TCP ports taken while no member listens on them, so that no
// other socket gets them before the member starts again: ports picked by the
// kernel come from the range it also hands to outgoing connections. It
// accepts connections and resets them at once, so that they fail about as
// fast as a refused connection.
type portHold struct {
	listeners []net.Listener
	wg        sync.WaitGroup
}

// holdFreePorts holds n ports of 127.0.0.1 picked by the kernel.
func holdFreePorts(n int) (*portHold, error) {
	addrs := make([]string, n)
	for i := range addrs {
		addrs[i] = "127.0.0.1:0"
	}
	return holdPorts(addrs...)
}

// holdPorts holds the given addresses, all or none.
func holdPorts(addrs ...string) (*portHold, error) {
	h := &portHold{}
	for _, addr := range addrs {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			h.release()
			return nil, fmt.Errorf("etcdtest: hold port: %w", err)
		}
		h.listeners = append(h.listeners, l)
		h.wg.Go(func() { refuse(l) })
	}
	return h, nil
}

func refuse(l net.Listener) {
	for {
		c, err := l.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil { // such as too many open files: wait for some to close
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		c.Close()
	}
}

// ports returns the held ports, in the order they were asked for.
func (h *portHold) ports() []int {
	ports := make([]int, len(h.listeners))
	for i, l := range h.listeners {
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports
}

// release frees the ports and returns once they are free.
func (h *portHold) release() {
	for _, l := range h.listeners {
		l.Close()
	}
	h.wg.Wait()
}

// freePorts returns n distinct TCP ports free on 127.0.0.1 a moment ago.
// Another socket may take one before it is used; callers retry then.
func freePorts(n int) ([]int, error) {
	h, err := holdFreePorts(n)
	if err != nil {
		return nil, err
	}
	h.release()
	return h.ports(), nil
}

func localURL(scheme string, port int) url.URL {
	return url.URL{Scheme: scheme, Host: fmt.Sprintf("127.0.0.1:%d", port)}
}
