// Command etcdlock runs a command under a distributed lock on etcd, shows who
// holds a lock and who waits for it, checks a fence, breaks a stuck lock,
// shows or sets a Semaphore's limit, and demonstrates the etcdlock package on an embedded etcd.
//
//	etcdlock run [flags] NAME -- COMMAND [ARGS...]
//	etcdlock holders [--watch] [flags] NAME
//	etcdlock check [flags] FENCE
//	etcdlock release [--lock-key KEY | --token N] [--yes] [flags] NAME
//	etcdlock limit [flags] NAME [N]
//	etcdlock demo [flags]
//
// Its locks are those of the etcdlock package, of etcd's concurrency.Mutex
// and of etcdctl lock: the three exclude each other on the same NAME. Flags,
// environment variables and exit statuses are described in docs/cli.md and
// by etcdlock help COMMAND.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// Exit statuses of etcdlock itself. run passes its command's status through,
// so these come from the sysexits(3) range, which few commands use, and keep
// the sysexits meaning where there is one.
const (
	exitFailed      = 1   // demo: a check failed
	exitUsage       = 64  // EX_USAGE: bad command line, flag, variable or file
	exitUnavailable = 69  // EX_UNAVAILABLE: etcd unreachable or refused us
	exitInterrupted = 130 // holders, check, release, limit: SIGINT or SIGTERM before they were done
	exitLost        = 74  // the lock was lost while the command ran
	exitBusy        = 75  // EX_TEMPFAIL: the lock is held and --wait ran out
	exitDone        = 76  // --once-per's slot was done: COMMAND did not run (no sysexits meaning; EX_PROTOCOL unused here)
	exitCannotRun   = 126 // the command exists but could not be started
	exitNotFound    = 127 // the command was not found
)

// stdio is what a command reads and writes: the process's own, or a test's.
type stdio struct {
	in       *os.File
	out, err io.Writer
	getenv   func(string) string
}

// statusError is an error with the exit status it calls for. A nil err
// prints nothing: the status of a command run under the lock.
type statusError struct {
	code int
	err  error
}

func (e *statusError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *statusError) Unwrap() error { return e.err }

// withStatus returns err with the exit status code.
func withStatus(code int, err error) error {
	return &statusError{code: code, err: err}
}

// usageError is a command line mistake: the message, then a pointer to the
// help of the command.
type usageError struct {
	cmd string
	msg string
}

func (e *usageError) Error() string { return e.msg }

func usagef(cmd, format string, args ...any) error {
	return &usageError{cmd: cmd, msg: fmt.Sprintf(format, args...)}
}

func main() {
	os.Exit(cli(os.Args[1:], stdio{in: os.Stdin, out: os.Stdout, err: os.Stderr, getenv: os.Getenv}))
}

// cli runs the command line args and returns the exit status.
func cli(args []string, sio stdio) int {
	if len(args) == 0 {
		fmt.Fprint(sio.err, mainUsage)
		return exitUsage
	}
	var err error
	switch cmd, rest := args[0], args[1:]; cmd {
	case "run":
		err = runCommand(rest, sio)
	case "holders":
		err = holdersCommand(rest, sio)
	case "check":
		err = checkCommand(rest, sio)
	case "release":
		err = releaseCommand(rest, sio)
	case "limit":
		err = limitCommand(rest, sio)
	case "demo":
		err = demoCommand(rest, sio)
	case "help", "-h", "-help", "--help":
		return help(rest, sio)
	case "version", "--version":
		if len(rest) > 0 {
			return report(usagef("", "unexpected argument %q after version", rest[0]), sio)
		}
		fmt.Fprintln(sio.out, version())
		return 0
	default:
		err = usagef("", "unknown command %q", cmd)
	}
	return report(err, sio)
}

// report prints err, if any, and returns the exit status it calls for.
func report(err error, sio stdio) int {
	if err == nil {
		return 0
	}
	if ue, ok := errors.AsType[*usageError](err); ok {
		if ue.cmd == "" {
			fmt.Fprintf(sio.err, "etcdlock: %s\n\n%s", ue.msg, mainUsage)
		} else {
			fmt.Fprintf(sio.err, "etcdlock %s: %s\nRun 'etcdlock help %s' for usage.\n", ue.cmd, ue.msg, ue.cmd)
		}
		return exitUsage
	}
	if se, ok := errors.AsType[*statusError](err); ok {
		if se.err != nil {
			fmt.Fprintln(sio.err, "etcdlock: "+strings.TrimPrefix(se.err.Error(), "etcdlock: "))
		}
		return se.code
	}
	fmt.Fprintln(sio.err, "etcdlock: "+strings.TrimPrefix(err.Error(), "etcdlock: "))
	return exitFailed
}

const mainUsage = `etcdlock: a distributed lock on etcd.

Usage:
  etcdlock run [flags] NAME -- COMMAND [ARGS...]  run COMMAND while holding the lock NAME
  etcdlock holders [flags] NAME                   show who holds the lock NAME, and who waits;
                                                  with --watch, again after every change
  etcdlock check [flags] FENCE                    whether the hold FENCE names (a run's $ETCDLOCK_FENCE)
                                                  still holds its lock
  etcdlock release [flags] NAME                   break a stuck lock: delete its holders' keys
                                                  (or one, --lock-key/--token), after a confirmation
  etcdlock limit [flags] NAME [N]                 show the limit of the Semaphore NAME, or set it to N
  etcdlock demo [flags]                           a self-checking demo on an embedded etcd
  etcdlock help [COMMAND]                         this help, or the flags of COMMAND
  etcdlock version                                etcdlock's version, Go version and platform

Exit statuses of run: the command's own; 64 usage, 69 etcd unreachable,
74 lock lost, 75 lock busy, 76 slot done (--once-per); 126/127 command not runnable / not found;
128+N interrupted by signal N while waiting.
`

// help prints the usage of the command named in args, or of etcdlock.
func help(args []string, sio stdio) int {
	if len(args) == 0 {
		fmt.Fprint(sio.out, mainUsage)
		return 0
	}
	var fs *commandFlags
	switch args[0] {
	case "run":
		fs, _ = newRunFlags()
	case "holders":
		fs, _ = newHoldersFlags()
	case "check":
		fs, _ = newCheckFlags()
	case "release":
		fs, _ = newReleaseFlags()
	case "limit":
		fs, _ = newLimitFlags()
	case "demo":
		fs, _ = newDemoFlags()
	default:
		return report(usagef("", "unknown command %q", args[0]), sio)
	}
	fs.printUsage(sio.out)
	return 0
}
