package sim

import (
	"fmt"
	"html"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/geoquota/geoquota/regional"
)

// palette colours the regions, in the scenario's order.
var palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"}

// What became of a region's requests, in every chart and table.
const (
	colorAdmitted = "#3a7dc0"
	colorFalse    = "#e03b2f"
	colorRefused  = "#cfcfcf"
	colorDemand   = "#333333"
	colorLimit    = "#b2182b"
)

// faultColors shade each kind of fault; faultOpacity is the shading's.
var faultColors = map[string]string{
	"partition":       "#f2b705",
	"split":           "#9b7fd4",
	"globalsync-down": "#8a8a8a",
	"redis-down":      "#e8846b",
	"clock-jump":      "#6d4c41",
}

const faultOpacity = 0.22

func faultColor(kind string) string {
	if c, ok := faultColors[kind]; ok {
		return c
	}
	return "#8a8a8a"
}

// series is one line, or one set of bars, of a chart. Its x values are
// seconds since the start of the run.
type series struct {
	id     string // names it in the SVG (data-series), for tools and tests
	name   string // in the legend
	color  string
	xs, ys []float64
	// Bars are barW seconds wide and start at base (at 0 if base is nil:
	// a stack of bars gives each set the tops of the one below); faint
	// bars, of a window the run covers in part, are paler; tips are
	// their tooltips.
	bars    bool
	barW    float64
	base    []float64
	faint   []bool
	tips    []string
	outline bool // bars drawn as an outline only
	dash    bool
}

// chart is a self-contained SVG chart over the time of a run: bars and
// lines, the faults shaded behind them.
type chart struct {
	title, ylabel string
	series        []series
	faults        []Fault
	end           time.Duration // the time axis runs from 0 to end
	ymax          float64       // the top of the y axis; 0: from the data
	plotH         int
	// legendRows is the least rows the legend takes: charts side by side
	// take as many, so that their plots line up.
	legendRows int
	// empty, if set, is written across a plot with nothing above 0.
	empty string
}

const (
	chartW           = 680
	padL, padR, padB = 66, 18, 48
	plotW            = chartW - padL - padR
	legendTop        = 38
	legendRow        = 18
	maxPointsPerLine = 4000
	svgFont          = `font-family="DejaVu Sans, Arial, Helvetica, sans-serif" font-size="12"`
	// textW is about the width of a character of the 12px font.
	textW = 7.0
)

// legendItem is one entry of a chart's legend: a series or a fault.
type legendItem struct {
	label, color string
	kind         string // "box", "outline", "line", "dash", "fault", "instant"
	x, y         int    // where it goes: its left and its baseline
}

func (c chart) legend() []legendItem {
	var out []legendItem
	for _, s := range c.series {
		kind := "line"
		switch {
		case s.outline:
			kind = "outline"
		case s.bars:
			kind = "box"
		case s.dash:
			kind = "dash"
		}
		out = append(out, legendItem{label: s.name, color: s.color, kind: kind})
	}
	for _, f := range c.faults {
		it := legendItem{label: f.What + ", " + spanString(f.From, f.To), color: faultColor(f.Kind), kind: "fault"}
		if f.To == f.From {
			it.kind = "instant"
		}
		out = append(out, it)
	}
	return out
}

// legendWidth is the room a legend item takes in its row.
func legendWidth(it legendItem) int {
	return 20 + int(math.Ceil(textW*float64(utf8.RuneCountInString(it.label)))) + 18
}

// placedLegend is the legend, placed in rows under the title, and the
// baseline of its last row.
func (c chart) placedLegend() ([]legendItem, int) {
	items := c.legend()
	x, y := padL, legendTop
	for i := range items {
		w := legendWidth(items[i])
		if x+w > chartW-padR && x > padL {
			x, y = padL, y+legendRow
		}
		items[i].x, items[i].y = x, y
		x += w
	}
	return items, y
}

// legendRowsOf is how many rows the chart's legend takes.
func (c chart) legendRowsOf() int {
	_, y := c.placedLegend()
	return (y-legendTop)/legendRow + 1
}

