package etcdlock

// A hold's fencing token in a form that travels to the resource it guards,
// and the check of such a token against etcd.

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// fenceText begins the text form of a Fence; a later form would begin
// otherwise, so that a reader of this one refuses it.
const fenceText = "etcdlock:"

// A Fence names one hold for the resource a lock guards (String: its text). A
// resource that keeps the highest Token per Name and refuses lower ones refuses
// a holder paused or cut off once etcd gave the lock on (package fence); for
// exclusive holds: readers and permits hold together. Zero names no hold.
type Fence struct {
	Name  string // the lock's name: the resource keeps the highest token per name
	Key   string // the hold's key, under Name+"/"
	Token int64  // the hold's fencing token: its key's create revision
}

// Fence returns the hold's fence (its first name's, for a MultiMutex; Mutex
// m of another: Fence{name, m.Key(), m.Token()}); zero for the zero Hold.
func (h Hold) Fence() Fence {
	if h.h == nil {
		return Fence{}
	}
	name := h.Name
	if h.h.t.kind == KindMulti {
		name = lockOf(h.Key)
	}
	return Fence{Name: name, Key: h.Key, Token: h.Token}
}

// Fence returns the permit's fence, the zero Fence once released.
func (p *Permit) Fence() Fence {
	if p.Token() == 0 {
		return Fence{}
	}
	return Fence{Name: p.sem.name, Key: p.h.t.Key(), Token: p.h.token()}
}

// String returns the text form, "" for the zero Fence: printable ASCII such
// as etcdlock:1042:jobs/nightly:694d8f3a2b1c, other bytes written %XX.
func (f Fence) String() string {
	if f == (Fence{}) {
		return ""
	}
	rest, _ := strings.CutPrefix(f.Key, f.Name+"/")
	return fenceText + strconv.FormatInt(f.Token, 10) + ":" + escapeFence(f.Name) + ":" + escapeFence(rest)
}

// MarshalText returns String's form; an error for an invalid non-zero Fence.
func (f Fence) MarshalText() ([]byte, error) {
	if f == (Fence{}) {
		return []byte{}, nil
	}
	if err := f.valid(); err != nil {
		return nil, err
	}
	return []byte(f.String()), nil
}

// UnmarshalText reads as ParseFence, "" as zero; on error f is unchanged.
func (f *Fence) UnmarshalText(text []byte) error {
	if len(text) == 0 {
		*f = Fence{}
		return nil
	}
	g, err := ParseFence(string(text))
	if err != nil {
		return err
	}
	*f = g
	return nil
}

// ParseFence reads String's form; anything else (another prefix, a bad token,
// name, escape or key) is an error wrapping ErrInvalidFence that says what.
func ParseFence(s string) (Fence, error) {
	body, ok := strings.CutPrefix(s, fenceText)
	if !ok {
		return Fence{}, fmt.Errorf("%w %q: does not begin with %q", ErrInvalidFence, clip(s), fenceText)
	}
	parts := strings.Split(body, ":")
	if len(parts) != 3 {
		return Fence{}, fmt.Errorf("%w %q: want %s<token>:<name>:<key after the name>", ErrInvalidFence, clip(s), fenceText)
	}
	token, err := strconv.ParseInt(parts[0], 10, 64)
	if err != nil || token < 1 || parts[0] != strconv.FormatInt(token, 10) {
		return Fence{}, fmt.Errorf("%w %q: the token %q is not a positive decimal", ErrInvalidFence, clip(s), clip(parts[0]))
	}
	name, err1 := unescapeFence(parts[1])
	rest, err2 := unescapeFence(parts[2])
	if err1 != nil || err2 != nil {
		return Fence{}, fmt.Errorf("%w %q: bad %%-escape", ErrInvalidFence, clip(s))
	}
	f := Fence{Name: name, Key: name + "/" + rest, Token: token}
	if err := f.valid(); err != nil {
		return Fence{}, err
	}
	return f, nil
}

// valid returns the error that makes f no fence of a hold: no name, a token
// below 1, or a key that is no lock key of the name.
func (f Fence) valid() error {
	switch {
	case f.Name == "":
		return fmt.Errorf("%w: empty lock name", ErrInvalidFence)
	case f.Token < 1:
		return fmt.Errorf("%w: token %d is not positive", ErrInvalidFence, f.Token)
	case !inQueue(f.Name+"/", []byte(f.Key)) || strings.HasSuffix(f.Key, "/"):
		return fmt.Errorf("%w: %q is not a lock key of %q", ErrInvalidFence, f.Key, f.Name)
	}
	return nil
}

// CheckFence reports, in one read, whether f's hold holds (Chubby's
// CheckSequencer): nil if so; ErrLockLost, wrapped, if its key is gone, remade
// or waits; ErrInvalidFence, wrapped, if f is invalid; else etcd's error. It
// writes nothing; the answer may be stale at once: fence the writes too.
func CheckFence(ctx context.Context, client *clientv3.Client, f Fence) error {
	if err := f.valid(); err != nil {
		return err
	}
	entries, _, err := readQueue(ctx, client, f.Name, "check fence")
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Key != f.Key {
			continue
		}
		switch {
		case e.Token != f.Token:
			return errorf("check fence", f.Name, fmt.Errorf("%w: key %s was made anew (token %d, the fence's %d)", ErrLockLost, f.Key, e.Token, f.Token))
		case !e.Holds:
			return errorf("check fence", f.Name, fmt.Errorf("%w: key %s waits, it does not hold", ErrLockLost, f.Key))
		}
		return nil
	}
	return errorf("check fence", f.Name, fmt.Errorf("%w: key %s is gone", ErrLockLost, f.Key))
}

// escapeFence writes s for a fence's text form: %XX for every byte but ASCII
// letters, digits and -_./~.
func escapeFence(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-_./~", c) >= 0 {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}

// unescapeFence reads what escapeFence wrote; an error for a bad escape or a
// byte escapeFence would have escaped.
func unescapeFence(s string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '%' {
			if escapeFence(string(c)) != string(c) {
				return "", fmt.Errorf("byte %q is not escaped", c)
			}
			b.WriteByte(c)
			continue
		}
		if i+2 >= len(s) {
			return "", fmt.Errorf("short escape")
		}
		v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil {
			return "", err
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), nil
}

// clip shortens s for an error message.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
