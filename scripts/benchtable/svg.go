package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// The two libraries as the pictures draw them: colours that stay apart for
// colour-blind readers, and a marker shape each, so that print in grey still
// tells them apart.
var series = []struct {
	impl, label, color, shape string
}{
	{ours, "etcdlock", "#0072B2", "circle"},
	{up, "concurrency.Mutex (upstream)", "#D55E00", "square"},
}

// writeSVGs writes waiting.svg and handoff.svg to dir.
func (r results) writeSVGs(dir string) error {
	if r.runs(waiting(waitingCounts[0], ours)) == 0 {
		return errors.New("no BenchmarkWaiting results to draw")
	}
	files := []struct {
		name string
		svg  string
	}{
		{"waiting.svg", r.waitingSVG()},
		{"handoff.svg", r.handoffSVG()},
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f.name), []byte(f.svg), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// span returns the smallest and largest of the positive, non-NaN values.
func span(vs ...float64) (lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, v := range vs {
		if v > 0 && !math.IsNaN(v) {
			lo, hi = min(lo, v), max(hi, v)
		}
	}
	return lo, hi
}

// A scale maps values in [lo, hi] to pixels in [p0, p1], linearly or by
// their logarithm.
type scale struct {
	lo, hi, p0, p1 float64
	log            bool
}

func (s scale) at(v float64) float64 {
	f := (v - s.lo) / (s.hi - s.lo)
	if s.log {
		f = math.Log10(v/s.lo) / math.Log10(s.hi/s.lo)
	}
	return s.p0 + f*(s.p1-s.p0)
}

// valueScale returns a scale for values from lo to hi: by logarithm when
// they span more than a decade, from the 1-2-5 step below lo to the one
// above hi, with room so that no point sits on an edge; else linear from 0. It returns the values to draw a
// tick and a grid line at: the 1-2-5 steps, or only the powers of ten when
// there are more than four decades.
func valueScale(lo, hi, p0, p1 float64) (scale, []float64) {
	if hi/lo <= 10 {
		step := niceStep(hi / 5)
		top := math.Ceil(hi/step) * step
		var ticks []float64
		for v := 0.0; v <= top+step/2; v += step {
			ticks = append(ticks, v)
		}
		return scale{lo: 0, hi: top, p0: p0, p1: p1}, ticks
	}
	lo, hi = lo/1.15, hi*1.15
	var steps []float64
	for d := math.Floor(math.Log10(lo)); d <= math.Ceil(math.Log10(hi)); d++ {
		for _, m := range []float64{1, 2, 5} {
			steps = append(steps, m*math.Pow(10, d))
		}
	}
	first := len(steps) - 1
	for first > 0 && steps[first] > lo*(1+1e-9) {
		first--
	}
	last := slices.IndexFunc(steps, func(v float64) bool { return v >= hi*(1-1e-9) })
	decadesOnly := math.Log10(steps[last]/steps[first]) > 4
	var ticks []float64
	for i, v := range steps[first : last+1] {
		if !decadesOnly || i == 0 || i == last-first || v == math.Pow(10, math.Round(math.Log10(v))) {
			ticks = append(ticks, v)
		}
	}
	return scale{lo: steps[first], hi: steps[last], p0: p0, p1: p1, log: true}, ticks
}

// niceStep returns 1, 2 or 5 times a power of ten, at least v.
func niceStep(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// tickLabel formats a tick value: 0.01, 0.5, 20, 1000.
func tickLabel(v float64) string {
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// An svg is a picture being written.
type svg struct {
	b strings.Builder
}

func newSVG(w, h float64) *svg {
	s := &svg{}
	s.f(`<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">`+"\n", w, h, w, h)
	s.f(`<rect width="%g" height="%g" fill="white"/>`+"\n", w, h)
	return s
}

func (s *svg) f(format string, args ...any) { fmt.Fprintf(&s.b, format, args...) }

func (s *svg) line(x1, y1, x2, y2 float64, style string) {
	s.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" %s/>`+"\n", x1, y1, x2, y2, style)
}

// text writes str at x, y; anchor is start, middle or end.
func (s *svg) text(x, y float64, anchor, str, style string) {
	s.f(`<text x="%.1f" y="%.1f" text-anchor="%s" %s>%s</text>`+"\n", x, y, anchor, style, escape(str))
}

// marker draws a marker of a shape centred on x, y.
func (s *svg) marker(shape string, x, y, r float64, color string, filled bool) {
	fill := "white"
	if filled {
		fill = color
	}
	style := fmt.Sprintf(`fill="%s" stroke="%s" stroke-width="1.5"`, fill, color)
	switch shape {
	case "circle":
		s.f(`<circle cx="%.1f" cy="%.1f" r="%.1f" %s/>`+"\n", x, y, r, style)
	case "square":
		s.f(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" %s/>`+"\n", x-r, y-r, 2*r, 2*r, style)
	case "triangle":
		s.f(`<path d="M%.1f %.1fL%.1f %.1fL%.1f %.1fZ" %s/>`+"\n", x, y-1.2*r, x+1.1*r, y+0.8*r, x-1.1*r, y+0.8*r, style)
	case "diamond":
		s.f(`<path d="M%.1f %.1fL%.1f %.1fL%.1f %.1fL%.1f %.1fZ" %s/>`+"\n", x, y-1.3*r, x+1.3*r, y, x, y+1.3*r, x-1.3*r, y, style)
	case "bar":
		s.f(`<rect x="%.1f" y="%.1f" width="3" height="%.1f" fill="%s"/>`+"\n", x-1.5, y-1.4*r, 2.8*r, color)
	}
}

func (s *svg) end() string {
	s.f("</svg>\n")
	return s.b.String()
}

func escape(str string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(str)
}

const (
	gridStyle  = `stroke="#e3e3e3" stroke-width="1"`
	axisStyle  = `stroke="#333" stroke-width="1"`
	smallStyle = `font-size="11" fill="#555"`
	titleStyle = `font-size="15" font-weight="bold"`
)

// waitingNames returns the names of BenchmarkWaiting's sub-benchmarks.
func waitingNames() []string {
	var names []string
	for _, n := range waitingCounts {
		for _, sr := range series {
			names = append(names, waiting(n, sr.impl))
		}
	}
	return names
}

// runsNote says over how many runs the medians are.
func (r results) runsNote(names []string) string {
	lo, hi := math.MaxInt, 0
	for _, name := range names {
		if n := r.runs(name); n > 0 {
			lo, hi = min(lo, n), max(hi, n)
		}
	}
	switch {
	case hi == 0:
		return "no runs"
	case lo == hi && lo == 1:
		return "one run"
	case lo == hi:
		return fmt.Sprintf("median of %d runs", lo)
	}
	return fmt.Sprintf("median of %d to %d runs", lo, hi)
}

// waitingSVG draws acquisitions/s against the number of sessions waiting
// on one lock (BenchmarkWaiting), both libraries, with the median of the
// runs as a point and their spread as a bar.
func (r results) waitingSVG() string {
	const (
		w, h                     = 800.0, 460.0
		left, right, top, bottom = 90.0, 540.0, 86.0, 390.0
	)
	names := waitingNames()
	var vals []float64
	for _, name := range names {
		vals = append(vals, r[name]["acq/s"]...)
	}
	lo, hi := span(vals...)
	y, yticks := valueScale(lo, hi, bottom, top)
	x := scale{lo: float64(waitingCounts[0]) / 1.5, hi: float64(waitingCounts[len(waitingCounts)-1]) * 1.5, p0: left, p1: right, log: true}

	s := newSVG(w, h)
	s.text(16, 26, "start", "Acquisitions per second against sessions waiting on one lock", titleStyle)
	s.text(16, 46, "start", "BenchmarkWaiting: a lease per session, a client per 32 sessions, etcd embedded in the process.", smallStyle)
	s.text(16, 62, "start", "Points: "+r.runsNote(names)+"; bars, where there are several runs: from the slowest run to the fastest.", smallStyle)
	for _, v := range yticks {
		py := y.at(v)
		s.line(left, py, right, py, gridStyle)
		s.text(left-8, py+4, "end", tickLabel(v), "")
	}
	for _, n := range waitingCounts {
		px := x.at(float64(n))
		s.line(px, top, px, bottom, gridStyle)
		s.line(px, bottom, px, bottom+5, axisStyle)
		s.text(px, bottom+20, "middle", strconv.Itoa(n), "")
	}
	s.line(left, bottom, right, bottom, axisStyle)
	s.line(left, top, left, bottom, axisStyle)
	xLabel, yLabel := "sessions waiting on the lock (log scale)", "acquisitions per second"
	if y.log {
		yLabel += " (log scale)"
	}
	s.text((left+right)/2, bottom+44, "middle", xLabel, "")
	s.f(`<text transform="translate(24 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", (top+bottom)/2, escape(yLabel))

	for i, sr := range series {
		var pts []string
		for _, n := range waitingCounts {
			name := waiting(n, sr.impl)
			med, ok := r.median(name, "acq/s")
			if !ok {
				continue
			}
			px := x.at(float64(n))
			vlo, vhi := span(r[name]["acq/s"]...)
			if vhi > vlo {
				s.line(px, y.at(vlo), px, y.at(vhi), fmt.Sprintf(`stroke="%s" stroke-width="2" stroke-opacity="0.45"`, sr.color))
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px, y.at(med)))
		}
		s.f(`<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(pts, " "), sr.color)
		for _, n := range waitingCounts {
			name := waiting(n, sr.impl)
			med, ok := r.median(name, "acq/s")
			if !ok {
				continue
			}
			px, py := x.at(float64(n)), y.at(med)
			s.marker(sr.shape, px, py, 4.5, sr.color, true)
			dy := -11.0 // the label of the higher point above it, of the lower below
			if other, ok := r.median(waiting(n, series[1-i].impl), "acq/s"); ok && other > med {
				dy = 20
			}
			s.text(px+6, py+dy, "start", fmtNum(med), fmt.Sprintf(`font-size="11" fill="%s"`, sr.color))
		}
		ly := top + 10 + float64(i)*22
		s.line(right+20, ly, right+50, ly, fmt.Sprintf(`stroke="%s" stroke-width="2"`, sr.color))
		s.marker(sr.shape, right+35, ly, 4.5, sr.color, true)
		s.text(right+58, ly+4, "start", sr.label, "")
	}
	return s.end()
}

// handoffSVG draws the hand-off latency percentiles of BenchmarkWaiting, a
// row per number of sessions and library, on a logarithmic scale of
// milliseconds.
func (r results) handoffSVG() string {
	type row struct {
		label, color string
		vs           []float64 // one per handoffUnits
	}
	var rows []row
	var vals []float64
	for _, n := range waitingCounts {
		for _, sr := range series {
			name := waiting(n, sr.impl)
			rw := row{label: fmt.Sprintf("%d sessions, %s", n, strings.TrimPrefix(sr.impl, "/")), color: sr.color}
			for _, hu := range handoffUnits {
				v := r.m(name, hu.unit)
				rw.vs = append(rw.vs, v)
				vals = append(vals, v)
			}
			rows = append(rows, rw)
		}
	}
	const (
		w, rowH            = 860.0, 26.0
		left, right, top   = 170.0, 620.0, 108.0
		shapeR             = 5.0
		valuesX            = right + 14
		bandFill           = "#f4f6f8"
		percentileMarkers  = "circle triangle diamond bar"
		percentileExplains = "the hand-off: from the moment a holder starts its unlock to the moment the next holder's lock returns"
	)
	shapes := strings.Fields(percentileMarkers)
	names := waitingNames()
	bottom := top + rowH*float64(len(rows))
	h := bottom + 64
	lo, hi := span(vals...)
	x, xticks := valueScale(lo, hi, left, right)

	s := newSVG(w, h)
	s.text(16, 26, "start", "Hand-off latency with sessions waiting on one lock (p50, p90, p99, max)", titleStyle)
	s.text(16, 44, "start", "BenchmarkWaiting: "+percentileExplains+".", smallStyle)
	s.text(16, 59, "start", "Each percentile: "+r.runsNote(names)+".", smallStyle)
	// Legend: the percentiles' shapes, then the libraries' colours.
	lx := 16.0
	for i, hu := range handoffUnits {
		s.marker(shapes[i], lx+6, 82, shapeR, "#333", i != 1)
		s.text(lx+16, 86, "start", hu.label, "")
		lx += 62
	}
	for _, sr := range series {
		s.f(`<rect x="%.1f" y="76" width="12" height="12" fill="%s"/>`+"\n", lx+10, sr.color)
		s.text(lx+28, 86, "start", sr.label, "")
		lx += 40 + 7*float64(len(sr.label))
	}
	for i := range rows {
		if (i/len(series))%2 == 0 {
			s.f(`<rect x="0" y="%.1f" width="%g" height="%.1f" fill="%s"/>`+"\n", top+rowH*float64(i), w, rowH, bandFill)
		}
	}
	for _, v := range xticks {
		px := x.at(v)
		s.line(px, top, px, bottom, gridStyle)
		s.line(px, bottom, px, bottom+5, axisStyle)
		s.text(px, bottom+19, "middle", tickLabel(v), "")
	}
	s.line(left, bottom, right, bottom, axisStyle)
	xLabel := "milliseconds"
	if x.log {
		xLabel += " (log scale)"
	}
	s.text((left+right)/2, bottom+42, "middle", xLabel, "")
	s.text(valuesX, top-8, "start", "p50 / p90 / p99 / max ms", smallStyle)

	for i, rw := range rows {
		cy := top + rowH*(float64(i)+0.5)
		s.text(left-10, cy+4, "end", rw.label, "")
		vlo, vhi := span(rw.vs...)
		if vhi >= vlo {
			s.line(x.at(vlo), cy, x.at(vhi), cy, fmt.Sprintf(`stroke="%s" stroke-width="2"`, rw.color))
		}
		cells := make([]string, len(rw.vs))
		for j, v := range rw.vs {
			cells[j] = fmtNum(v)
			if v > 0 && !math.IsNaN(v) {
				s.marker(shapes[j], x.at(v), cy, shapeR, rw.color, j != 1)
			}
		}
		s.text(valuesX, cy+4, "start", strings.Join(cells, " / "), fmt.Sprintf(`fill="%s"`, rw.color))
	}
	return s.end()
}
