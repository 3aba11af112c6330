//go:build linux

package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/etcdlock/etcdlock/etcdtest"
	"github.com/etcdlock/etcdlock/internal/syncbuf"
)

// openPTY returns the two ends of a new pseudo-terminal.
func openPTY(t *testing.T) (ptm, pts *os.File) {
	t.Helper()
	ptm, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	if err := unix.IoctlSetPointerInt(int(ptm.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		ptm.Close()
		t.Fatalf("unlockpt: %v", err)
	}
	n, err := unix.IoctlGetInt(int(ptm.Fd()), unix.TIOCGPTN)
	if err != nil {
		ptm.Close()
		t.Fatalf("ptsname: %v", err)
	}
	pts, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		ptm.Close()
		t.Skipf("open the terminal's other end: %v", err)
	}
	return ptm, pts
}

// TestRunInteractive: etcdlock run in the foreground of a terminal makes
// COMMAND the foreground job, so that it reads the terminal instead of
// stopping on SIGTTIN, and takes the terminal back when COMMAND exits.
func TestRunInteractive(t *testing.T) {
	skipExternal(t)
	srv := etcdtest.Start(t)
	ptm, pts := openPTY(t)
	defer ptm.Close()

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
	defer cancel()
	// etcdlock leads a session of its own, with the terminal as its
	// controlling terminal: its group is the foreground one, as a shell's
	// foreground job is. Had it failed to take the terminal back after
	// COMMAND, it would have said so on the terminal.
	cmd := exec.CommandContext(ctx, self, "run", "--endpoints", srv.Endpoints()[0], lockName(t), "--",
		"sh", "-c", `IFS= read -r line; echo "got:$line"`)
	cmd.Env = append(cleanEnv(), asMain+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = pts, pts, pts
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pts.Close()

	var out syncbuf.Buffer
	var wg sync.WaitGroup
	wg.Go(func() {
		b := make([]byte, 4096)
		for {
			n, err := ptm.Read(b)
			out.Write(b[:n])
			if err != nil {
				return // EIO once no process has the terminal open
			}
		}
	})
	if _, err := ptm.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(opTimeout)
	for !strings.Contains(out.String(), "got:hello") {
		if time.Now().After(deadline) {
			cancel()
			cmd.Wait()
			wg.Wait()
			t.Fatalf("terminal: got %q, want COMMAND to read hello and say got:hello", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	err = cmd.Wait()
	wg.Wait()
	if err != nil {
		t.Fatalf("etcdlock: got %v, want exit status 0; terminal:\n%s", err, out.String())
	}
	if strings.Contains(out.String(), "etcdlock:") {
		t.Errorf("terminal: got %q, want no message from etcdlock", out.String())
	}
}
