package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
)

// TLSFiles are the client side of a WithTLS server or cluster: the files to
// give to a client such as etcdctl (--cacert, --cert, --key) and the same
// material as a ready-made *tls.Config.
//
// The files live in a tb.TempDir() and are removed when the test ends; those
// of a Server from New are removed by its Close. The certificates are valid
// for a day and must never leave a test.
type TLSFiles struct {
	CAFile   string // PEM CA certificate that signed the server and client certificates
	CertFile string // PEM client certificate, accepted under WithClientCertAuth
	KeyFile  string // PEM private key of the client certificate

	// Config trusts the CA and presents the client certificate.
	Config *tls.Config
}

// clone returns a copy whose Config can be changed without touching f.
func (f *TLSFiles) clone() *TLSFiles {
	if f == nil {
		return nil
	}
	c := *f
	c.Config = f.Config.Clone()
	return &c
}

// certs is the TLS material of one server or cluster.
type certs struct {
	client TLSFiles
	server transport.TLSInfo
}

// newCerts writes a CA, a server certificate (127.0.0.1, localhost) and a
// client certificate to dir.
func newCerts(dir string, clientCertAuth bool) (*certs, error) {
	ca, caKey, err := newCert(nil, nil, "etcdtest CA", 0)
	if err != nil {
		return nil, err
	}
	// The server certificate also allows client auth: etcd presents it
	// when it dials itself.
	srv, srvKey, err := newCert(ca, caKey, "etcdtest server", x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return nil, err
	}
	cli, cliKey, err := newCert(ca, caKey, "etcdtest client", x509.ExtKeyUsageClientAuth)
	if err != nil {
		return nil, err
	}

	c := &certs{client: TLSFiles{
		CAFile:   filepath.Join(dir, "ca.pem"),
		CertFile: filepath.Join(dir, "client.pem"),
		KeyFile:  filepath.Join(dir, "client-key.pem"),
	}}
	c.server = transport.TLSInfo{
		CertFile:       filepath.Join(dir, "server.pem"),
		KeyFile:        filepath.Join(dir, "server-key.pem"),
		TrustedCAFile:  c.client.CAFile,
		ClientCertAuth: clientCertAuth,
	}
	cliKeyDER, err := x509.MarshalPKCS8PrivateKey(cliKey)
	if err != nil {
		return nil, fmt.Errorf("etcdtest: %w", err)
	}
	srvKeyDER, err := x509.MarshalPKCS8PrivateKey(srvKey)
	if err != nil {
		return nil, fmt.Errorf("etcdtest: %w", err)
	}
	for _, f := range []struct {
		path string
		typ  string
		der  []byte
	}{
		{c.client.CAFile, "CERTIFICATE", ca.Raw},
		{c.client.CertFile, "CERTIFICATE", cli.Raw},
		{c.client.KeyFile, "PRIVATE KEY", cliKeyDER},
		{c.server.CertFile, "CERTIFICATE", srv.Raw},
		{c.server.KeyFile, "PRIVATE KEY", srvKeyDER},
	} {
		data := pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der})
		if err := os.WriteFile(f.path, data, 0o600); err != nil {
			return nil, fmt.Errorf("etcdtest: %w", err)
		}
	}

	pair, err := tls.LoadX509KeyPair(c.client.CertFile, c.client.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("etcdtest: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	c.client.Config = &tls.Config{
		RootCAs:      pool,
		Certificates: []tls.Certificate{pair},
		MinVersion:   tls.VersionTLS12,
	}
	return c, nil
}

// newCert returns a new certificate and its private key. Without a
// parent it is a self-signed CA; otherwise it is a leaf for 127.0.0.1 and
// localhost with the given usages, signed by parent.
func newCert(parent *x509.Certificate, parentKey *ecdsa.PrivateKey, name string, usage ...x509.ExtKeyUsage) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("etcdtest: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, fmt.Errorf("etcdtest: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name, Organization: []string{"etcdtest"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
	}
	signer, signerKey := tmpl, key
	if parent == nil {
		tmpl.IsCA = true
		tmpl.BasicConstraintsValid = true
		tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	} else {
		signer, signerKey = parent, parentKey
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		tmpl.ExtKeyUsage = usage
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		return nil, nil, fmt.Errorf("etcdtest: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("etcdtest: %w", err)
	}
	return cert, key, nil
}
