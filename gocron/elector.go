package etcdlockgocron

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/etcdlock/etcdlock"
	"github.com/go-co-op/gocron/v2"
)

// errClosed is the reason IsLeader gives once Close has been called.
var errClosed = errors.New("elector closed")

// An Elector is a gocron.Elector on etcd: it campaigns for the lead of a
// name in the background, from NewElector until Close, as
// etcdlock.Session.Lead does, and campaigns again after each term.
type Elector struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when the campaign has returned

	term  atomic.Pointer[context.Context] // the current term's context; nil between terms
	ended atomic.Pointer[error]           // why the campaign stopped, once it has
	once  sync.Once
}

var _ gocron.Elector = (*Elector)(nil)

// NewElector starts campaigning for the lead of name with s, and returns at
// once. It returns ErrInvalidArgument, wrapped, for a nil Session or an
// empty name, having started nothing. Close the Elector when done; it does
// not close s. Without WithRenewal, the campaign ends with the Session's
// lease, and IsLeader returns ErrNotLeader from then on.
func NewElector(s *etcdlock.Session, name string) (*Elector, error) {
	switch {
	case s == nil:
		return nil, fmt.Errorf("%w: nil session", ErrInvalidArgument)
	case name == "":
		return nil, fmt.Errorf("%w: empty name", ErrInvalidArgument)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Elector{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(e.done)
		err := s.Lead(ctx, name, e.lead)
		if ctx.Err() != nil {
			err = errClosed
		}
		e.ended.Store(&err)
	}()
	return e, nil
}

// lead is one term: it lasts until Lead cancels ctx (the hold lost, or
// about to be) or Close does.
func (e *Elector) lead(ctx context.Context) error {
	e.term.Store(&ctx)
	<-ctx.Done()
	e.term.Store(nil)
	return nil
}

// IsLeader returns nil while this replica leads: its key is the oldest of
// the name's queue in etcd and its hold has not been lost. Otherwise it
// returns ErrNotLeader, wrapped with the reason once the campaign has
// stopped (Close, or the end of the Session). It reads no etcd and never
// blocks. A run that IsLeader let start is not stopped when the lead is
// lost.
func (e *Elector) IsLeader(context.Context) error {
	if t := e.term.Load(); t != nil && (*t).Err() == nil {
		return nil
	}
	if err := e.ended.Load(); err != nil {
		return fmt.Errorf("%w: %w", ErrNotLeader, *err)
	}
	return ErrNotLeader
}

// Close stops the campaign, gives up the lead if held (its key deleted),
// and waits for the campaign's goroutine to return. Later calls do nothing.
// It returns nil.
func (e *Elector) Close() error {
	e.once.Do(func() {
		e.cancel()
		<-e.done
	})
	return nil
}
