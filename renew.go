package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// errNoLease is the error of a call that needs a lease while a Session made
// WithRenewal has none: its lease was lost and the next is not granted yet.
var errNoLease = fmt.Errorf("%w: the lease was lost and a new one is not granted yet", ErrSessionExpired)

// renew gives a Session made WithRenewal a new lease each time the one in
// use is lost, until the Session ends: it revokes the lost lease (which
// deletes what may be left of its keys, where it was lost to silence), grants
// a new one and makes it the lease in use, retrying with backoff and
// reporting each failure to the observers. A closed client ends the Session.
func (s *Session) renew() {
	retry := newBackoff()
	for {
		old := s.term.Load()
		select {
		case <-old.ctx().Done():
		case <-s.life.Done():
			return
		}
		for {
			next, err := s.nextTerm(old)
			if err == nil {
				if !s.install(old, next) {
					return
				}
				retry.reset()
				break
			}
			if s.clientClosed() {
				// No lease can ever be had: the Session ends, and says
				// nothing more.
				s.endLife()
				return
			}
			if s.life.Err() != nil {
				return
			}
			s.events.emit(Event{Kind: SessionFailed, Lease: old.id, Err: err})
			if retry.wait(s.life) != nil {
				return
			}
		}
	}
}

// nextTerm revokes the lease of old and grants the next one, within
// setupTimeout.
func (s *Session) nextTerm(old *leaseTerm) (*leaseTerm, error) {
	ctx, cancel := context.WithTimeout(s.life, setupTimeout)
	defer cancel()
	if err := old.revoke(ctx); err != nil {
		return nil, err
	}
	id, secs, renewed, err := grant(ctx, s.client, s.ask, clientv3.NoLease)
	if err != nil {
		return nil, err
	}
	return newTerm(s.client, s.ctx, id, secs, renewed), nil
}

// install makes next the lease in use, after old, and reports it; unless
// the Session is ending, where it revokes next and reports false.
func (s *Session) install(old, next *leaseTerm) bool {
	s.bgMu.Lock()
	if s.closing {
		s.bgMu.Unlock()
		next.end()
		_ = next.revoke(context.WithoutCancel(s.ctx))
		return false
	}
	s.term.Store(next)
	s.startTerm(next)
	close(old.next)
	s.bgMu.Unlock()
	s.events.setLease(next.id)
	s.events.emit(Event{Kind: LeaseRenewed, Lease: next.id, OldLease: old.id, TTL: next.ttl})
	return true
}

// begin returns the term an acquisition starting now uses: the lease in
// use, if it lives. Without a live lease it returns ErrSessionExpired, or,
// WithRenewal, waits for the next lease as the acquisition waits (for ever,
// not at all for a try, or at most wait) and returns errNoLease if none came.
func (s *Session) begin(ctx context.Context, wait time.Duration) (*leaseTerm, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var expire <-chan time.Time
	if wait > 0 {
		timer := time.NewTimer(wait)
		defer timer.Stop()
		expire = timer.C
	}
	for {
		tm := s.term.Load()
		switch {
		case !tm.Expired():
			return tm, nil
		case s.ended():
			return nil, s.endedErr()
		case wait == tryOnly:
			return nil, errNoLease
		}
		select {
		case <-tm.next:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.life.Done():
			return nil, s.endedErr()
		case <-expire:
			return nil, errNoLease
		}
	}
}

// errClientClosed is the error of a call on a Session whose client was
// closed: no lease can be kept or had any more.
var errClientClosed = fmt.Errorf("%w: its client was closed", ErrSessionExpired)

// clientClosed reports whether the Session's client was closed.
func (s *Session) clientClosed() bool { return s.client.Ctx().Err() != nil }

// endedErr returns the error of a call on the ended Session.
func (s *Session) endedErr() error {
	if s.clientClosed() {
		return errClientClosed
	}
	return ErrSessionExpired
}

// lockable reports whether err, from an acquisition, leaves the lock
// takeable later: anything but an ended Session, bad input, a deadlock on
// oneself, or a re-lock of a hold known lost (which the goroutine must
// unlock first).
func (s *Session) lockable(err error) bool {
	switch {
	case errors.Is(err, ErrSessionExpired):
		return !s.ended()
	case errors.Is(err, ErrInvalidName), errors.Is(err, ErrInvalidArgument), errors.Is(err, ErrWouldDeadlock), errors.Is(err, ErrLockLost):
		return false
	}
	return true
}