// dataMax is the highest value the chart draws.
func (c chart) dataMax() float64 {
	top := 0.0
	for _, s := range c.series {
		for j, y := range s.ys {
			if s.base != nil {
				y += s.base[j]
			}
			top = math.Max(top, y)
		}
	}
	return top
}

// barsMax is the highest bar of the chart.
func (c chart) barsMax() float64 {
	top := 0.0
	for _, s := range c.series {
		if s.bars {
			top = math.Max(top, chart{series: []series{s}}.dataMax())
		}
	}
	return top
}

// top is the top of the chart's y axis.
func (c chart) top() float64 {
	if c.ymax > 0 {
		return c.ymax
	}
	if m := c.dataMax(); m > 0 {
		return m * 1.08
	}
	return 1
}

// svg renders the chart. The output depends on the data alone.
func (c chart) svg() string {
	xmax := math.Max(c.end.Seconds(), 1e-3)
	ymax := c.top()
	plotH := c.plotH
	if plotH <= 0 {
		plotH = 220
	}
	var b strings.Builder
	// The legend, in rows under the title, decides where the plot starts.
	var legend strings.Builder
	items, last := c.placedLegend()
	for _, it := range items {
		x, y := it.x, it.y
		switch it.kind {
		case "box":
			fmt.Fprintf(&legend, `<rect x="%d" y="%d" width="14" height="11" fill="%s"/>`+"\n", x, y-10, it.color)
		case "outline":
			fmt.Fprintf(&legend, `<rect x="%d" y="%d" width="13" height="10" fill="none" stroke="%s" stroke-width="1.5"/>`+"\n", x, y-10, it.color)
		case "fault":
			fmt.Fprintf(&legend, `<rect x="%d" y="%d" width="14" height="11" fill="%s" fill-opacity="%.2f" stroke="%s" stroke-opacity="0.6"/>`+"\n",
				x, y-10, it.color, faultOpacity*2, it.color)
		case "instant":
			fmt.Fprintf(&legend, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2" stroke-dasharray="3 2"/>`+"\n", x+7, y-11, x+7, y+2, it.color)
		case "dash":
			fmt.Fprintf(&legend, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2" stroke-dasharray="5 3"/>`+"\n", x, y-4, x+14, y-4, it.color)
		default:
			fmt.Fprintf(&legend, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2.5"/>`+"\n", x, y-4, x+14, y-4, it.color)
		}
		fmt.Fprintf(&legend, `<text x="%d" y="%d">%s</text>`+"\n", x+20, y, html.EscapeString(it.label))
	}
	padT := max(last, legendTop+(c.legendRows-1)*legendRow) + 14
	chartH := padT + plotH + padB
	px := func(x float64) float64 { return padL + math.Max(0, math.Min(xmax, x))/xmax*plotW }
	py := func(y float64) float64 {
		return float64(padT+plotH) - math.Max(0, math.Min(ymax, y))/ymax*float64(plotH)
	}

	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" %s>`+"\n", chartW, chartH, chartW, chartH, svgFont)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#fff"/>`+"\n", chartW, chartH)
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="15" font-weight="bold">%s</text>`+"\n", padL, html.EscapeString(c.title))
	b.WriteString(legend.String())
	// The faults, shaded behind everything else: bars may hide the
	// shading, so their edges and a band along the top of the plot are
	// drawn over the series, below.
	for _, f := range c.faults {
		if f.To == f.From {
			continue
		}
		x0, x1 := px(f.From.Seconds()), px(f.To.Seconds())
		fmt.Fprintf(&b, `<rect class="fault" data-kind="%s" data-from="%s" data-to="%s" x="%.1f" y="%d" width="%.1f" height="%d" fill="%s" fill-opacity="%.2f"><title>%s</title></rect>`+"\n",
			html.EscapeString(f.Kind), secs(f.From), secs(f.To), x0, padT, x1-x0, plotH, faultColor(f.Kind), faultOpacity, html.EscapeString(f.What+", "+spanString(f.From, f.To)))
	}
	// Grid, ticks and their labels.
	for _, t := range ticks(0, ymax, 5) {
		y := py(t)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e2e2e2"/>`+"\n", padL, y, padL+plotW, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", padL-6, y+4, short(t))
	}
	tt, unit := timeTicks(xmax, plotW/75)
	for _, t := range tt {
		x := px(t)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#999"/>`+"\n", x, padT+plotH, x, padT+plotH+5)
		fmt.Fprintf(&b, `<text class="tick" data-t="%s" x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", raw(t), x, padT+plotH+18, timeLabel(t, unit))
	}
	for _, s := range c.series {
		if s.bars {
			for j, x := range s.xs {
				x0, x1 := px(x), px(x+s.barW)
				if x1-x0 < 0.05 {
					continue // outside the run
				}
				base := 0.0
				if s.base != nil {
					base = s.base[j]
				}
				y0, y1 := py(base+s.ys[j]), py(base)
				style := fmt.Sprintf(`fill="%s"`, s.color)
				if s.outline {
					style = fmt.Sprintf(`fill="none" stroke="%s" stroke-width="1.5"`, s.color)
				}
				if s.faint != nil && s.faint[j] {
					style += ` fill-opacity="0.4" stroke-opacity="0.4"`
				}
				fmt.Fprintf(&b, `<rect class="bar" data-series="%s" data-t="%s" data-v="%s" x="%.1f" y="%.1f" width="%.1f" height="%.1f" %s>`,
					html.EscapeString(s.id), raw(x), raw(s.ys[j]), x0+1, y0, math.Max(0.5, x1-x0-2), y1-y0, style)
				if s.tips != nil {
					fmt.Fprintf(&b, `<title>%s</title>`, html.EscapeString(s.tips[j]))
				}
				b.WriteString("</rect>\n")
			}
			continue
		}
		var pts []string
		step := max(1, len(s.xs)/maxPointsPerLine)
		for j := 0; j < len(s.xs); j += step {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(s.xs[j]), py(s.ys[j])))
		}
		dash := ""
		if s.dash {
			dash = ` stroke-dasharray="6 4"`
		}
		fmt.Fprintf(&b, `<polyline class="line" data-series="%s" fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", html.EscapeString(s.id), s.color, dash, strings.Join(pts, " "))
	}
	if c.empty != "" && c.barsMax() == 0 {
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle" font-size="14" fill="#555">%s</text>`+"\n", padL+plotW/2, padT+plotH/2, html.EscapeString(c.empty))
	}
	for _, f := range c.faults {
		x0, x1 := px(f.From.Seconds()), px(f.To.Seconds())
		tip := html.EscapeString(f.What + ", " + spanString(f.From, f.To))
		color := faultColor(f.Kind)
		if f.To == f.From {
			fmt.Fprintf(&b, `<line class="fault" data-kind="%s" data-from="%s" data-to="%s" x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s" stroke-width="2" stroke-dasharray="4 3"><title>%s</title></line>`+"\n",
				html.EscapeString(f.Kind), secs(f.From), secs(f.To), x0, padT-6, x0, padT+plotH, color, tip)
			continue
		}
		fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="6" fill="%s"><title>%s</title></rect>`+"\n", x0, padT-6, x1-x0, color, tip)
		for _, x := range []float64{x0, x1} {
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s" stroke-width="1.5" stroke-dasharray="4 3"/>`+"\n", x, padT-6, x, padT+plotH, color)
		}
	}
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`+"\n", padL, padT+plotH, padL+plotW, padT+plotH)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`+"\n", padL, padT, padL, padT+plotH)
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">time since the start of the run (%s)</text>`+"\n", padL+plotW/2, chartH-8, unit)
	fmt.Fprintf(&b, `<text transform="translate(16 %d) rotate(-90)" text-anchor="middle">%s</text>`+"\n", padT+plotH/2, html.EscapeString(c.ylabel))
	b.WriteString("</svg>\n")
	return b.String()
}

