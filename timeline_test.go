package etcdlock_test

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// A run of a fault test can leave its record and a picture of it:
// acquisitions per second over time, with the fault windows marked. Set
// ETCDLOCK_TIMELINE to a path without extension; the run writes
// path-<kind>.json (the record) and path-<kind>.svg (drawn from it, by
// hand, with the standard library only).
const timelineEnv = "ETCDLOCK_TIMELINE"

// timeline is the record of a run for its picture. Times are seconds from
// the start of the faults.
type timeline struct {
	Title        string        `json:"title"`
	Seconds      int           `json:"seconds"`
	Acquisitions []int         `json:"acquisitions_per_second"`
	Faults       []faultWindow `json:"faults"`
}

// faultWindow is one fault, from its start to its end (a leader's restart,
// the end of a cut or a freeze; a killed holder's lease expiry counts from
// the kill).
type faultWindow struct {
	Kind string  `json:"kind"`
	From float64 `json:"from"`
	To   float64 `json:"to"`
}

// newTimeline bins the acquisitions between start and end by second.
func newTimeline(title string, start, end time.Time, acquisitions []time.Time, faults []faultWindow) timeline {
	tl := timeline{Title: title, Seconds: int(math.Ceil(end.Sub(start).Seconds())), Faults: faults}
	tl.Acquisitions = make([]int, tl.Seconds)
	for _, at := range acquisitions {
		if s := int(at.Sub(start).Seconds()); at.After(start) && s < tl.Seconds {
			tl.Acquisitions[s]++
		}
	}
	return tl
}

