package etcdtest

import "go.uber.org/zap"

// An Option changes how Start, New and StartCluster configure etcd and the
// clients they hand out.
type Option interface {
	apply(*options)
}

type options struct {
	tls            bool
	clientCertAuth bool
	fsync          bool
	logger         *zap.Logger

	scope *scope // on an external etcd: the prefix of the clients handed out
}

type optionFunc func(*options)

func (f optionFunc) apply(o *options) { f(o) }

func buildOptions(opts []Option) *options {
	o := &options{logger: zap.NewNop()}
	for _, opt := range opts {
		opt.apply(o)
	}
	return o
}

// WithTLS serves clients over TLS only: client URLs use https, with a
// self-signed CA, a server certificate for 127.0.0.1 and localhost, and a
// client certificate, all written to a tb.TempDir() (under New, to the
// directory that Close removes). Clients from Client, ProxiedClient and
// NewClient use them; TLS returns the files. Peer traffic between cluster
// members stays plain http.
//
// Default: clients are served over plain http.
func WithTLS() Option {
	return optionFunc(func(o *options) { o.tls = true })
}

// WithClientCertAuth makes etcd require a client certificate signed by the
// test CA, and implies WithTLS.
//
// Default: client certificates are neither required nor checked.
func WithClientCertAuth() Option {
	return optionFunc(func(o *options) {
		o.tls = true
		o.clientCertAuth = true
	})
}

// WithFsync makes etcd fsync its write-ahead log and its backend, as a
// production etcd does, so that every write waits for the disk. Use it to
// measure what users run; the data directory is a tb.TempDir() (New: a
// directory under os.TempDir()), so point TMPDIR at the disk to be measured.
//
// Default: no fsync (etcd's UnsafeNoFsync), which only matters if the
// machine crashes and makes writes independent of the disk's speed.
func WithFsync() Option {
	return optionFunc(func(o *options) { o.fsync = true })
}

// WithLogger sends the logs of etcd, of its clients and of the fault-injection
// proxies to l. A nil l keeps the default.
//
// Default: zap.NewNop(), nothing is logged.
func WithLogger(l *zap.Logger) Option {
	return optionFunc(func(o *options) {
		if l != nil {
			o.logger = l
		}
	})
}