// ticks returns about n round values between lo and hi.
func ticks(lo, hi float64, n int) []float64 {
	span := hi - lo
	step := math.Pow(10, math.Floor(math.Log10(span/float64(n))))
	for _, m := range []float64{1, 2, 5, 10} {
		if span/(step*m) <= float64(n) {
			step *= m
			break
		}
	}
	var out []float64
	for t := math.Ceil(lo/step) * step; t <= hi+step*1e-9; t += step {
		out = append(out, math.Round(t/step)*step)
	}
	return out
}

// timeSteps are the steps of a time axis, in seconds.
var timeSteps = []float64{0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800}

// timeTicks returns the ticks of a time axis from 0 to end seconds, at
// most about n, on a round step, and the unit their labels are in.
func timeTicks(end float64, n int) ([]float64, string) {
	step := timeSteps[len(timeSteps)-1]
	for _, s := range timeSteps {
		if end/s <= float64(n) {
			step = s
			break
		}
	}
	unit := "m:ss"
	switch {
	case step < 1:
		unit = "m:ss.s"
	case end > 3600:
		unit = "h:mm"
	}
	var out []float64
	for i := 0; float64(i)*step <= end+step*1e-9; i++ {
		out = append(out, math.Round(float64(i)*step*10)/10)
	}
	return out, unit
}

