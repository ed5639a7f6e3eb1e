package sim

import (
	"errors"
	"fmt"
	"html"
	"os"
	"path/filepath"
	"strings"

	"github.com/geoquota/geoquota/regional"
)

// WriteFiles writes the report into dir, under a name prefix
// (scenario-mode-): report.txt, windows.csv (a row per window),
// shares.csv (every region's share at each sample), the charts of the
// busiest counter against the limit, of over-admission and of the shares
// as SVG, and index.html, a page of the report alone.
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
	files := map[string]string{
		"report.txt":  text.String(),
		"windows.csv": csvb.String(),
		"shares.csv":  r.sharesCSV(),
		"index.html":  page([]*Report{r}),
	}
	for _, f := range figures([]*Report{r}) {
		if f.file != "" {
			files[f.file] = f.charts[0].svg()
		}
	}
	for name, content := range files {
		if err := os.WriteFile(prefix+name, []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// WritePage writes dir/SCENARIO-index.html: one page that sets reports of
// the same scenario and seed side by side, a column each (a mode each),
// and links the files WriteFiles writes of each. It returns the page's
// path.
func WritePage(dir string, reps ...*Report) (string, error) {
	if len(reps) == 0 {
		return "", errors.New("sim: no report to write a page of")
	}
	for _, r := range reps[1:] {
		if r.Scenario != reps[0].Scenario || r.Seed != reps[0].Seed || !slicesEqual(r.Regions, reps[0].Regions) {
			return "", fmt.Errorf("sim: a page of scenario %s, seed %d cannot show scenario %s, seed %d", reps[0].Scenario, reps[0].Seed, r.Scenario, r.Seed)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, reps[0].Scenario+"-index.html")
	return path, os.WriteFile(path, []byte(page(reps)), 0o644)
}

func slicesEqual(a, b []string) bool { return strings.Join(a, "\x00") == strings.Join(b, "\x00") }

// modeWords says what each mode does, under its column's heading.
var modeWords = map[string]string{
	"strict":  "a region admits only within its allowance (its lease, or its floor): never over the limit",
	"elastic": "a region may also borrow the slack it sees while it hears from every other region: up to a bound over the limit",
}

const pageStyle = `
body{font-family:"DejaVu Sans",Arial,Helvetica,sans-serif;color:#1d1d1d;margin:0 auto;padding:20px 28px 40px;max-width:1420px;line-height:1.45;font-size:15px}
h1{font-size:25px;margin:0 0 6px}
h2{font-size:19px;margin:30px 0 10px;padding-bottom:4px;border-bottom:1px solid #d8d8d8}
h3{font-size:17px;margin:0 0 2px}
p{margin:6px 0;max-width:1050px}
.setup{color:#444}
.faults{list-style:none;padding:0;margin:6px 0}
.faults li{margin:3px 0}
.key{white-space:nowrap}
.swatch{display:inline-block;width:14px;height:11px;margin-right:6px;vertical-align:baseline;border:1px solid rgba(0,0,0,.35)}
.instant{display:inline-block;width:0;height:13px;margin:0 12px 0 6px;border-left:2px dashed;vertical-align:text-bottom}
table{border-collapse:collapse;margin:8px 0}
th,td{padding:5px 12px;border-bottom:1px solid #e3e3e3;text-align:right;vertical-align:top}
th{background:#f3f3f3;font-weight:bold}
th:first-child,td:first-child{text-align:left}
tbody th{background:none;font-weight:normal;text-align:left}
td.worst{font-weight:bold}
.regions td:nth-child(3n+2),.regions th.mode,.regions thead tr+tr th:nth-child(3n+1){border-left:2px solid #d0d0d0}
.outcomes td{border-left:2px solid #e3e3e3}
sup{font-size:11px}
.notes{font-size:13.5px;color:#333;max-width:1050px;margin-top:6px}
.notes p{margin:4px 0}
.grid{display:grid;gap:14px 26px;align-items:start}
.grid svg{width:100%;height:auto;display:block;border:1px solid #ececec}
.colhead{border-bottom:2px solid #444;padding-bottom:4px}
.colhead p{margin:0;color:#444;font-size:14px}
pre{background:#f6f6f6;padding:12px;font-size:12.5px;white-space:pre-wrap;overflow-wrap:anywhere;max-width:1360px}
`

// page is an HTML page of reports of one scenario and seed, a column each.
func page(reps []*Report) string {
	r0 := reps[0]
	var modes []string
	for _, r := range reps {
		modes = append(modes, r.Mode)
	}
	var b strings.Builder
	title := fmt.Sprintf("Scenario %s, %s mode, seed %d", r0.Scenario, r0.Mode, r0.Seed)
	if len(reps) > 1 {
		title = fmt.Sprintf("Scenario %s, seed %d: %s side by side", r0.Scenario, r0.Seed, strings.Join(modes, " and "))
	}
	cols := fmt.Sprintf("repeat(%d,minmax(0,1fr))", len(reps))
	width := ""
	if len(reps) == 1 {
		width = "max-width:760px;"
	}
	fmt.Fprintf(&b, `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>%s</title>
<style>%s.grid{grid-template-columns:%s;%s}</style>
</head><body>
<h1>%s</h1>
`, html.EscapeString(title), pageStyle, cols, width, html.EscapeString(title))
	if r0.Description != "" {
		fmt.Fprintf(&b, "<p>%s</p>\n", html.EscapeString(strings.Join(strings.Fields(r0.Description), " ")))
	}
	fmt.Fprintf(&b, `<p class="setup">%d regions (%s); one global limit of %s per %s window (%s), one counter per API key; %s of virtual time; gossip every %v; links %v to %v one way.</p>`+"\n",
		len(r0.Regions), strings.Join(r0.Regions, ", "), group(r0.Limit), regional.ShortDuration(r0.Window), strings.ReplaceAll(r0.Algorithm, "_", " "),
		regional.ShortDuration(r0.Duration), r0.Gossip, r0.Latency[0].Round(1e6), r0.Latency[1].Round(1e6))

	b.WriteString("<h2>Faults</h2>\n")
	if len(r0.Faults) == 0 {
		b.WriteString("<p>None: the scenario runs without faults.</p>\n")
	} else {
		b.WriteString(`<ul class="faults">` + "\n")
		for _, f := range r0.Faults {
			mark := fmt.Sprintf(`<span class="swatch" style="background:%s"></span>`, faultColor(f.Kind))
			if f.To == f.From {
				mark = fmt.Sprintf(`<span class="instant" style="border-color:%s"></span>`, faultColor(f.Kind))
			}
			fmt.Fprintf(&b, "<li>%s<b>%s</b>: %s</li>\n", mark, spanString(f.From, f.To), html.EscapeString(f.What))
		}
		b.WriteString("</ul>\n<p>Every chart below shades them at their times.</p>\n")
	}

	b.WriteString("<h2>Outcomes</h2>\n")
	writeOutcomes(&b, reps)
	b.WriteString("<h2>By region</h2>\n")
	writeRegions(&b, reps)

	figs := figures(reps)
	colHeads := func() {
		for _, r := range reps {
			words := modeWords[r.Mode]
			if r.Unit != "" {
				words += "; what is counted after an answer (its tokens, or what it used past its estimate) may go past it"
			}
			fmt.Fprintf(&b, `<div class="colhead"><h3>%s</h3><p>%s</p></div>`+"\n", r.Mode, html.EscapeString(words))
		}
	}
	nreg := len(r0.Regions)
	fmt.Fprintf(&b, "<h2>Each region over time</h2>\n<p>A bar per %s window. Its outline is the region's demand (what callers asked); inside, from the bottom: "+
		`<span class="key"><span class="swatch" style="background:%s"></span>admitted</span>, <span class="key"><span class="swatch" style="background:%s"></span>false rejections<sup>1</sup></span>, `+
		`<span class="key"><span class="swatch" style="background:%s"></span>refused beyond the limit</span> (a perfect global limiter would have refused them too). `+
		"Paler bars: windows the run covers in part. Hover over a bar for its figures.</p>\n",
		regional.ShortDuration(r0.Window), colorAdmitted, colorFalse, colorRefused)
	b.WriteString(`<div class="grid">` + "\n")
	colHeads()
	for _, f := range figs[:nreg] {
		for _, c := range f.charts {
			fmt.Fprintf(&b, "<figure style=\"margin:0\">\n%s</figure>\n", c.svg())
		}
	}
	b.WriteString("</div>\n")
	b.WriteString("<h2>The limit over time</h2>\n<p>The busiest counter's admissions against the limit, how far over it any counter went, " +
		"and what each region may admit (its share of the limit: its lease, or its floor). Leases are given alike in both modes, so the shares look alike; " +
		"what an elastic region borrows beyond its share shows in what it admitted, not in its share.</p>\n")
	b.WriteString(`<div class="grid">` + "\n")
	colHeads()
	for _, f := range figs[nreg:] {
		for _, c := range f.charts {
			fmt.Fprintf(&b, "<figure style=\"margin:0\">\n%s</figure>\n", c.svg())
		}
	}
	b.WriteString("</div>\n")

	b.WriteString("<h2>Windows</h2>\n")
	for _, r := range reps {
		var text strings.Builder
		r.WriteText(&text)
		prefix := r.Scenario + "-" + r.Mode + "-"
		fmt.Fprintf(&b, "<h3>%s</h3>\n<pre>%s</pre>\n<p>Data: <a href=\"%[3]swindows.csv\">%[3]swindows.csv</a>, <a href=\"%[3]sshares.csv\">%[3]sshares.csv</a></p>\n",
			r.Mode, html.EscapeString(text.String()), html.EscapeString(prefix))
	}
	b.WriteString("</body></html>\n")
	return b.String()
}

// regionTotals is what became of a region's requests over a run.
type regionTotals struct {
	requests, admitted, falseRej int64
	split                        bool // falseRej is known
}

func (r *Report) byRegion() []regionTotals {
	out := make([]regionTotals, len(r.Regions))
	for i := range out {
		out[i].split = true
	}
	for _, w := range r.Windows {
		for i := range out {
			if i < len(w.RequestsByRegion) {
				out[i].requests += w.RequestsByRegion[i]
			}
			if i < len(w.ByRegion) {
				out[i].admitted += w.ByRegion[i]
			}
			if i < len(w.FalseRejectedByRegion) {
				out[i].falseRej += w.FalseRejectedByRegion[i]
			} else {
				out[i].split = false
			}
		}
	}
	return out
}

// worstRegion is the region whose demand was refused falsely the most,
// in proportion, or -1 if none was.
func (r *Report) worstRegion() int {
	worst, pc := -1, 0.0
	for i, t := range r.byRegion() {
		if p := pct(t.falseRej, t.requests); t.split && t.falseRej > 0 && p > pc {
			worst, pc = i, p
		}
	}
	return worst
}

// outcomeRow is a row of the outcomes table: its name, and its cell for a
// report. compare marks the rows the scenarios' comparison shows too.
type outcomeRow struct {
	name    string
	compare bool
	cell    func(r *Report) string
}

// outcomeRows are the rows of the outcomes table, in order.
var outcomeRows = []outcomeRow{
	{"Demand (asked)", false, func(r *Report) string { return group(r.Requests) + " " + r.units() }},
	{"Admitted", true, func(r *Report) string {
		return fmt.Sprintf("%s (%.1f%% of demand)", group(r.Admitted), pct(r.Admitted, r.Requests))
	}},
	{"False rejections<sup>1</sup>", true, func(r *Report) string {
		return fmt.Sprintf("%s (%.2f%% of demand)", group(r.FalseRejected), pct(r.FalseRejected, r.Requests))
	}},
	{"Region refused falsely the most<sup>1</sup>", true, func(r *Report) string {
		i := r.worstRegion()
		if i < 0 {
			if len(r.Windows) > 0 && r.Windows[0].FalseRejectedByRegion == nil {
				return "not known"
			}
			return "none"
		}
		t := r.byRegion()[i]
		return fmt.Sprintf("%s: %s (%.2f%% of its demand)", html.EscapeString(r.Regions[i]), group(t.falseRej), pct(t.falseRej, t.requests))
	}},
	{"Window refused falsely the most<sup>1</sup>", false, func(r *Report) string {
		worst := r.worstWindow(func(w *Window) int64 { return w.FalseRejected })
		if worst < 0 {
			return "none"
		}
		w := r.Windows[worst]
		return fmt.Sprintf("%s: %s (%.2f%% of its %s)", r.windowString(w), group(w.FalseRejected), w.FalseRejPct(), r.units())
	}},
	{"Over-admission, worst window<sup>2</sup>", true, func(r *Report) string {
		worst := r.worstWindow(func(w *Window) int64 { return w.Over })
		if worst < 0 {
			return "none"
		}
		w := r.Windows[worst]
		return fmt.Sprintf("%.2f%% of the limit (%s)", w.OverPct(r.Limit), r.windowString(w))
	}},
	{"Over-admission allowed", false, func(r *Report) string {
		switch {
		case r.Mode == "elastic":
			return fmt.Sprintf("up to %g%% of the limit", r.ElasticBound)
		case r.StrictBound > 0:
			return fmt.Sprintf("up to %g%% of the limit (what is counted after the answers)", r.StrictBound)
		}
		return "none"
	}},
	{"Over-admitted in all<sup>2</sup>", true, func(r *Report) string {
		var over int64
		n := 0
		for _, w := range r.Windows {
			over += w.OverTotal
			if w.Over > 0 {
				n++
			}
		}
		return fmt.Sprintf("%s in %d of %d windows", group(over), n, len(r.Windows))
	}},
	{"Busiest counter, least admitted in a full window<sup>3</sup>", true, func(r *Report) string {
		least := -1
		for i, w := range r.Windows {
			if w.Full && (least < 0 || w.Admitted < r.Windows[least].Admitted) {
				least = i
			}
		}
		if least < 0 {
			return "no full window"
		}
		w := r.Windows[least]
		return fmt.Sprintf("%.1f%% of the limit (%s)", 100*w.Utilization(r.Limit), r.windowString(w))
	}},
	{"Copies agreed after a heal", true, func(r *Report) string {
		if len(r.Heals) == 0 {
			return "no heal"
		}
		var parts []string
		for _, h := range r.Heals {
			if h.Converged < 0 {
				parts = append(parts, fmt.Sprintf("not within a minute of %s", timeString(h.At)))
			} else {
				parts = append(parts, fmt.Sprintf("%v after the heal at %s", h.Converged, timeString(h.At)))
			}
		}
		return strings.Join(parts, "; ")
	}},
	{"Lease expiries", false, func(r *Report) string {
		if r.Live {
			return "not seen live"
		}
		if len(r.Expiries) == 0 {
			return "none"
		}
		var parts []string
		for _, e := range r.Expiries {
			parts = append(parts, fmt.Sprintf("%s at %s", html.EscapeString(e.Region), timeString(e.At)))
		}
		return strings.Join(parts, ", ")
	}},
	{"Over-admission globalsync found<sup>4</sup>", false, func(r *Report) string {
		var found int64
		for _, f := range r.Found {
			found += f.Amount
		}
		if r.BooksClosed <= 0 {
			return "no window's books closed"
		}
		return fmt.Sprintf("%s (windows that ended by %s)", group(found), timeString(r.BooksClosed))
	}},
	{"Messages cut / lost", false, func(r *Report) string {
		if r.Live {
			return "not seen live"
		}
		return group(r.MessagesCut) + " / " + group(r.MessagesLost)
	}},
}

// writeOutcomes writes the table of a run's outcomes, a column per
// report, and its notes.
func writeOutcomes(b *strings.Builder, reps []*Report) {
	b.WriteString(`<table class="outcomes"><thead><tr><th></th>`)
	for _, r := range reps {
		fmt.Fprintf(b, "<th>%s</th>", r.Mode)
	}
	b.WriteString("</tr></thead><tbody>\n")
	for _, row := range outcomeRows {
		fmt.Fprintf(b, "<tr><th>%s</th>", row.name)
		for _, r := range reps {
			fmt.Fprintf(b, "<td>%s</td>", row.cell(r))
		}
		b.WriteString("</tr>\n")
	}
	b.WriteString("</tbody></table>\n")
	writeOutcomeNotes(b, fmt.Sprintf(" (%s)", group(reps[0].Limit)))
}

// writeOutcomeNotes writes the notes of the outcomes' table; limit, if
// not empty, names the limit.
func writeOutcomeNotes(b *strings.Builder, limit string) {
	fmt.Fprintf(b, `<div class="notes">
<p><sup>1</sup> A false rejection is a request refused while its counter still had room in the window: one that a perfect global limiter (one exact count, no delay between regions) would have admitted. In each window, each counter's false rejections are its denials up to the part of the limit it left unused; a region's part of them is in proportion to the requests of that counter it refused.</p>
<p><sup>2</sup> Over-admission is what a counter admitted in a window beyond the limit%s, as a percentage of the limit; the worst counter of the window counts.</p>
<p><sup>3</sup> The busiest counter is the one that admitted most in the window; a full window is one the run covers whole. Below 100%% is room left unused, a loss only where demand exceeded the limit.</p>
<p><sup>4</sup> What globalsync, closing the books of each window, found admitted over the limit.</p>
</div>
`, limit)
}

// WriteComparison writes dir/index.html: a table of the outcomes of
// several scenarios of one seed, a row per scenario and mode, each
// linking the scenario's page (WritePage). runs holds each scenario's
// reports. It returns the page's path.
func WriteComparison(dir string, runs ...[]*Report) (string, error) {
	if len(runs) == 0 {
		return "", errors.New("sim: no scenario to compare")
	}
	var b strings.Builder
	title := fmt.Sprintf("%d scenarios compared, seed %d", len(runs), runs[0][0].Seed)
	fmt.Fprintf(&b, `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>%s</title>
<style>%s.outcomes .txt{text-align:left;vertical-align:top}</style>
</head><body>
<h1>%s</h1>
<p>Each scenario's outcomes in each mode it runs; the scenario's name leads to its page, with its charts.</p>
<table class="outcomes compare"><thead><tr><th class="txt">scenario</th><th class="txt">mode</th><th class="txt">faults</th>`, html.EscapeString(title), pageStyle, html.EscapeString(title))
	for _, row := range outcomeRows {
		if row.compare {
			fmt.Fprintf(&b, "<th>%s</th>", row.name)
		}
	}
	b.WriteString("</tr></thead><tbody>\n")
	for _, reps := range runs {
		for i, r := range reps {
			b.WriteString("<tr>")
			if i == 0 {
				var faults []string
				for _, f := range r.Faults {
					faults = append(faults, spanString(f.From, f.To)+": "+f.What)
				}
				if len(faults) == 0 {
					faults = []string{"none"}
				}
				fmt.Fprintf(&b, `<th class="txt" rowspan="%d"><a href="%s">%s</a></th>`, len(reps), html.EscapeString(r.Scenario+"-index.html"), html.EscapeString(r.Scenario))
				fmt.Fprintf(&b, `<td class="txt">%s</td>`, r.Mode)
				fmt.Fprintf(&b, `<td class="txt" rowspan="%d">%s</td>`, len(reps), html.EscapeString(strings.Join(faults, "; ")))
			} else {
				fmt.Fprintf(&b, `<td class="txt">%s</td>`, r.Mode)
			}
			for _, row := range outcomeRows {
				if row.compare {
					fmt.Fprintf(&b, "<td>%s</td>", row.cell(r))
				}
			}
			b.WriteString("</tr>\n")
		}
	}
	b.WriteString("</tbody></table>\n")
	writeOutcomeNotes(&b, "")
	b.WriteString("</body></html>\n")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, "index.html")
	return path, os.WriteFile(path, []byte(b.String()), 0o644)
}

// writeRegions writes what became of each region's demand over the run,
// a group of columns per report.
func writeRegions(b *strings.Builder, reps []*Report) {
	b.WriteString(`<table class="regions"><thead><tr><th rowspan="2">region</th>`)
	for _, r := range reps {
		fmt.Fprintf(b, `<th class="mode" colspan="3" style="text-align:center">%s</th>`, r.Mode)
	}
	b.WriteString("</tr><tr>")
	for range reps {
		b.WriteString("<th>demand</th><th>admitted</th><th>false rejections<sup>1</sup></th>")
	}
	b.WriteString("</tr></thead><tbody>\n")
	totals := make([][]regionTotals, len(reps))
	worst := make([]int, len(reps))
	for j, r := range reps {
		totals[j], worst[j] = r.byRegion(), r.worstRegion()
	}
	for i, name := range reps[0].Regions {
		fmt.Fprintf(b, `<tr><th><span class="swatch" style="background:%s"></span>%s</th>`, palette[i%len(palette)], html.EscapeString(name))
		for j := range reps {
			t := totals[j][i]
			fr := "not known"
			if t.split {
				fr = fmt.Sprintf("%s (%.2f%%)", group(t.falseRej), pct(t.falseRej, t.requests))
			}
			class := ""
			if worst[j] == i {
				class = ` class="worst"`
			}
			fmt.Fprintf(b, "<td>%s</td><td>%s (%.1f%%)</td><td%s>%s</td>", group(t.requests), group(t.admitted), pct(t.admitted, t.requests), class, fr)
		}
		b.WriteString("</tr>\n")
	}
	b.WriteString("</tbody></table>\n<p class=\"notes\">Percentages are of the region's demand; the region refused falsely the most, in proportion, is in bold.</p>\n")
}

// worstWindow is the index of the first window with the most of what by
// counts, or -1 if none counts any.
func (r *Report) worstWindow(by func(*Window) int64) int {
	worst := -1
	for i := range r.Windows {
		if n := by(&r.Windows[i]); n > 0 && (worst < 0 || n > by(&r.Windows[worst])) {
			worst = i
		}
	}
	return worst
}
