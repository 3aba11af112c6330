package etcdtest

// A stand-in for what a lock guards, which records the critical sections of
// its holders and finds those a lease-based lock cannot prevent.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// ErrStaleToken is returned by a fenced Resource to a section whose token is
// lower than one it has accepted for the same lock.
var ErrStaleToken = errors.New("etcdtest: stale fencing token")

// A Resource stands in, in a test, for what a lock guards: a database, a
// file, a service. The code under test calls Begin with the lock's name and
// the hold's fencing token when its critical section begins, and End when it
// ends. The Resource records each section and reports two kinds of problems
// (Problems, and tb.Error when the test ends):
//
//   - overlap: two sections of one lock, with different tokens, both took
//     effect and overlapped in time: the lock did not exclude;
//   - stale: a section took effect after one with a higher token had begun:
//     a holder that had lost the lock wrote after the next one started.
//
// A lease-based lock cannot prevent either on its own: a holder paused past
// its lease's TTL (GC, a frozen VM, a partition) goes on after etcd gave the
// lock to someone else. Proxy.PauseWhile and PauseProcess make such a pause
// in a test. NewResource records what an unguarded resource would let
// happen; NewFencedResource checks tokens as a resource that fences a whole
// section (one transaction, checked at its start and its commit) does: a
// section is refused at Begin if its token is lower than the highest begun,
// and takes no effect (End returns ErrStaleToken, like a rolled-back
// transaction) if a higher one began before its End. The fence package's
// Table and Memory keep the same order another way, making the higher token
// wait until the lower one's transaction ends. A section never ended takes
// effect, unfenced, until the check; fenced, never. A Resource knows
// sections, not the values read and written in them: code that fences its
// writes but not the reads they depend on can still lose an update that the
// Resource does not see (the fence package's docs say why).
//
// Its methods are safe for concurrent use.
type Resource struct {
	tb     testing.TB
	fenced bool

	mu       sync.Mutex
	changed  chan struct{} // closed and replaced at every Begin
	highest  map[string]int64
	sections []*Section
}

// A Section is one critical section of a Resource, from Begin to End.
type Section struct {
	r     *Resource
	name  string
	token int64
	begin time.Time

	end      time.Time // zero until End
	effected bool      // took effect: ended (fenced: accepted at End), or unfenced
}

// NewResource returns a Resource that accepts every section, as a resource
// that checks no token would, and records them. When tb ends the test
// fails, through tb.Error, for each problem found; with a nil tb, nothing is
// checked at the end: call Problems.
func NewResource(tb testing.TB) *Resource { return newResource(tb, false) }

// NewFencedResource returns a Resource that refuses stale tokens, as
// NewResource describes, and records the sections it accepts.
func NewFencedResource(tb testing.TB) *Resource { return newResource(tb, true) }

func newResource(tb testing.TB, fenced bool) *Resource {
	r := &Resource{tb: tb, fenced: fenced, changed: make(chan struct{}), highest: map[string]int64{}}
	if tb != nil {
		tb.Helper()
		tb.Cleanup(func() {
			for _, p := range r.Problems() {
				tb.Error(p)
			}
		})
	}
	return r
}

// Begin begins a critical section of the lock name with token, the hold's
// fencing token (a Mutex's Token). A fenced Resource returns ErrStaleToken,
// wrapped with the tokens, and records nothing if token is lower than the
// highest it has begun for name. A token below 1 or an empty name is an
// error; nothing is recorded.
func (r *Resource) Begin(name string, token int64) (*Section, error) {
	if name == "" || token < 1 {
		return nil, fmt.Errorf("etcdtest: resource: Begin(%q, %d): want a lock name and a token above 0", name, token)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if high := r.highest[name]; r.fenced && token < high {
		return nil, fmt.Errorf("%w: lock %q: token %d, after %d", ErrStaleToken, name, token, high)
	}
	r.highest[name] = max(r.highest[name], token)
	s := &Section{r: r, name: name, token: token, begin: time.Now(), effected: !r.fenced}
	r.sections = append(r.sections, s)
	close(r.changed)
	r.changed = make(chan struct{})
	return s, nil
}

// End ends the section. A fenced Resource returns ErrStaleToken, and the
// section takes no effect, if a higher token of its lock began since its
// Begin. A second End returns an error and changes nothing.
func (s *Section) End() error {
	if s == nil {
		return errors.New("etcdtest: resource: End of a nil Section (its Begin failed)")
	}
	r := s.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if !s.end.IsZero() {
		return fmt.Errorf("etcdtest: resource: lock %q: section of token %d ended twice", s.name, s.token)
	}
	s.end = time.Now()
	if r.fenced {
		if high := r.highest[s.name]; high > s.token {
			return fmt.Errorf("%w: lock %q: token %d, and %d began before its end", ErrStaleToken, s.name, s.token, high)
		}
		s.effected = true
	}
	return nil
}

// WaitNewer waits until a section of the lock name with a token higher
// than token has begun, or ctx ends (then it returns ctx.Err()): a holder
// paused with Proxy.PauseWhile until then has been paused past its lease's
// expiry, since the next holder got the lock.
func (r *Resource) WaitNewer(ctx context.Context, name string, token int64) error {
	if ctx == nil {
		return errors.New("etcdtest: resource: WaitNewer with a nil context")
	}
	for {
		r.mu.Lock()
		high, changed := r.highest[name], r.changed
		r.mu.Unlock()
		if high > token {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// Sections returns how many sections began, and how many of them took effect.
func (r *Resource) Sections() (begun, effected int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.sections {
		if s.effected {
			effected++
		}
	}
	return len(r.sections), effected
}

// Problems returns the problems found so far, one sentence each, oldest
// first; none if every section that took effect was alone and in token
// order. A section not yet ended counts as lasting until now.
func (r *Resource) Problems() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	until := func(s *Section) time.Time {
		if s.end.IsZero() {
			return now
		}
		return s.end
	}
	var problems []string
	for i, a := range r.sections {
		if !a.effected {
			continue
		}
		for _, b := range r.sections[i+1:] { // b began after a
			if !b.effected || b.name != a.name || b.token == a.token {
				continue
			}
			if b.begin.Before(until(a)) {
				problems = append(problems, fmt.Sprintf("etcdtest: resource: lock %q: overlap: the section of token %d (%s) and that of token %d (%s) both took effect",
					a.name, a.token, span(a.begin, until(a), a.end.IsZero()), b.token, span(b.begin, until(b), b.end.IsZero())))
			}
			if b.token < a.token {
				problems = append(problems, fmt.Sprintf("etcdtest: resource: lock %q: stale: the section of token %d took effect after that of token %d began", a.name, b.token, a.token))
			}
		}
	}
	return problems
}

// span describes a section's time, for a problem.
func span(begin, end time.Time, open bool) string {
	s := begin.Format("15:04:05.000") + "–" + end.Format("15:04:05.000")
	if open {
		s += ", not ended"
	}
	return s
}
