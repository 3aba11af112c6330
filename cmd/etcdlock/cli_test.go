package main

import (
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// callCLI runs the command line in this process with env as its environment.
// Only calls that stop before reaching etcd, or run on an etcd of their own
// (demo), belong here.
func callCLI(env map[string]string, args ...string) (code int, stdout, stderr string) {
	var out, errOut strings.Builder
	code = cli(args, stdio{out: &out, err: &errOut, getenv: func(k string) string { return env[k] }})
	return code, out.String(), errOut.String()
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want int
		out  string // in stdout, or in stderr for a usage error
	}{
		{nil, nil, exitUsage, "etcdlock run [flags] NAME -- COMMAND"},
		{[]string{"help"}, nil, 0, "etcdlock holders [flags] NAME"},
		{[]string{"version"}, nil, 0, "etcdlock "},
		{[]string{"--version"}, nil, 0, runtime.Version()},
		{[]string{"version", "x"}, nil, exitUsage, "unexpected argument"},
		{[]string{"-h"}, nil, 0, "etcdlock demo [flags]"},
		{[]string{"--help"}, nil, 0, "etcdlock run"},
		{[]string{"help", "run"}, nil, 0, "--kill-grace"},
		{[]string{"help", "holders"}, nil, 0, "no holder"},
		{[]string{"holders", "-h"}, nil, 0, "--watch"},
		{[]string{"help", "release"}, nil, 0, "--lock-key"},
		{[]string{"release", "-h"}, nil, 0, "fenced on the key's token"},
		{[]string{"help", "demo"}, nil, 0, "--workers"},
		{[]string{"help", "frobnicate"}, nil, exitUsage, "unknown command"},
		{[]string{"run", "-h"}, nil, 0, "ETCDLOCK_TOKEN"},
		{[]string{"holders", "--help"}, nil, 0, "Usage: etcdlock holders"},
		{[]string{"demo", "-h"}, nil, 0, "Usage: etcdlock demo"},
		{[]string{"frobnicate"}, nil, exitUsage, `unknown command "frobnicate"`},
		{[]string{"run"}, nil, exitUsage, "missing lock NAME"},
		{[]string{"run", "n"}, nil, exitUsage, "missing COMMAND"},
		{[]string{"run", "n", "--"}, nil, exitUsage, "missing COMMAND"},
		{[]string{"run", "--bogus", "n", "--", "true"}, nil, exitUsage, "-bogus"},
		{[]string{"run", "--ttl", "banana", "n", "--", "true"}, nil, exitUsage, "-ttl"},
		{[]string{"run", "--ttl", "0s", "n", "--", "true"}, nil, exitUsage, "--ttl must be positive"},
		{[]string{"run", "--ttl", "5", "n", "--", "true"}, nil, exitUsage, "5s for 5 seconds"},
		{[]string{"run", "--wait", "30", "n", "--", "true"}, nil, exitUsage, "30s for 30 seconds"},
		{[]string{"run", "--kill-grace", "2", "n", "--", "true"}, nil, exitUsage, "2s for 2 seconds"},
		{[]string{"run", "n", "--", "true"}, map[string]string{"ETCDCTL_DIAL_TIMEOUT": "3"}, exitUsage, "ETCDCTL_DIAL_TIMEOUT: a duration needs a unit: 3s"},
		{[]string{"run", "--wait", "-1s", "n", "--", "true"}, nil, exitUsage, "must not be negative"},
		{[]string{"run", "--kill-grace", "-1s", "n", "--", "true"}, nil, exitUsage, "-kill-grace"},
		{[]string{"run", "n", "--wait", "soon", "--", "true"}, nil, exitUsage, "-wait"},
		{[]string{"run", "--conflict-exit-code", "256", "n", "--", "true"}, nil, exitUsage, "--conflict-exit-code must be from 0 to 255"},
		{[]string{"run", "--conflict-exit-code", "-1", "n", "--", "true"}, nil, exitUsage, "--conflict-exit-code"},
		{[]string{"help", "run"}, nil, 0, "flock's -E"},
		{[]string{"help", "run"}, nil, 0, "--shared"},
		{[]string{"run", "--limit", "0", "n", "--", "true"}, nil, exitUsage, "--limit must be at least 1"},
		{[]string{"run", "--shared", "--limit", "2", "n", "--", "true"}, nil, exitUsage, "--shared and --limit"},
		{[]string{"run", "--identity", "x", "--identity-cmd", "n", "--", "true"}, nil, exitUsage, "not with --identity"},
		{[]string{"run", "--endpoints", ",", "n", "--", "true"}, nil, exitUsage, "no etcd endpoints"},
		{[]string{"run", "--dial-timeout", "0s", "n", "--", "true"}, nil, exitUsage, "--dial-timeout"},
		{[]string{"run", "--cert", "c.pem", "n", "--", "true"}, nil, exitUsage, "--cert and --key"},
		{[]string{"run", "--cacert", "/nonexistent/ca.pem", "n", "--", "true"}, nil, exitUsage, "TLS files"},
		{[]string{"run", "--user", "bob", "n", "--", "true"}, nil, exitUsage, "no password"},
		{[]string{"run", "n", "--", "true"}, map[string]string{"ETCDCTL_DIAL_TIMEOUT": "soon"}, exitUsage, "ETCDCTL_DIAL_TIMEOUT"},
		{[]string{"holders"}, nil, exitUsage, "missing lock NAME"},
		{[]string{"holders", "a", "b"}, nil, exitUsage, `unexpected argument "b"`},
		{[]string{"demo", "extra"}, nil, exitUsage, "unexpected argument"},
		{[]string{"demo", "--workers", "2"}, nil, exitUsage, "--workers"},
		{[]string{"demo", "--rounds", "0"}, nil, exitUsage, "--rounds"},
		{[]string{"demo", "--cacert", "ca.pem"}, nil, exitUsage, "need --endpoints"},
		// Flags go anywhere before "--" (and run's COMMAND), in every
		// command: a flag after the argument is read as a flag.
		{[]string{"run", "n", "--bogus", "--", "true"}, nil, exitUsage, "flag provided but not defined: -bogus"},
		{[]string{"holders", "n", "--bogus"}, nil, exitUsage, "flag provided but not defined: -bogus"},
		{[]string{"limit", "n", "--bogus"}, nil, exitUsage, "flag provided but not defined: -bogus"},
		{[]string{"release", "n", "--bogus"}, nil, exitUsage, "flag provided but not defined: -bogus"},
		{[]string{"check", "etcdlock:1:n:n/1", "--bogus"}, nil, exitUsage, "flag provided but not defined: -bogus"},
		{[]string{"check"}, nil, exitUsage, "missing FENCE"},
		{[]string{"check", "etcdlock:1:n:n/1", "x"}, nil, exitUsage, `unexpected argument "x" after FENCE`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := callCLI(tc.env, tc.args...)
			if code != tc.want {
				t.Fatalf("exit status: got %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.want, stdout, stderr)
			}
			where := stdout
			if code != 0 {
				where = stderr
			}
			if !strings.Contains(where, tc.out) {
				t.Fatalf("output: got stdout %q, stderr %q; want %q in the %s", stdout, stderr, tc.out, map[bool]string{true: "stdout", false: "stderr"}[code == 0])
			}
		})
	}
}

