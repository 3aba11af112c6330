package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/syncbuf"
	"github.com/etcdlock/etcdlock/internal/testflags"
)

// asMain makes the test binary act as etcdlock: the tests run the command
// line as a child process by running this binary again with it set. This
// needs no Go toolchain at test time and builds the program under test with
// the test's own flags (-race, -cover).
const asMain = "ETCDLOCK_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMain) == "1" {
		main()
	}
	testflags.SetParallel(8) // the parallel tests mostly wait for etcd and their commands
	goleak.VerifyTestMain(m)
}

// cliTimeout bounds every etcdlock the tests run; it is far above what any
// of them needs, so that slow machines and -race do not fail the tests.
const cliTimeout = 60 * time.Second

// opTimeout bounds etcd calls and waits expected to succeed.
const opTimeout = 10 * time.Second

// result is how an etcdlock process ended.
type result struct {
	code   int
	stdout string
	stderr string
	took   time.Duration
}

// proc is an etcdlock process started by a test.
type proc struct {
	cmd    *exec.Cmd
	stdout syncbuf.Buffer
	stderr syncbuf.Buffer
	start  time.Time
}

// startCLI starts etcdlock with args, with the environment of the test
// without any ETCDCTL_ variable, plus env.
func startCLI(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	return startCLIVia(t, nil, env, args...)
}

// startCLIVia starts etcdlock through the command via, which must exec its
// arguments, such as sh -c 'trap "" HUP; exec "$@"' sh.
func startCLIVia(t *testing.T, via, env []string, args ...string) *proc {
	t.Helper()
	skipExternal(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatalf("os.Executable: %v", err)
	}
	argv := append(append(via[:len(via):len(via)], self), args...)
	ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
	p := &proc{cmd: exec.CommandContext(ctx, argv[0], argv[1:]...)}
	p.cmd.Env = append(cleanEnv(), asMain+"=1")
	p.cmd.Env = append(p.cmd.Env, env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	p.cmd.WaitDelay = 5 * time.Second
	p.start = time.Now()
	if err := p.cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start etcdlock: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Wait()
		}
	})
	return p
}

// wait waits for p to exit and returns how.
func (p *proc) wait(t *testing.T) result {
	t.Helper()
	err := p.cmd.Wait()
	r := result{stdout: p.stdout.String(), stderr: p.stderr.String(), took: time.Since(p.start)}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee) && ee.ExitCode() >= 0:
		r.code = ee.ExitCode()
	default:
		t.Fatalf("etcdlock %q: %v\nstdout:\n%s\nstderr:\n%s", p.cmd.Args[1:], err, r.stdout, r.stderr)
	}
	return r
}

// skipExternal skips a test that runs etcdlock as a process of its own on an
// external etcd (ETCDTEST_ENDPOINTS): the process dials that etcd itself,
// outside the prefix under which the test's clients see their keys.
func skipExternal(t *testing.T) {
	t.Helper()
	if os.Getenv(etcdtest.EnvEndpoints) != "" {
		t.Skip("runs etcdlock as a process, which dials ETCDTEST_ENDPOINTS outside the test's prefix: needs an embedded etcd")
	}
}

// runCLI runs etcdlock to the end.
func runCLI(t *testing.T, env []string, args ...string) result {
	t.Helper()
	return startCLI(t, env, args...).wait(t)
}

// want fails the test unless r exited with code.
func (r result) want(t *testing.T, code int) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit status: got %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, code, r.stdout, r.stderr)
	}
}

// cleanEnv returns the environment without the variables etcdlock reads or
// sets, so that the developer's own settings do not leak into the tests.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "ETCDCTL_") || strings.HasPrefix(kv, "ETCDLOCK_") || strings.HasPrefix(kv, "ETCD_LOCK_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}
