package sim

import (
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// palette colours the regions, in the scenario's order.
var palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"}

// series is one line (or set of bars) of a chart.
type series struct {
	name   string
	color  string
	xs, ys []float64
	bars   bool    // bars from 0, each barW wide (x units)
	barW   float64 // for bars
	dash   bool
}

// chart is a self-contained SVG line and bar chart.
type chart struct {
	title, xlabel, ylabel string
	series                []series
	ymin, ymax            float64 // 0, 0: from the data
}

const (
	chartW, chartH         = 900, 320
	padL, padR, padT, padB = 64, 210, 34, 44
	plotW, plotH           = chartW - padL - padR, chartH - padT - padB
	maxPointsPerLine       = 4000
	svgFont                = `font-family="sans-serif" font-size="12"`
)

// svg renders the chart. The output depends on the data alone.
func (c chart) svg() string {
	xmin, xmax := math.Inf(1), math.Inf(-1)
	ymin, ymax := c.ymin, c.ymax
	fromData := ymin == 0 && ymax == 0
	for _, s := range c.series {
		for i, x := range s.xs {
			xmin, xmax = math.Min(xmin, x), math.Max(xmax, x+s.barW)
			if fromData {
				ymax = math.Max(ymax, s.ys[i])
				ymin = math.Min(ymin, s.ys[i])
			}
		}
	}
	if math.IsInf(xmin, 0) {
		xmin, xmax = 0, 1
	}
	if xmax <= xmin {
		xmax = xmin + 1
	}
	if ymax <= ymin {
		ymax = ymin + 1
	}
	if fromData {
		ymax *= 1.08
	}
	px := func(x float64) float64 { return padL + (x-xmin)/(xmax-xmin)*plotW }
	py := func(y float64) float64 { return padT + plotH - (y-ymin)/(ymax-ymin)*plotH }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" %s>`+"\n", chartW, chartH, chartW, chartH, svgFont)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#fff"/>`+"\n", chartW, chartH)
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="15" font-weight="bold">%s</text>`+"\n", padL, html.EscapeString(c.title))
	// Axes, grid and ticks.
	for _, t := range ticks(ymin, ymax, 5) {
		y := py(t)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", padL, y, padL+plotW, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", padL-6, y+4, num(t))
	}
	for _, t := range ticks(xmin, xmax, 8) {
		x := px(t)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#999"/>`+"\n", x, padT+plotH, x, padT+plotH+4)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, padT+plotH+17, num(t))
	}
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`+"\n", padL, padT+plotH, padL+plotW, padT+plotH)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`+"\n", padL, padT, padL, padT+plotH)
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">%s</text>`+"\n", padL+plotW/2, chartH-6, html.EscapeString(c.xlabel))
	fmt.Fprintf(&b, `<text transform="translate(14 %d) rotate(-90)" text-anchor="middle">%s</text>`+"\n", padT+plotH/2, html.EscapeString(c.ylabel))
	for i, s := range c.series {
		if s.bars {
			for j, x := range s.xs {
				x0, x1 := px(x), px(x+s.barW)
				y := py(math.Max(ymin, math.Min(ymax, s.ys[j])))
				fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" fill-opacity="0.75"/>`+"\n",
					x0+1, y, math.Max(0.5, x1-x0-2), py(math.Max(ymin, 0))-y, s.color)
			}
		} else {
			var pts []string
			step := max(1, len(s.xs)/maxPointsPerLine)
			for j := 0; j < len(s.xs); j += step {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(s.xs[j]), py(math.Max(ymin, math.Min(ymax, s.ys[j])))))
			}
			dash := ""
			if s.dash {
				dash = ` stroke-dasharray="6 4"`
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", s.color, dash, strings.Join(pts, " "))
		}
		// Legend.
		ly := padT + 8 + i*18
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="14" height="10" fill="%s"/>`+"\n", padL+plotW+14, ly-9, s.color)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", padL+plotW+34, ly, html.EscapeString(s.name))
	}
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

func num(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e9 {
		return fmt.Sprintf("%d", int64(v))
	}
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.3f", v), "0"), ".")
}

// charts draws the report's three charts.
func (r *Report) charts() (admitted, shares, over chart) {
	wmin := r.Window.Minutes()
	admitted = chart{title: fmt.Sprintf("%s (%s): admitted per window vs the limit", r.Scenario, r.Mode),
		xlabel: "virtual time (minutes)", ylabel: "requests per window"}
	over = chart{title: fmt.Sprintf("%s (%s): over-admission per window", r.Scenario, r.Mode),
		xlabel: "virtual time (minutes)", ylabel: "% of the limit", ymin: 0, ymax: 5}
	adm := series{name: "admitted (busiest counter)", color: palette[0], bars: true, barW: wmin}
	lim := series{name: "limit", color: "#d62728", dash: true}
	ov := series{name: "over-admitted", color: "#d62728", bars: true, barW: wmin}
	for _, w := range r.Windows {
		x := w.Start.Minutes()
		adm.xs, adm.ys = append(adm.xs, x), append(adm.ys, float64(w.Admitted))
		lim.xs, lim.ys = append(lim.xs, x, x+wmin), append(lim.ys, float64(r.Limit), float64(r.Limit))
		ov.xs, ov.ys = append(ov.xs, x), append(ov.ys, w.OverPct(r.Limit))
		over.ymax = math.Max(over.ymax, math.Ceil(w.OverPct(r.Limit)*1.1))
	}
	admitted.series = []series{adm, lim}
	over.series = []series{ov}
	if r.Mode == "elastic" && len(r.Windows) > 0 {
		first, last := r.Windows[0].Start.Minutes(), r.Windows[len(r.Windows)-1].Start.Minutes()+wmin
		over.series = append(over.series, series{name: fmt.Sprintf("elastic bound (%g%%)", r.ElasticBound), color: "#7f7f7f", dash: true,
			xs: []float64{first, last}, ys: []float64{r.ElasticBound, r.ElasticBound}})
		over.ymax = math.Max(over.ymax, math.Ceil(r.ElasticBound*1.1))
	}
	shares = chart{title: fmt.Sprintf("%s (%s): what each region may admit (its share)", r.Scenario, r.Mode),
		xlabel: "virtual time (minutes)", ylabel: "fraction of the limit", ymin: 0, ymax: 1}
	for i, name := range r.Regions {
		s := series{name: name, color: palette[i%len(palette)]}
		for _, smp := range r.Samples {
			s.xs, s.ys = append(s.xs, smp.At.Minutes()), append(s.ys, smp.Shares[i])
		}
		shares.series = append(shares.series, s)
	}
	maxShare := 0.0
	for _, smp := range r.Samples {
		for _, v := range smp.Shares {
			maxShare = math.Max(maxShare, v)
		}
	}
	shares.ymax = math.Min(1, math.Ceil(maxShare*11)/10)
	return admitted, shares, over
}

// WriteFiles writes the report into dir: windows.csv, report.txt, the
// charts as SVG, shares.csv (every region's share at each sample) and
// index.html that shows them, under a name prefix
// (scenario-mode-).
func (r *Report) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	prefix := filepath.Join(dir, r.Scenario+"-"+r.Mode+"-")
	var text, csvb strings.Builder
	if err := r.WriteText(&text); err != nil {
		return err
	}
	if err := r.WriteCSV(&csvb); err != nil {
		return err
	}
	adm, sh, ov := r.charts()
	files := map[string]string{
		"report.txt":   text.String(),
		"windows.csv":  csvb.String(),
		"shares.csv":   r.sharesCSV(),
		"admitted.svg": adm.svg(),
		"shares.svg":   sh.svg(),
		"over.svg":     ov.svg(),
	}
	var page strings.Builder
	fmt.Fprintf(&page, `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>%[1]s (%[2]s), seed %[3]d</title>
