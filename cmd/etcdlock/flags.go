package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// commandFlags is the flag set of one command, with its help text. Flags may
// come before and after NAME; "--" ends them.
type commandFlags struct {
	*flag.FlagSet
	synopsis string // arguments after "etcdlock NAME"
	about    string // what the command does
	groups   []flagGroup
}

// flagGroup is a titled list of flags, in the order the help shows them.
type flagGroup struct {
	title string
	names []string
}

func newCommandFlags(name, synopsis, about string) *commandFlags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &commandFlags{FlagSet: fs, synopsis: synopsis, about: about}
}

// parseDuration parses a Go duration, and says what a number without a
// unit would mean in seconds: "--ttl 5" asks for "5s".
func parseDuration(s, examples string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err == nil {
		return d, nil
	}
	if _, nerr := strconv.ParseFloat(s, 64); nerr == nil {
		return 0, fmt.Errorf("a duration needs a unit: %ss for %s seconds", s, s)
	}
	return 0, fmt.Errorf("not a duration such as %s", examples)
}

// durationFlag is a time.Duration flag whose errors say what was meant.
type durationFlag struct {
	d        *time.Duration
	examples string
}

func (f durationFlag) String() string {
	if f.d == nil {
		return ""
	}
	return f.d.String()
}

func (f durationFlag) Set(s string) error {
	d, err := parseDuration(s, f.examples)
	if err != nil {
		return err
	}
	*f.d = d
	return nil
}

// durationVar defines a duration flag with errors that say what was meant.
func (c *commandFlags) durationVar(p *time.Duration, name string, value time.Duration, examples, usage string) {
	*p = value
	c.Var(durationFlag{d: p, examples: examples}, name, usage)
}

// parse parses flags from args up to the first other argument, and reports
// whether it stopped at (and consumed) "--". -h is returned as flag.ErrHelp,
// other mistakes as usage errors.
func (c *commandFlags) parse(args []string) (rest []string, dashdash bool, err error) {
	if err := c.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, false, err
		}
		return nil, false, usagef(c.Name(), "%v", err)
	}
	rest = c.Args()
	n := len(args) - len(rest)
	return rest, n > 0 && args[n-1] == "--", nil
}

// parseName parses flags, NAME, then flags again, and returns NAME and what
// follows: the arguments after the first other argument or "--".
func (c *commandFlags) parseName(args []string) (name string, rest []string, err error) {
	return c.parseArg(args, "lock NAME")
}

// parseArg parses flags, the command's one argument (what names it in the
// error when it is missing), then flags again, and returns the argument and
// what follows: the arguments after the first other argument or "--". So
// flags go anywhere before "--" and COMMAND, in every command.
func (c *commandFlags) parseArg(args []string, what string) (arg string, rest []string, err error) {
	rest, dashdash, err := c.parse(args)
	if err != nil {
		return "", nil, err
	}
	if len(rest) == 0 || rest[0] == "" {
		return "", nil, usagef(c.Name(), "missing %s", what)
	}
	arg, rest = rest[0], rest[1:]
	if dashdash {
		// "-- NAME": NAME may start with "-"; no flags after it.
		if len(rest) > 0 && rest[0] == "--" {
			rest = rest[1:]
		}
		return arg, rest, nil
	}
	rest, _, err = c.parse(rest)
	return arg, rest, err
}

// printUsage writes the help of the command to w.
func (c *commandFlags) printUsage(w io.Writer) {
	fmt.Fprintf(w, "Usage: etcdlock %s %s\n\n%s", c.Name(), c.synopsis, c.about)
	for _, g := range c.groups {
		fmt.Fprintf(w, "\n%s:\n", g.title)
		for _, name := range g.names {
			f := c.Lookup(name)
			typ, usage := flag.UnquoteUsage(f)
			if typ != "" {
				typ = " " + typ
			}
			fmt.Fprintf(w, "  --%s%s\n      %s", f.Name, typ, usage)
			if f.DefValue != "" && f.DefValue != "false" {
				fmt.Fprintf(w, " (default %s)", f.DefValue)
			}
			fmt.Fprintln(w)
		}
	}
}

// showHelp prints the usage for flag.ErrHelp and reports whether it did.
func (c *commandFlags) showHelp(err error, sio stdio) bool {
	if errors.Is(err, flag.ErrHelp) {
		c.printUsage(sio.out)
		return true
	}
	return false
}

const (
	defaultEndpoint    = "127.0.0.1:2379"
	defaultDialTimeout = 2 * time.Second
)

// connFlags are the connection flags every command shares, named and read
// from the environment as etcdctl's are: a flag given on the command line
// wins over its ETCDCTL_ variable.
type connFlags struct {
	endpoints   string
	dialTimeout time.Duration
	cacert      string
	cert        string
	key         string
	user        string
	password    string
}

// connEnv maps each connection flag to its environment variable.
var connEnv = []struct{ flag, env string }{
	{"endpoints", "ETCDCTL_ENDPOINTS"},
	{"dial-timeout", "ETCDCTL_DIAL_TIMEOUT"},
	{"cacert", "ETCDCTL_CACERT"},
	{"cert", "ETCDCTL_CERT"},
	{"key", "ETCDCTL_KEY"},
	{"user", "ETCDCTL_USER"},
	{"password", "ETCDCTL_PASSWORD"},
}