// parseConn parses the connection flags of args with env as the environment.
func parseConn(args []string, env map[string]string) (clientv3.Config, error) {
	c := newCommandFlags("test", "", "")
	var cf connFlags
	cf.register(c, true)
	if _, _, err := c.parse(args); err != nil {
		return clientv3.Config{}, err
	}
	if err := cf.fromEnv(c, func(k string) string { return env[k] }); err != nil {
		return clientv3.Config{}, err
	}
	return cf.config("test")
}

func TestConnFlags(t *testing.T) {
	for _, tc := range []struct {
		name      string
		args      []string
		env       map[string]string
		endpoints []string
		dial      time.Duration
		user, pw  string
	}{
		{"defaults", nil, nil, []string{"127.0.0.1:2379"}, 2 * time.Second, "", ""},
		{"environment", nil, map[string]string{"ETCDCTL_ENDPOINTS": "a:1, b:2", "ETCDCTL_DIAL_TIMEOUT": "5s"},
			[]string{"a:1", "b:2"}, 5 * time.Second, "", ""},
		{"flags win", []string{"--endpoints", "c:3", "--dial-timeout", "1s"}, map[string]string{"ETCDCTL_ENDPOINTS": "a:1", "ETCDCTL_DIAL_TIMEOUT": "5s"},
			[]string{"c:3"}, time.Second, "", ""},
		{"user:password", []string{"--user", "bob:pw:with:colons"}, nil, []string{"127.0.0.1:2379"}, 2 * time.Second, "bob", "pw:with:colons"},
		{"user and password", []string{"--user", "bo:b", "--password", "pw"}, nil, []string{"127.0.0.1:2379"}, 2 * time.Second, "bo:b", "pw"},
		{"user and password environment", nil, map[string]string{"ETCDCTL_USER": "bob", "ETCDCTL_PASSWORD": "pw"},
			[]string{"127.0.0.1:2379"}, 2 * time.Second, "bob", "pw"},
		{"user:password environment", nil, map[string]string{"ETCDCTL_USER": "bob:pw"}, []string{"127.0.0.1:2379"}, 2 * time.Second, "bob", "pw"},
		{"user flag, password environment", []string{"--user", "alice"}, map[string]string{"ETCDCTL_USER": "bob", "ETCDCTL_PASSWORD": "pw"},
			[]string{"127.0.0.1:2379"}, 2 * time.Second, "alice", "pw"},
		{"password alone in the environment", nil, map[string]string{"ETCDCTL_PASSWORD": "pw"}, nil, 0, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parseConn(tc.args, tc.env)
			if tc.endpoints == nil {
				if err == nil {
					t.Fatalf("got config %+v, want an error", cfg.Endpoints)
				}
				return
			}
			if err != nil {
				t.Fatalf("got %v, want nil", err)
			}
			if !slices.Equal(cfg.Endpoints, tc.endpoints) || cfg.DialTimeout != tc.dial || cfg.Username != tc.user || cfg.Password != tc.pw {
				t.Fatalf("got endpoints %q, dial timeout %v, user %q, password %q; want %q, %v, %q, %q",
					cfg.Endpoints, cfg.DialTimeout, cfg.Username, cfg.Password, tc.endpoints, tc.dial, tc.user, tc.pw)
			}
			if cfg.TLS != nil {
				t.Fatalf("TLS: got a config, want none without --cacert or --cert")
			}
		})
	}
}

