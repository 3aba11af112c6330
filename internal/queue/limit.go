package queue

import (
	"strconv"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// A semaphore's weights and its limit record.
//
// A permit's key value starts with a line "limit=N" (one permit: the form of
// every version) or "limit=N;weight=K" (K permits in one key), then the
// holder's identity. A version that knows no weights reads the second form
// as no limit at all, and refuses it (ErrLimitMismatch) rather than count it
// as one permit.
//
// The limit record, beside the queue and never under its prefix (a key
// under it would block etcdctl lock on the name), holds "limit=N keep=G":
// the limit in force, whatever the keys say, and the create revision of the
// newest key that held when it was written. A key holds when it was kept
// (created at or before G: it held when the limit changed, and keeps its
// permits), or when the weights of every older key and its own fit within
// N, each weight counted at most N (a weight above the limit holds alone).
// So the holders are always the oldest keys, and a lowered limit takes no
// permit back: new keys wait until the kept ones leave.

// LimitRecordPrefix begins the key of every semaphore's limit record.
const LimitRecordPrefix = "etcdlock.limit."

// LimitKey returns the key of the limit record of the semaphore called name:
// etcdlock.limit.<name>, the name as RecordName writes it.
func LimitKey(name string) string { return LimitRecordPrefix + RecordName(name) }

// recordEscape writes "%" and "/" as %XX.
var recordEscape = strings.NewReplacer("%", "%25", "/", "%2F")

// RecordName returns name as the key of a record beside its queue writes it
// (a semaphore's limit, Lead's term count and hand-over): "%" and "/" as
// %25 and %2F, so that the record's key is its name's alone and lies under
// no lock's prefix (the record of "a/b" would otherwise be a member of the
// queue of a lock called "etcdlock.limit.a").
func RecordName(name string) string { return recordEscape.Replace(name) }

// SemaphoreValue returns the value of a permit's key: the limit the holder
// was made with, its weight (written only above 1), and its identity.
func SemaphoreValue(limit, weight int, identity string) string {
	line := "limit=" + strconv.Itoa(limit)
	if weight > 1 {
		line += ";weight=" + strconv.Itoa(weight)
	}
	return line + "\n" + identity
}

// ParseSemaphoreValue reads a permit key's value: its limit, its weight and
// the holder's identity; ok is false if it is not a permit's.
func ParseSemaphoreValue(value []byte) (limit, weight int, identity string, ok bool) {
	line, identity, _ := strings.Cut(string(value), "\n")
	rest, found := strings.CutPrefix(line, "limit=")
	if !found {
		return 0, 0, "", false
	}
	n, w, weighted := strings.Cut(rest, ";weight=")
	limit, weight = positive(n), 1
	if weighted {
		weight = positive(w)
	}
	if limit == 0 || weight == 0 {
		return 0, 0, "", false
	}
	return limit, weight, identity, true
}

// A Limit is a semaphore's limit record.
type Limit struct {
	N    int   // the limit in force
	Keep int64 // keys created at or before this revision hold, whatever N
}

// Value returns the record's value.
func (l Limit) Value() string {
	return "limit=" + strconv.Itoa(l.N) + " keep=" + strconv.FormatInt(l.Keep, 10)
}

// ParseLimit reads a limit record's value; ok is false if it is not one.
func ParseLimit(value []byte) (Limit, bool) {
	n, keep, found := strings.Cut(string(value), " keep=")
	n, ok := strings.CutPrefix(n, "limit=")
	if !found || !ok || positive(n) == 0 {
		return Limit{}, false
	}
	k, err := strconv.ParseInt(keep, 10, 64)
	if err != nil || k < 0 || strconv.FormatInt(k, 10) != keep {
		return Limit{}, false
	}
	return Limit{N: positive(n), Keep: k}, true
}

// positive returns the positive decimal s, in canonical form, or 0.
func positive(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || strconv.Itoa(n) != s {
		return 0
	}
	return n
}

// A tally counts a semaphore's keys, oldest first, and says which hold.
type tally struct {
	limit int
	keep  int64
	room  int  // what the keys counted leave of the limit; -1 once they exceed it
	all   bool // every key counted holds
}

// newTally returns the tally of a semaphore under l, whose record was
// written at revision rev (0: no record). A keep above rev is no keep of a
// record SetLimit wrote: it is taken as rev.
func newTally(l Limit, rev int64) tally {
	return tally{limit: l.N, keep: min(l.Keep, rev), room: l.N, all: true}
}

// holds reports whether a key created at rev with weight w holds behind the
// keys counted so far.
func (t *tally) holds(rev int64, w int) bool {
	return rev <= t.keep || (t.room >= 0 && min(w, t.limit) <= t.room)
}

// add counts a key created at rev with weight w, and reports whether it
// holds.
func (t *tally) add(rev int64, w int) bool {
	h := t.holds(rev, w)
	t.all = t.all && h
	if m := min(w, t.limit); t.room >= 0 && m <= t.room {
		t.room -= m
	} else {
		t.room = -1
	}
	return h
}

// Holders says which of a semaphore's keys hold, given oldest first, with
// rec its limit record (nil if none). Without a record, the limit is the
// oldest key's (every holder must use one limit); a key that is no
// permit's counts as a whole limit.
func Holders(kvs []*mvccpb.KeyValue, rec *mvccpb.KeyValue) []bool {
	l, recorded, recRev := Limit{}, false, int64(0)
	if rec != nil {
		l, recorded = ParseLimit(rec.Value)
		recRev = rec.ModRevision
	}
	if !recorded && len(kvs) > 0 {
		l, recRev = Limit{}, 0
		l.N, _, _, _ = ParseSemaphoreValue(kvs[0].Value)
	}
	l.N = max(l.N, 1)
	t := newTally(l, recRev)
	holds := make([]bool, len(kvs))
	for i, kv := range kvs {
		_, w, _, ok := ParseSemaphoreValue(kv.Value)
		if !ok {
			w = l.N
		}
		holds[i] = t.add(kv.CreateRevision, w)
	}
	return holds
}