// register adds the connection flags to c. Their defaults are constants, so
// that help never shows a value taken from the environment. Without env
// (demo), there is no default endpoint and no ETCDCTL_ variable applies.
func (cf *connFlags) register(c *commandFlags, env bool) {
	endpoints, usage := defaultEndpoint, "comma-separated etcd `endpoints`"
	if !env {
		endpoints, usage = "", "comma-separated etcd `endpoints`; without it, an etcd embedded in this process"
	}
	c.StringVar(&cf.endpoints, "endpoints", endpoints, usage)
	c.durationVar(&cf.dialTimeout, "dial-timeout", defaultDialTimeout, "2s or 500ms", "give up if etcd does not answer within this `duration`")
	c.StringVar(&cf.cacert, "cacert", "", "verify the server's certificate with this CA bundle `file`; enables TLS")
	c.StringVar(&cf.cert, "cert", "", "client certificate `file` for TLS, with --key")
	c.StringVar(&cf.key, "key", "", "client private key `file` for TLS, with --cert")
	c.StringVar(&cf.user, "user", "", "`name[:password]` for etcd authentication")
	c.StringVar(&cf.password, "password", "", "`password` for etcd authentication; --user is then the name only")
	title := "Connection flags (as etcdctl's; only with --endpoints)"
	if env {
		title = "Connection flags (as etcdctl's; ETCDCTL_ENDPOINTS, ETCDCTL_DIAL_TIMEOUT, ETCDCTL_CACERT,\nETCDCTL_CERT, ETCDCTL_KEY, ETCDCTL_USER and ETCDCTL_PASSWORD apply to flags not given)"
	}
	names := make([]string, len(connEnv))
	for i, e := range connEnv {
		names[i] = e.flag
	}
	c.groups = append(c.groups, flagGroup{title: title, names: names})
}

// fromEnv sets each connection flag not given on the command line from its
// ETCDCTL_ variable, if that is set and not empty.
func (cf *connFlags) fromEnv(c *commandFlags, getenv func(string) string) error {
	given := map[string]bool{}
	c.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, e := range connEnv {
		v := getenv(e.env)
		if given[e.flag] || v == "" {
			continue
		}
		switch e.flag {
		case "endpoints":
			cf.endpoints = v
		case "dial-timeout":
			d, err := parseDuration(v, "2s or 500ms")
			if err != nil {
				return usagef(c.Name(), "%s: %v", e.env, err)
			}
			cf.dialTimeout = d
		case "cacert":
			cf.cacert = v
		case "cert":
			cf.cert = v
		case "key":
			cf.key = v
		case "user":
			cf.user = v
		case "password":
			cf.password = v
		}
	}
	return nil
}

// config returns the client configuration of the flags. Its errors are
// usage errors, and never contain the password.
func (cf *connFlags) config(cmd string) (clientv3.Config, error) {
	cfg := clientv3.Config{
		DialTimeout: cf.dialTimeout,
		Logger:      zap.NewNop(),
	}
	for ep := range strings.SplitSeq(cf.endpoints, ",") {
		if ep = strings.TrimSpace(ep); ep != "" {
			cfg.Endpoints = append(cfg.Endpoints, ep)
		}
	}
	if len(cfg.Endpoints) == 0 {
		return clientv3.Config{}, usagef(cmd, "no etcd endpoints")
	}
	if cf.dialTimeout <= 0 {
		return clientv3.Config{}, usagef(cmd, "--dial-timeout must be positive, got %v", cf.dialTimeout)
	}
	if (cf.cert == "") != (cf.key == "") {
		return clientv3.Config{}, usagef(cmd, "--cert and --key go together")
	}
	if cf.cacert != "" || cf.cert != "" {
		info := transport.TLSInfo{CertFile: cf.cert, KeyFile: cf.key, TrustedCAFile: cf.cacert, Logger: zap.NewNop()}
		tc, err := info.ClientConfig()
		if err != nil {
			return clientv3.Config{}, usagef(cmd, "TLS files: %v", err)
		}
		cfg.TLS = tc
	}
	switch {
	case cf.user == "" && cf.password != "":
		return clientv3.Config{}, usagef(cmd, "a password needs a user: give --user NAME")
	case cf.user == "":
	case cf.password != "":
		cfg.Username, cfg.Password = cf.user, cf.password
	default:
		name, pw, ok := strings.Cut(cf.user, ":")
		if !ok {
			return clientv3.Config{}, usagef(cmd, "no password for the user: give --user NAME:PASSWORD, --password or ETCDCTL_PASSWORD")
		}
		cfg.Username, cfg.Password = name, pw
	}
	return cfg, nil
}

// endpointList returns the endpoints of cfg for messages, with anything
// before an "@" (user information) redacted.
func endpointList(cfg clientv3.Config) string {
	eps := make([]string, len(cfg.Endpoints))
	for i, ep := range cfg.Endpoints {
		if at := strings.LastIndex(ep, "@"); at >= 0 {
			scheme, _, ok := strings.Cut(ep[:at], "://")
			if ok {
				scheme += "://"
			} else {
				scheme = ""
			}
			ep = scheme + "REDACTED@" + ep[at+1:]
		}
		eps[i] = ep
	}
	return strings.Join(eps, ",")
}