// TestPasswordNeverShown checks every message a bad command line can give,
// and every help text, with a password on the command line or in the
// environment.
func TestPasswordNeverShown(t *testing.T) {
	const secret = "hunter2-S3CRET"
	// No command line here may reach etcd: an empty ETCDCTL_ENDPOINTS makes
	// the ones the environment completes fail.
	env := map[string]string{"ETCDCTL_PASSWORD": secret, "ETCDCTL_USER": "bob:" + secret, "ETCDCTL_ENDPOINTS": ","}
	for _, args := range [][]string{
		{"help"},
		{"help", "run"},
		{"help", "holders"},
		{"help", "demo"},
		{"run", "-h"},
		{"run", "--user", "bob", "--password", secret, "--dial-timeout", "0s", "n", "--", "true"},
		{"run", "--user", "bob:" + secret, "--cert", "c.pem", "n", "--", "true"},
		{"run", "--user", "bob:" + secret, "--cacert", "/nonexistent/ca.pem", "n", "--", "true"},
		{"run", "--password", secret, "n", "--", "true"},
		{"run", "--user", "bob", "--password", secret, "--bogus", "n", "--", "true"},
		{"run", "--user", "bob", "--password", secret, "n"},
		{"run", "--pasword=" + secret, "n", "--", "true"},
		{"holders", "--user", "bob:" + secret, "--endpoints", "", "n"},
		{"holders", "--user", "bob:" + secret, "a", "b"},
		{"demo", "--user", "bob:" + secret},
		{"demo", "--password", secret, "--endpoints", "x:1", "--workers", "1"},
	} {
		for _, e := range []map[string]string{nil, env, {"ETCDCTL_USER": "bob", "ETCDCTL_PASSWORD": secret, "ETCDCTL_DIAL_TIMEOUT": "soon"}} {
			code, stdout, stderr := callCLI(e, args...)
			if code != exitUsage && code != 0 {
				t.Errorf("etcdlock %q: got exit status %d, want a usage error or help", args, code)
			}
			if strings.Contains(stdout+stderr, secret) {
				t.Errorf("etcdlock %q with environment %v shows the password:\n%s%s", args, e != nil, stdout, stderr)
			}
		}
	}
}

func TestEndpointList(t *testing.T) {
	cfg := clientv3.Config{Endpoints: []string{"https://u:pw@h:1", "u:pw@h:2", "h:3"}}
	got := endpointList(cfg)
	if want := "https://REDACTED@h:1,REDACTED@h:2,h:3"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestEndpointAddr(t *testing.T) {
	for _, tc := range []struct {
		ep, want string
		ok       bool
	}{
		{"127.0.0.1:2379", "127.0.0.1:2379", true},
		{"http://etcd-1:2379", "etcd-1:2379", true},
		{"https://u:pw@etcd-1:2379", "etcd-1:2379", true},
		{"u:pw@[::1]:2379", "[::1]:2379", true},
		{"unix:///run/etcd.sock", "", false},
		{"etcd-1", "", false},
	} {
		got, ok := endpointAddr(tc.ep)
		if got != tc.want || ok != tc.ok {
			t.Errorf("endpointAddr(%q): got %q, %v; want %q, %v", tc.ep, got, ok, tc.want, tc.ok)
		}
	}
}
