//go:build unix

package etcdtest

import (
	"fmt"
	"os"
	"syscall"
	"time"
)

// PauseProcess stops the process p (SIGSTOP) for d, then lets it go on
// (SIGCONT): a holder in a child process paused past its lease's TTL, as a
// GC pause or a frozen VM would, which learns of nothing while stopped. It
// returns once p goes on, or the error of a signal (the process is then let
// go on, if it can be). Unix only: elsewhere it returns an error.
func PauseProcess(p *os.Process, d time.Duration) error {
	if p == nil || d < 0 {
		return fmt.Errorf("etcdtest: PauseProcess(%v, %v): want a process and a duration of at least 0", p, d)
	}
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("etcdtest: stop process %d: %w", p.Pid, err)
	}
	time.Sleep(d)
	if err := p.Signal(syscall.SIGCONT); err != nil {
		return fmt.Errorf("etcdtest: continue process %d: %w", p.Pid, err)
	}
	return nil
}