// timeLabel writes t seconds in a time axis's unit.
func timeLabel(t float64, unit string) string {
	d := time.Duration(math.Round(t*10)) * 100 * time.Millisecond
	switch unit {
	case "h:mm":
		return fmt.Sprintf("%d:%02d", d/time.Hour, d%time.Hour/time.Minute)
	case "m:ss.s":
		return fmt.Sprintf("%d:%04.1f", d/time.Minute, float64(d%time.Minute)/float64(time.Second))
	}
	return fmt.Sprintf("%d:%02d", d/time.Minute, d%time.Minute/time.Second)
}

// timeString writes a virtual time for people: h:mm:ss from an hour on,
// m:ss before, with tenths of a second if there are any.
func timeString(d time.Duration) string { return timeIn(d, d.Abs() >= time.Hour) }

// timeIn writes a virtual time as h:mm:ss if hours is set, else m:ss.
func timeIn(d time.Duration, hours bool) string {
	neg := ""
	if d < 0 {
		neg, d = "-", -d
	}
	d = d.Round(100 * time.Millisecond)
	var s string
	if hours {
		s = fmt.Sprintf("%d:%02d:%02d", d/time.Hour, d%time.Hour/time.Minute, d%time.Minute/time.Second)
	} else {
		s = fmt.Sprintf("%d:%02d", d/time.Minute, d%time.Minute/time.Second)
	}
	if t := d % time.Second / (100 * time.Millisecond); t > 0 {
		s += fmt.Sprintf(".%d", t)
	}
	return neg + s
}

// spanString writes the span from a to b, both ends alike, or the time a
// alone if they are the same.
func spanString(a, b time.Duration) string {
	if a == b {
		return "at " + timeString(a)
	}
	hours := max(a.Abs(), b.Abs()) >= time.Hour
	return timeIn(a, hours) + "–" + timeIn(b, hours)
}

// secs writes a duration in seconds, for an attribute.
func secs(d time.Duration) string { return raw(d.Seconds()) }

// raw writes a number for an attribute, as short as it goes.
func raw(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// num writes a number briefly: whole numbers with thousands separated,
// others with up to three decimals.
func num(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e15 {
		return group(int64(v))
	}
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.3f", v), "0"), ".")
}

// short writes a number of an axis in five characters or so: 9,500, 20k,
// 1.5M.
func short(v float64) string {
	trim := func(s string) string { return strings.TrimRight(strings.TrimRight(s, "0"), ".") }
	switch a := math.Abs(v); {
	case a >= 1e6:
		return trim(fmt.Sprintf("%.2f", v/1e6)) + "M"
	case a >= 1e4:
		return trim(fmt.Sprintf("%.1f", v/1e3)) + "k"
	}
	return num(v)
}

// group writes n with its thousands separated by commas.
func group(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		return "-" + s
	}
	return s
}