<style>body{font-family:sans-serif;margin:2em;max-width:1000px}pre{background:#f6f6f6;padding:1em;overflow-x:auto;font-size:12px}figure{margin:1.5em 0}</style>
</head><body>
<h1>Scenario %[1]s, %[2]s mode, seed %[3]d</h1>
<p>%[4]s</p>
`, html.EscapeString(r.Scenario), r.Mode, r.Seed, html.EscapeString(r.Description))
	for _, c := range []chart{adm, sh, ov} {
		fmt.Fprintf(&page, "<figure>\n%s</figure>\n", c.svg())
	}
	fmt.Fprintf(&page, "<h2>Windows</h2>\n<pre>%s</pre>\n<p>Data: <a href=\"%s\">%s</a></p>\n</body></html>\n",
		html.EscapeString(text.String()), filepath.Base(prefix)+"windows.csv", filepath.Base(prefix)+"windows.csv")
	files["index.html"] = page.String()
	for name, content := range files {
		if err := os.WriteFile(prefix+name, []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// sharesCSV writes every sample: its time in seconds, then each region's
// share of the limit.
func (r *Report) sharesCSV() string {
	var b strings.Builder
	b.WriteString("at_s")
	for _, name := range r.Regions {
		b.WriteString("," + name)
	}
	b.WriteString("\n")
	for _, smp := range r.Samples {
		fmt.Fprintf(&b, "%.3f", smp.At.Seconds())
		for _, sh := range smp.Shares {
			fmt.Fprintf(&b, ",%.4f", sh)
		}
		b.WriteString("\n")
	}
	return b.String()
}
