package etcdtest

import (
	"crypto/rand"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The environment variables that point the package at an etcd of the
// user's instead of an embedded one.
const (
	EnvEndpoints = "ETCDTEST_ENDPOINTS" // comma-separated client URLs, such as http://127.0.0.1:2379
	EnvCACert    = "ETCDTEST_CACERT"    // PEM CA file that signed the server's certificate
	EnvCert      = "ETCDTEST_CERT"      // PEM client certificate file, with EnvKey
	EnvKey       = "ETCDTEST_KEY"       // PEM private key file of EnvCert
)

// external is an etcd named by the environment.
type external struct {
	endpoints []string
	certs     *certs // client side only; nil without EnvCACert
}

// externalEtcd returns the etcd named by EnvEndpoints, or nil if it is unset.
var externalEtcd = sync.OnceValues(func() (*external, error) {
	eps := os.Getenv(EnvEndpoints)
	if eps == "" {
		return nil, nil
	}
	ext := &external{}
	for ep := range strings.SplitSeq(eps, ",") {
		if ep = strings.TrimSpace(ep); ep != "" {
			ext.endpoints = append(ext.endpoints, ep)
		}
	}
	ca, cert, key := os.Getenv(EnvCACert), os.Getenv(EnvCert), os.Getenv(EnvKey)
	if (cert == "") != (key == "") {
		return nil, fmt.Errorf("etcdtest: %s and %s go together", EnvCert, EnvKey)
	}
	if ca != "" || cert != "" {
		info := transport.TLSInfo{TrustedCAFile: ca, CertFile: cert, KeyFile: key}
		cfg, err := info.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("etcdtest: TLS of %s: %w", EnvEndpoints, err)
		}
		ext.certs = &certs{client: TLSFiles{CAFile: ca, CertFile: cert, KeyFile: key, Config: cfg}}
	}
	return ext, nil
})

// useExternal returns the external etcd a Server or Cluster with options o
// uses instead of starting one, or nil; it skips tb's test when the
// options ask for what only an embedded etcd gives.
func useExternal(tb testing.TB, o *options) *external {
	tb.Helper()
	ext, err := externalEtcd()
	if err != nil {
		tb.Fatalf("%v", err)
	}
	if ext != nil {
		if reason := ext.unfit(o); reason != "" {
			tb.Skipf("etcdtest: %s, which %s=%s does not give", reason, EnvEndpoints, strings.Join(ext.endpoints, ","))
		}
	}
	return ext
}

// unfit says what options o need that the external etcd cannot give, or "".
func (ext *external) unfit(o *options) string {
	switch {
	case o.tls && ext.certs == nil:
		return "the test needs etcd over TLS (WithTLS)"
	case o.clientCertAuth && ext.certs.client.CertFile == "":
		return "the test needs a client certificate (WithClientCertAuth)"
	case o.fsync:
		return "the test needs etcd's fsync settings (WithFsync)"
	}
	return ""
}

// skipFault skips tb's test, which asked for a fault that only an embedded
// etcd can inject.
func skipFault(tb testing.TB, what string) {
	tb.Helper()
	tb.Skipf("etcdtest: %s needs an embedded etcd; %s points at an external one", what, EnvEndpoints)
}

// scope is the prefix under which the clients of a Server or Cluster on an
// external etcd live, so that tests sharing the etcd do not meet, and what
// Close clears.
type scope struct {
	prefix string
	admin  *clientv3.Client // outside the prefix, for the clear

	mu     sync.Mutex
	leases []*leaseRecord
}

func newScope(ext *external, o *options) (*scope, error) {
	admin, err := newClient(ext.endpoints, o, ext.certs)
	if err != nil {
		return nil, err
	}
	return &scope{prefix: "etcdtest/" + rand.Text()[:10] + "/", admin: admin}, nil
}

// wrap puts c under the scope's prefix.
func (sc *scope) wrap(c *clientv3.Client) {
	_, leases := namespaced(c, sc.prefix)
	sc.mu.Lock()
	sc.leases = append(sc.leases, leases)
	sc.mu.Unlock()
}

// close revokes the leases granted through the scope's clients, deletes the
// keys under its prefix and closes its admin client.
func (sc *scope) close() error {
	sc.mu.Lock()
	leases := &leaseRecord{ids: map[clientv3.LeaseID]struct{}{}}
	for _, l := range sc.leases {
		for _, id := range l.granted() {
			leases.ids[id] = struct{}{}
		}
	}
	sc.mu.Unlock()
	err := (&Namespace{Prefix: sc.prefix}).clear(sc.admin, leases)
	sc.admin.Close()
	return err
}