// windowString writes a window's span, and says if the run covers it in
// part.
func (r *Report) windowString(w Window) string {
	s := spanString(w.Start, w.Start+r.Window)
	if !w.Full {
		s += " (covered in part)"
	}
	return s
}

// figure is one chart of the page, drawn once for each report (each
// mode), on one scale so that they compare at a glance.
type figure struct {
	file   string // the name its SVG is written under, if it is written alone
	charts []chart
}

// figures are the page's charts: each region's demand and what became of
// it, then the busiest counter against the limit, over-admission and the
// regions' shares.
func figures(reps []*Report) []figure {
	var out []figure
	each := func(file string, draw func(r *Report) chart) {
		f := figure{file: file}
		top, rows := 0.0, 1
		for _, r := range reps {
			c := draw(r)
			top, rows = math.Max(top, c.top()), max(rows, c.legendRowsOf())
			f.charts = append(f.charts, c)
		}
		for i := range f.charts {
			f.charts[i].ymax, f.charts[i].legendRows = top, rows
		}
		out = append(out, f)
	}
	for i := range reps[0].Regions {
		each("", func(r *Report) chart { return r.regionChart(i) })
	}
	each("admitted.svg", (*Report).admittedChart)
	each("over.svg", (*Report).overChart)
	each("shares.svg", (*Report).sharesChart)
	return out
}

// regionChart is one region's demand per window, and what became of it:
// admitted, refused falsely (while its counter had room), refused beyond
// the limit.
func (r *Report) regionChart(i int) chart {
	name := r.Regions[i]
	c := chart{title: fmt.Sprintf("%s (%s): demand per window and what became of it", name, r.Mode),
		ylabel: fmt.Sprintf("%s per %s window", r.units(), regional.ShortDuration(r.Window)), faults: r.Faults, end: r.Duration, plotH: 170}
	wsec := r.Window.Seconds()
	demand := series{id: "demand", name: "demand (asked)", color: colorDemand, bars: true, outline: true, barW: wsec}
	adm := series{id: "admitted", name: "admitted", color: colorAdmitted, bars: true, barW: wsec}
	fr := series{id: "false-rejected", name: "false rejections", color: colorFalse, bars: true, barW: wsec}
	refused := series{id: "refused", name: "refused beyond the limit", color: colorRefused, bars: true, barW: wsec}
	split := true
	for _, w := range r.Windows {
		split = split && w.FalseRejectedByRegion != nil
	}
	if !split {
		refused.name = "refused (not split live)"
	}
	at := func(v []int64) int64 {
		if i < len(v) {
			return v[i]
		}
		return 0
	}
	for _, w := range r.Windows {
		x := w.Start.Seconds()
		asked, a, f := at(w.RequestsByRegion), at(w.ByRegion), at(w.FalseRejectedByRegion)
		rest := max(0, asked-a-f)
		faint := !w.Full
		for _, s := range []*series{&demand, &adm, &fr, &refused} {
			s.xs, s.faint = append(s.xs, x), append(s.faint, faint)
		}
		demand.ys, demand.base = append(demand.ys, float64(asked)), append(demand.base, 0)
		adm.ys, adm.base = append(adm.ys, float64(a)), append(adm.base, 0)
		fr.ys, fr.base = append(fr.ys, float64(f)), append(fr.base, float64(a))
		refused.ys, refused.base = append(refused.ys, float64(rest)), append(refused.base, float64(a+f))
		tip := fmt.Sprintf("%s, %s: asked %s; admitted %s (%.1f%%)", name, r.windowString(w), group(asked), group(a), pct(a, asked))
		if split {
			tip += fmt.Sprintf("; false rejections %s (%.1f%%); refused beyond the limit %s (%.1f%%)", group(f), pct(f, asked), group(rest), pct(rest, asked))
		} else {
			tip += fmt.Sprintf("; refused %s (%.1f%%)", group(rest), pct(rest, asked))
		}
		for _, s := range []*series{&demand, &adm, &fr, &refused} {
			s.tips = append(s.tips, tip)
		}
	}
	c.series = []series{adm, fr, refused, demand}
	if !split {
		c.series = []series{adm, refused, demand}
	}
	return c
}

