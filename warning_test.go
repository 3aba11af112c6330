package etcdlock_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The early warning, measured. For each holder cut off from etcd or frozen
// while it held, the margin is the time from its Done closing to the next
// acquisition by another holder in its place: positive when the warning
// came first. For an exclusive lock that is the next acquisition; for a
// shared one (readers, a semaphore) the next after etcd deleted the cut-off
// hold's key, since others may join it before, up to the limit, and only
// then could one take its place.
// The evidence that explains a margin: the holder's last keep-alive
// acknowledgement before the fault (Done closes two thirds of the TTL after
// it, and etcd may expire the lease a TTL after renewing it), and when etcd
// deleted the holder's key (the lease's expiry, seen by a watch).

// warning is the early warning of one cut-off or frozen hold.
type warning struct {
	kind    string
	token   int64
	cut     time.Time // the fault began
	lastAck time.Time // the last keep-alive acknowledgement before it (zero: unknown)
	done    time.Time // Done closed (zero: not seen)
	// The holder's Session ended during the fault (zero: not seen): Done
	// closes with it at the latest. Done closing only then, a TTL or more
	// after the last acknowledgement rather than two thirds of it, means
	// its silence timer never ran: its loss watch was still waiting for
	// etcd to confirm the watch on the key when the fault began.
	sessionEnd time.Time
	deleted    time.Time // etcd deleted the key (zero: not seen)
	next       time.Time // the next acquisition by another holder in its place (zero: none)
}

// margin returns next − done, if both happened.
func (w warning) margin() (time.Duration, bool) {
	if w.done.IsZero() || w.next.IsZero() {
		return 0, false
	}
	return w.next.Sub(w.done), true
}

// since returns b − a, if both are known.
func since(a, b time.Time) (time.Duration, bool) {
	if a.IsZero() || b.IsZero() {
		return 0, false
	}
	return b.Sub(a), true
}

// spread formats min / median / max of ds.
func spread(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return fmt.Sprintf("%v / %v / %v (n=%d)", ds[0].Round(time.Millisecond), ds[len(ds)/2].Round(time.Millisecond),
		ds[len(ds)-1].Round(time.Millisecond), len(ds))
}

// warningStats sums up the warnings of one kind of fault.
type warningStats struct {
	margins, ackToDone, ackToDelete, deleteToNext []time.Duration
	negative                                      []warning
	atSessionEnd                                  int // Done closed only with the Session's end
}

// sessionEndSlack is how far apart two goroutines of the test may see one
// moment: Done closing and the Session ending, when Done closed because the
// Session ended.
const sessionEndSlack = 100 * time.Millisecond

// atSessionEnd reports whether Done closed only with the Session's end.
func (w warning) atSessionEnd() bool {
	return !w.sessionEnd.IsZero() && !w.done.IsZero() && w.done.After(w.sessionEnd.Add(-sessionEndSlack))
}

func newWarningStats(ws []warning) warningStats {
	var st warningStats
	add := func(to *[]time.Duration, d time.Duration, ok bool) {
		if ok {
			*to = append(*to, d)
		}
	}
	for _, w := range ws {
		m, ok := w.margin()
		add(&st.margins, m, ok)
		if ok && m < 0 {
			st.negative = append(st.negative, w)
		}
		if w.atSessionEnd() {
			st.atSessionEnd++
		}
		d, ok := since(w.lastAck, w.done)
		add(&st.ackToDone, d, ok)
		d, ok = since(w.lastAck, w.deleted)
		add(&st.ackToDelete, d, ok)
		d, ok = since(w.deleted, w.next)
		add(&st.deleteToNext, d, ok)
	}
	return st
}

// logWarnings logs the margins of ws by kind of fault, and each negative
// one with its evidence.
func logWarnings(t *testing.T, ws []warning) {
	t.Helper()
	byKind := map[string][]warning{}
	var order []string
	for _, w := range ws {
		if _, ok := byKind[w.kind]; !ok {
			order = append(order, w.kind)
		}
		byKind[w.kind] = append(byKind[w.kind], w)
	}
	for _, k := range order {
		st := newWarningStats(byKind[k])
		t.Logf("  %s: margin, next acquisition in its place − Done closed: min / median / max %s; negative: %d", k, spread(st.margins), len(st.negative))
		t.Logf("  %s: last keep-alive ack → Done closed %s; → key deleted in etcd %s; key deleted → next acquisition %s",
			k, spread(st.ackToDone), spread(st.ackToDelete), spread(st.deleteToNext))
		t.Logf("  %s: Done closed only with the Session's end (silence timer not armed: watch not yet created): %d", k, st.atSessionEnd)
		for _, w := range st.negative {
			rel := func(at time.Time) string {
				if at.IsZero() {
					return "unseen"
				}
				return at.Sub(w.cut).Round(time.Millisecond).String()
			}
			m, _ := w.margin()
			t.Logf("  negative margin %v, %s of hold %d, times from the fault: last ack %s, Done closed %s, Session ended %s, key deleted %s, next acquisition %s",
				m.Round(time.Millisecond), k, w.token, rel(w.lastAck), rel(w.done), rel(w.sessionEnd), rel(w.deleted), rel(w.next))
		}
	}
}

// deletions records when each key under a prefix was deleted in etcd, by
// its create revision (the hold's token), as a watch sees it.
type deletions struct {
	mu sync.Mutex
	at map[int64]time.Time
}

// watch records the deletions under prefix after revision from, until ctx
// ends.
func (d *deletions) watch(ctx context.Context, client *clientv3.Client, prefix string, from int64) {
	wch := client.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(from+1), clientv3.WithPrevKV(), clientv3.WithFilterPut())
	for wr := range wch {
		at := time.Now()
		d.mu.Lock()
		if d.at == nil {
			d.at = make(map[int64]time.Time)
		}
		for _, ev := range wr.Events {
			if ev.PrevKv != nil {
				if _, ok := d.at[ev.PrevKv.CreateRevision]; !ok {
					d.at[ev.PrevKv.CreateRevision] = at
				}
			}
		}
		d.mu.Unlock()
	}
}

// of returns when the key with create revision token was deleted (zero:
// not seen).
func (d *deletions) of(token int64) time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.at[token]
}
