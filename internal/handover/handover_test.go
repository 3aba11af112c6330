package handover

import "testing"

func TestKeys(t *testing.T) {
	for _, c := range []struct{ name, record, term string }{
		{"jobs/nightly", "etcdlock.handover.jobs%2Fnightly", "etcdlock.term.jobs%2Fnightly"},
		{"a%2Fb", "etcdlock.handover.a%252Fb", "etcdlock.term.a%252Fb"},
		{"leader", "etcdlock.handover.leader", "etcdlock.term.leader"},
	} {
		if got := RecordKey(c.name); got != c.record {
			t.Errorf("RecordKey(%q): got %q, want %q", c.name, got, c.record)
		}
		if got := TermKey(c.name); got != c.term {
			t.Errorf("TermKey(%q): got %q, want %q", c.name, got, c.term)
		}
	}
}

func TestParse(t *testing.T) {
	c := Candidate{Key: "jobs/nightly/694d9a1b2c3d4e5f", Token: 42}
	if got, ok := parse([]byte(c.value())); !ok || got != c {
		t.Errorf("parse(%q): got %+v, %v; want %+v", c.value(), got, ok, c)
	}
	for _, bad := range []string{"", "42", "42 ", "x key", "0 key", "-1 key", " key"} {
		if got, ok := parse([]byte(bad)); ok {
			t.Errorf("parse(%q): got %+v, want no candidate", bad, got)
		}
	}
}