// admittedChart is what the busiest counter admitted in each window,
// against the limit.
func (r *Report) admittedChart() chart {
	wsec := r.Window.Seconds()
	c := chart{title: fmt.Sprintf("%s (%s): the busiest counter against the limit", r.Scenario, r.Mode),
		ylabel: fmt.Sprintf("%s admitted per %s window", r.units(), regional.ShortDuration(r.Window)), faults: r.Faults, end: r.Duration, plotH: 200}
	adm := series{id: "admitted", name: "admitted (busiest counter)", color: colorAdmitted, bars: true, barW: wsec}
	lim := series{id: "limit", name: fmt.Sprintf("limit (%s)", group(r.Limit)), color: colorLimit, dash: true}
	for _, w := range r.Windows {
		x := w.Start.Seconds()
		adm.xs, adm.ys, adm.faint = append(adm.xs, x), append(adm.ys, float64(w.Admitted)), append(adm.faint, !w.Full)
		adm.tips = append(adm.tips, fmt.Sprintf("%s: the busiest counter admitted %s, %.1f%% of the limit", r.windowString(w), group(w.Admitted), 100*w.Utilization(r.Limit)))
	}
	lim.xs, lim.ys = []float64{0, r.Duration.Seconds()}, []float64{float64(r.Limit), float64(r.Limit)}
	c.series = []series{adm, lim}
	return c
}

// overChart is the worst counter's over-admission in each window.
func (r *Report) overChart() chart {
	wsec := r.Window.Seconds()
	c := chart{title: fmt.Sprintf("%s (%s): over-admission per window", r.Scenario, r.Mode),
		ylabel: "% of the limit over it", faults: r.Faults, end: r.Duration, plotH: 150, ymax: 5, empty: "no window over the limit"}
	ov := series{id: "over", name: "admitted over the limit (worst counter)", color: colorFalse, bars: true, barW: wsec}
	for _, w := range r.Windows {
		x := w.Start.Seconds()
		ov.xs, ov.ys, ov.faint = append(ov.xs, x), append(ov.ys, w.OverPct(r.Limit)), append(ov.faint, !w.Full)
		ov.tips = append(ov.tips, fmt.Sprintf("%s: %s over the limit (%.2f%%), %d counters over", r.windowString(w), group(w.Over), w.OverPct(r.Limit), w.OverCount))
		c.ymax = math.Max(c.ymax, math.Ceil(w.OverPct(r.Limit)*1.1))
	}
	c.series = []series{ov}
	if r.Mode == "elastic" {
		c.series = append(c.series, series{id: "bound", name: fmt.Sprintf("elastic bound (%g%%)", r.ElasticBound), color: "#555", dash: true,
			xs: []float64{0, r.Duration.Seconds()}, ys: []float64{r.ElasticBound, r.ElasticBound}})
		c.ymax = math.Max(c.ymax, math.Ceil(r.ElasticBound*1.25))
	}
	return c
}

// sharesChart is what each region may admit over time, a fraction of the
// limit.
func (r *Report) sharesChart() chart {
	c := chart{title: fmt.Sprintf("%s (%s): what each region may admit (its share)", r.Scenario, r.Mode),
		ylabel: "fraction of the limit", faults: r.Faults, end: r.Duration, plotH: 200}
	maxShare := 0.0
	for i, name := range r.Regions {
		s := series{id: "share-" + name, name: name, color: palette[i%len(palette)]}
		for _, smp := range r.Samples {
			s.xs, s.ys = append(s.xs, smp.At.Seconds()), append(s.ys, smp.Shares[i])
			maxShare = math.Max(maxShare, smp.Shares[i])
		}
		c.series = append(c.series, s)
	}
	c.ymax = math.Max(0.1, math.Min(1, math.Ceil(maxShare*11)/10))
	return c
}