// writeTimeline writes the record and its picture if ETCDLOCK_TIMELINE asks
// for them, as path-<run>.json and path-<run>.svg: one pair per kind of
// lock that a test runs.
func writeTimeline(t *testing.T, run string, tl timeline) {
	t.Helper()
	base := os.Getenv(timelineEnv)
	if base == "" {
		return
	}
	base += "-" + run
	rec, err := json.Marshal(tl)
	if err == nil {
		err = os.WriteFile(base+".json", rec, 0o644)
	}
	if err == nil {
		var f *os.File
		if f, err = os.Create(base + ".svg"); err == nil {
			err = tl.svg(f)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
	}
	if err != nil {
		t.Errorf("timeline: %v", err)
		return
	}
	t.Logf("timeline: %s.json, %s.svg", base, base)
}

// faultColors are the colours of the fault kinds, in the legend's order.
var faultColors = []struct{ kind, color string }{
	{"leader stop", "#9ecae1"},
	{"leader kill", "#3182bd"},
	{"partition", "#fdae6b"},
	{"freeze", "#e6550d"},
	{"holder kill", "#a1d99b"},
}

func faultColor(kind string) string {
	for _, c := range faultColors {
		if strings.HasPrefix(kind, c.kind) {
			return c.color
		}
	}
	return "#bdbdbd"
}

// svg draws the timeline: the faults as bands behind a line of the
// acquisitions per second.
func (tl timeline) svg(w io.Writer) error {
	const (
		width, height            = 1000, 340
		left, right, top, bottom = 50, 20, 40, 60
		plotW, plotH             = width - left - right, height - top - bottom
	)
	secs := max(tl.Seconds, 1)
	peak := 1
	if len(tl.Acquisitions) > 0 {
		peak = max(slices.Max(tl.Acquisitions), 1)
	}
	yStep := niceStep(float64(peak), 5)
	yMax := math.Ceil(float64(peak)/yStep) * yStep
	x := func(s float64) float64 { return left + s/float64(secs)*plotW }
	y := func(v float64) float64 { return top + plotH - v/yMax*plotH }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14">%s</text>`+"\n", left, html.EscapeString(tl.Title))
	for _, f := range tl.Faults {
		x0, x1 := x(f.From), x(f.To)
		fmt.Fprintf(&b, `<rect class="fault" x="%.1f" y="%d" width="%.1f" height="%d" fill="%s" fill-opacity="0.6"><title>%s %.1f–%.1f s</title></rect>`+"\n",
			x0, top, max(x1-x0, 1), plotH, faultColor(f.Kind), html.EscapeString(f.Kind), f.From, f.To)
	}
	// Axes and ticks.
	fmt.Fprintf(&b, `<path d="M%d %d V%d H%d" stroke="black" fill="none"/>`+"\n", left, top, top+plotH, left+plotW)
	for v := 0.0; v <= yMax+yStep/2; v += yStep {
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%g</text><path d="M%d %.1f h%d" stroke="#eeeeee"/>`+"\n",
			left-6, y(v)+4, v, left+1, y(v), plotW-1)
	}
	xStep := niceStep(float64(secs), 10)
	for s := 0.0; s <= float64(secs)+xStep/2; s += xStep {
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x(s), top+plotH+16, clock(s))
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">time since the faults began (min:s); acquisitions per second</text>`+"\n",
		left+plotW/2, top+plotH+34)
	// The acquisitions per second, one point per second.
	b.WriteString(`<polyline fill="none" stroke="black" stroke-width="1" points="`)
	for s, n := range tl.Acquisitions {
		fmt.Fprintf(&b, "%.1f,%.1f ", x(float64(s)+0.5), y(float64(n)))
	}
	b.WriteString("\"/>\n")
	// The legend.
	lx := left
	for _, c := range faultColors {
		if !slices.ContainsFunc(tl.Faults, func(f faultWindow) bool { return faultColor(f.Kind) == c.color }) {
			continue
		}
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="12" fill="%s" fill-opacity="0.6"/><text x="%d" y="%d">%s</text>`+"\n",
			lx, height-16, c.color, lx+16, height-6, c.kind)
		lx += 30 + 8*len(c.kind)
	}
	fmt.Fprintf(&b, `<path d="M%d %d h16" stroke="black"/><text x="%d" y="%d">acquisitions/s</text>`+"\n", lx, height-10, lx+20, height-6)
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// niceStep returns a round step (1, 2 or 5 times a power of ten, or a
// multiple of 60 for long spans of seconds) that cuts span into about n.
func niceStep(span float64, n int) float64 {
	raw := span / float64(n)
	if raw >= 60 {
		return math.Ceil(raw/60) * 60
	}
	pow := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*pow {
			return m * pow
		}
	}
	return 10 * pow
}

// clock formats seconds as min:s.
func clock(s float64) string {
	return fmt.Sprintf("%d:%02d", int(s)/60, int(s)%60)
}

// TestTimelineSVG checks that the picture is well-formed SVG with one band
// per fault and one point per second.
func TestTimelineSVG(t *testing.T) {
	start := time.Now()
	acq := []time.Time{start.Add(100 * time.Millisecond), start.Add(200 * time.Millisecond), start.Add(2500 * time.Millisecond)}
	tl := newTimeline("a <test>", start, start.Add(4*time.Second), acq, []faultWindow{
		{Kind: "leader kill", From: 0.5, To: 1.5}, {Kind: "partition", From: 2, To: 3.5},
	})
	if !slices.Equal(tl.Acquisitions, []int{2, 0, 1, 0}) {
		t.Errorf("acquisitions per second: got %v, want [2 0 1 0]", tl.Acquisitions)
	}
	var b strings.Builder
	if err := tl.svg(&b); err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(strings.NewReader(b.String()))
	faults, points := 0, 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG not well-formed: %v\n%s", err, b.String())
		}
		if el, ok := tok.(xml.StartElement); ok {
			for _, a := range el.Attr {
				switch {
				case a.Name.Local == "class" && a.Value == "fault":
					faults++
				case el.Name.Local == "polyline" && a.Name.Local == "points":
					points = len(strings.Fields(a.Value))
				}
			}
		}
	}
	if faults != 2 || points != 4 {
		t.Errorf("SVG: got %d fault bands and %d points, want 2 and 4", faults, points)
	}
}
