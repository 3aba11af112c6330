//go:build !unix

package etcdtest

import (
	"errors"
	"os"
	"time"
)

// PauseProcess stops a process for d, on Unix; here it returns an error.
func PauseProcess(p *os.Process, d time.Duration) error {
	return errors.New("etcdtest: PauseProcess needs SIGSTOP, which this system lacks")
}
