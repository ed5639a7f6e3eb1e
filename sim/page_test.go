package sim

import (
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// smallScenario: two regions far under their limit together, b cut off
// from 1:00 to 2:00. Cut off, b falls to its floor once its lease lapses
// and refuses most of its demand, though the counter is far from its
// limit: every one of those refusals is false; a refuses nothing.
const smallScenario = `name: small
duration: 3m
regions: [a, b]
rule: { limit: 600, window: 1m }
traffic:
  - { region: a, kind: steady, rate: 1 }
  - { region: b, kind: steady, rate: 4 }
faults:
  - { at: 1m, kind: partition, regions: [b] }
  - { at: 2m, kind: heal }
`

// runSmall runs the small scenario in both modes.
func runSmall(t *testing.T) []*Report {
	t.Helper()
	sc, err := Parse("small.yaml", []byte(smallScenario))
	if err != nil {
		t.Fatal(err)
	}
	var reps []*Report
	for _, mode := range []string{"strict", "elastic"} {
		rep, err := Run(sc, mode, 1, Options{})
		if err != nil {
			t.Fatal(err)
		}
		reps = append(reps, rep)
	}
	return reps
}

// TestRegionFigures: every window's demand, admissions and false
// rejections by region add up to the window's, and land where the story
// says: the cut-off region's refusals while the counter had room are all
// false, the other region's demand all admitted.
func TestRegionFigures(t *testing.T) {
	for _, rep := range runSmall(t) {
		if len(rep.Windows) != 3 {
			t.Fatalf("%s: %d windows, want 3", rep.Mode, len(rep.Windows))
		}
		for _, w := range rep.Windows {
			var req, adm, fr int64
			for i := range rep.Regions {
				req, adm, fr = req+w.RequestsByRegion[i], adm+w.ByRegion[i], fr+w.FalseRejectedByRegion[i]
				if w.ByRegion[i]+w.FalseRejectedByRegion[i] > w.RequestsByRegion[i] {
					t.Errorf("%s %s: region %s admitted %d and refused %d falsely of %d asked", rep.Mode, clockString(w.Start), rep.Regions[i],
						w.ByRegion[i], w.FalseRejectedByRegion[i], w.RequestsByRegion[i])
				}
			}
			if req != w.Requests || adm != w.Admitted || fr != w.FalseRejected {
				t.Errorf("%s %s: regions sum to %d asked, %d admitted, %d false; the window has %d, %d, %d", rep.Mode, clockString(w.Start),
					req, adm, fr, w.Requests, w.Admitted, w.FalseRejected)
			}
		}
		cut := rep.Windows[1]
		a, b := 0, 1
		switch {
		case cut.RequestsByRegion[a] < 30 || cut.RequestsByRegion[b] < 160:
			t.Errorf("%s: demand in the cut's window a %d, b %d: want about 60 and 240", rep.Mode, cut.RequestsByRegion[a], cut.RequestsByRegion[b])
		case cut.ByRegion[a] != cut.RequestsByRegion[a] || cut.FalseRejectedByRegion[a] != 0:
			t.Errorf("%s: a admitted %d of %d, %d falsely refused: want all admitted", rep.Mode, cut.ByRegion[a], cut.RequestsByRegion[a], cut.FalseRejectedByRegion[a])
		case cut.FalseRejectedByRegion[b] == 0 || cut.FalseRejectedByRegion[b] != cut.RequestsByRegion[b]-cut.ByRegion[b]:
			t.Errorf("%s: b refused %d of %d, %d of them falsely: want every refusal false", rep.Mode,
				cut.RequestsByRegion[b]-cut.ByRegion[b], cut.RequestsByRegion[b], cut.FalseRejectedByRegion[b])
		}
	}
}

// TestApportion: the parts sum to the total, each within one of its
// share, the larger fractions first.
func TestApportion(t *testing.T) {
	for _, c := range []struct {
		total int64
		parts []float64
		want  []int64
	}{
		{10, []float64{5, 5}, []int64{5, 5}},
		{10, []float64{3.4, 3.3, 3.3}, []int64{4, 3, 3}},
		{1, []float64{0.5, 0.5}, []int64{1, 0}},
		{3, []float64{0.2, 2.1, 0.7}, []int64{0, 2, 1}},
		{0, []float64{0, 0}, []int64{0, 0}},
		{7, []float64{6.999999999, 0}, []int64{7, 0}},
	} {
		if got := apportion(c.total, c.parts); !slices.Equal(got, c.want) {
			t.Errorf("apportion(%d, %v) = %v, want %v", c.total, c.parts, got, c.want)
		}
	}
}

// TestFaultsOf: a partition or a split lasts until the next heal, or the
// end; faults due after the end do not happen.
func TestFaultsOf(t *testing.T) {
	sc, err := Parse("faults.yaml", []byte(`name: faults
duration: 10m
regions: [a, b, c]
rule: { limit: 10, window: 1m }
traffic: [{ region: a, kind: steady, rate: 1 }]
faults:
  - { at: 1m, kind: partition, regions: [a, b] }
  - { at: 3m, kind: heal }
  - { at: 4m, kind: split, groups: [[a], [b, c]] }
  - { at: 2m, kind: redis-down, region: c, for: 20s }
  - { at: 5m, kind: clock-jump, region: b, by: -300ms }
  - { at: 7m, kind: globalsync-down, for: 5m }
  - { at: 9m, kind: redis-down, region: a, for: 10s }
`))
	if err != nil {
		t.Fatal(err)
	}
	m := time.Minute
	got := FaultsOf(sc, 8*m)
	want := []Fault{
		{"partition", "a, b cut off", m, 3 * m},
		{"redis-down", "c's Redis down", 2 * m, 2*m + 20*time.Second},
		{"split", "split: a | b c", 4 * m, 8 * m},
		{"clock-jump", "b's clock jumps -300ms", 5 * m, 5 * m},
		{"globalsync-down", "globalsync down", 7 * m, 8 * m},
	}
	if !slices.Equal(got, want) {
		t.Errorf("FaultsOf:\n got %v\nwant %v", got, want)
	}
}

// TestTimeAxis: ticks on round steps, labelled with the unit the axis
// names.
func TestTimeAxis(t *testing.T) {
	labels := func(end float64, n int) string {
		ts, unit := timeTicks(end, n)
		var out []string
		for _, x := range ts {
			out = append(out, timeLabel(x, unit))
		}
		return unit + " " + strings.Join(out, " ")
	}
	for _, c := range []struct {
		end  float64
		want string
	}{
		{300, "m:ss 0:00 1:00 2:00 3:00 4:00 5:00"},
		{180, "m:ss 0:00 0:30 1:00 1:30 2:00 2:30 3:00"},
		{24*3600 + 300, "h:mm 0:00 6:00 12:00 18:00 24:00"},
		{0.3, "m:ss.s 0:00.0 0:00.1 0:00.2 0:00.3"},
	} {
		if got := labels(c.end, 7); got != c.want {
			t.Errorf("axis to %vs: %q, want %q", c.end, got, c.want)
		}
	}
	if got := spanString(0, 24*time.Hour); got != "0:00:00–24:00:00" {
		t.Errorf("a day's span: %q", got)
	}
	if got := spanString(90*time.Second, 90*time.Second); got != "at 1:30" {
		t.Errorf("an instant: %q", got)
	}
}

// svgChart is what a test reads back of a chart on a page.
type svgChart struct {
	title  string
	bars   map[string]map[float64]float64 // series → start (s) → value
	faults []svgFault
	ticks  map[float64]float64 // time (s) → x
}

type svgFault struct {
	kind                string
	from, to, x0, width float64
}

// readCharts parses every chart of a page.
func readCharts(t *testing.T, page string) []svgChart {
	t.Helper()
	var out []svgChart
	for _, chunk := range regexp.MustCompile(`(?s)<svg .*?</svg>`).FindAllString(page, -1) {
		c := svgChart{bars: map[string]map[float64]float64{}, ticks: map[float64]float64{}}
		dec := xml.NewDecoder(strings.NewReader(chunk))
		inTitle := false
		for {
			tok, err := dec.Token()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("a chart is not well-formed: %v", err)
			}
			switch e := tok.(type) {
			case xml.StartElement:
				attr := map[string]string{}
				for _, a := range e.Attr {
					attr[a.Name.Local] = a.Value
				}
				f := func(name string) float64 {
					v, err := strconv.ParseFloat(attr[name], 64)
					if err != nil {
						t.Fatalf("%s %s=%q: %v", e.Name.Local, name, attr[name], err)
					}
					return v
				}
				switch {
				case e.Name.Local == "text" && attr["font-weight"] == "bold":
					inTitle = true
				case e.Name.Local == "text" && attr["class"] == "tick":
					c.ticks[f("data-t")] = f("x")
				case attr["class"] == "bar":
					s := attr["data-series"]
					if c.bars[s] == nil {
						c.bars[s] = map[float64]float64{}
					}
					c.bars[s][f("data-t")] = f("data-v")
				case attr["class"] == "fault" && e.Name.Local == "rect":
					c.faults = append(c.faults, svgFault{attr["data-kind"], f("data-from"), f("data-to"), f("x"), f("width")})
				case attr["class"] == "fault":
					c.faults = append(c.faults, svgFault{attr["data-kind"], f("data-from"), f("data-to"), f("x1"), 0})
				}
			case xml.CharData:
				if inTitle {
					c.title += string(e)
				}
			case xml.EndElement:
				inTitle = false
			}
		}
		out = append(out, c)
	}
	return out
}

// TestPageSideBySide: one page holds both modes of the small scenario:
// each region's demand, admissions and false rejections per window with
// their values, the cut shaded at its times on every chart, and the
// table of outcomes of both modes with its notes.
func TestPageSideBySide(t *testing.T) {
	reps := runSmall(t)
	dir := t.TempDir()
	path, err := WritePage(dir, reps...)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(path) != "small-index.html" {
		t.Errorf("the page is %s, want small-index.html", path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	charts := readCharts(t, page)
	byTitle := map[string]svgChart{}
	for _, c := range charts {
		byTitle[c.title] = c
	}
	// A chart of each region and three of the limit, for each mode.
	if want := 2 * (2 + 3); len(charts) != want {
		t.Errorf("%d charts, want %d", len(charts), want)
	}
	for _, rep := range reps {
		for i, region := range rep.Regions {
			title := fmt.Sprintf("%s (%s): demand per window and what became of it", region, rep.Mode)
			c, ok := byTitle[title]
			if !ok {
				t.Errorf("no chart %q", title)
				continue
			}
			for _, w := range rep.Windows {
				at := w.Start.Seconds()
				for _, s := range []struct {
					series string
					want   int64
				}{{"demand", w.RequestsByRegion[i]}, {"admitted", w.ByRegion[i]}, {"false-rejected", w.FalseRejectedByRegion[i]},
					{"refused", w.RequestsByRegion[i] - w.ByRegion[i] - w.FalseRejectedByRegion[i]}} {
					if got, ok := c.bars[s.series][at]; !ok || got != float64(s.want) {
						t.Errorf("%s, window %s: %s %v (drawn %t), want %d", title, clockString(w.Start), s.series, got, ok, s.want)
					}
				}
			}
		}
		// The cut's window: b's false rejections on the chart.
		if got := byTitle["b ("+rep.Mode+"): demand per window and what became of it"].bars["false-rejected"][60]; got == 0 {
			t.Errorf("%s: b's chart shows no false rejection in the cut's window", rep.Mode)
		}
	}
	// The cut, shaded on every chart from 1:00 to 2:00, on the axis's
	// ticks of those times.
	for _, c := range charts {
		if len(c.faults) != 1 {
			t.Errorf("%q shades %d faults, want the cut", c.title, len(c.faults))
			continue
		}
		f := c.faults[0]
		x60, ok1 := c.ticks[60]
		x120, ok2 := c.ticks[120]
		if f.kind != "partition" || f.from != 60 || f.to != 120 || !ok1 || !ok2 || abs(f.x0-x60) > 0.2 || abs(f.x0+f.width-x120) > 0.2 {
			t.Errorf("%q shades %+v; want the partition from 60 s (tick at x %.1f) to 120 s (x %.1f)", c.title, f, x60, x120)
		}
		if want := []float64{0, 30, 60, 90, 120, 150, 180}; !slices.Equal(sortedKeys(c.ticks), want) {
			t.Errorf("%q: ticks at %v s, want %v", c.title, sortedKeys(c.ticks), want)
		}
	}
	for _, want := range []string{"0:00</text>", "1:30</text>", "time since the start of the run (m:ss)", "b cut off, 1:00–2:00",
		"<b>1:00–2:00</b>: b cut off", `<div class="colhead"><h3>strict</h3>`, `<div class="colhead"><h3>elastic</h3>`} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	// The table of outcomes: a column per mode, in order.
	rows := map[string][]string{}
	for _, m := range regexp.MustCompile(`<tr><th>(.*?)</th>((?:<td>.*?</td>)+)</tr>`).FindAllStringSubmatch(page, -1) {
		rows[m[1]] = regexp.MustCompile(`<td>(.*?)</td>`).FindAllString(m[2], -1)
	}
	cell := func(row string, i int) string {
		cells := rows[row]
		if i >= len(cells) {
			t.Fatalf("table row %q has %d cells, want %d", row, len(cells), len(reps))
		}
		return strings.TrimSuffix(strings.TrimPrefix(cells[i], "<td>"), "</td>")
	}
	for i, rep := range reps {
		// The region refused falsely the most, in proportion of its demand.
		asked, falseRej := make([]int64, 2), make([]int64, 2)
		for _, w := range rep.Windows {
			for r := range asked {
				asked[r] += w.RequestsByRegion[r]
				falseRej[r] += w.FalseRejectedByRegion[r]
			}
		}
		if pct(falseRej[0], asked[0]) >= pct(falseRej[1], asked[1]) {
			t.Fatalf("%s: a refused %d of %d falsely, b %d of %d: want b the worst", rep.Mode, falseRej[0], asked[0], falseRej[1], asked[1])
		}
		for row, want := range map[string]string{
			"Demand (asked)":               group(rep.Requests) + " requests",
			"Admitted":                     fmt.Sprintf("%s (%.1f%% of demand)", group(rep.Admitted), pct(rep.Admitted, rep.Requests)),
			"False rejections<sup>1</sup>": fmt.Sprintf("%s (%.2f%% of demand)", group(rep.FalseRejected), pct(rep.FalseRejected, rep.Requests)),
			"Region refused falsely the most<sup>1</sup>": fmt.Sprintf("b: %s (%.2f%% of its demand)", group(falseRej[1]), pct(falseRej[1], asked[1])),
			"Window refused falsely the most<sup>1</sup>": fmt.Sprintf("1:00–2:00: %s", group(rep.Windows[1].FalseRejected)),
			"Over-admission, worst window<sup>2</sup>":    "none",
			"Copies agreed after a heal":                  fmt.Sprintf("%v after the heal at 2:00", rep.Heals[0].Converged),
		} {
			if got := cell(row, i); !strings.HasPrefix(got, want) {
				t.Errorf("%s, %q: %q, want %q", rep.Mode, row, got, want)
			}
		}
	}
	if got, want := cell("Over-admission allowed", 0)+" / "+cell("Over-admission allowed", 1), "none / up to 2% of the limit"; got != want {
		t.Errorf("over-admission allowed: %q, want %q", got, want)
	}
	// Every note the tables call on is there, in a paragraph of its own
	// (not a fixed-width block that clips it), and the text tables wrap.
	for _, n := range regexp.MustCompile(`<sup>(\d)</sup>`).FindAllStringSubmatch(page, -1) {
		if !strings.Contains(page, "<p><sup>"+n[1]+"</sup> ") {
			t.Errorf("note %s is called on but not written", n[1])
		}
	}
	if !strings.Contains(page, "white-space:pre-wrap") || strings.Contains(page, "overflow:hidden") {
		t.Error("the text tables should wrap, not clip")
	}
	// One page, nothing fetched.
	for _, bad := range []string{"<script", "<link", "<img", "url(", "@import", "https://"} {
		if strings.Contains(page, bad) {
			t.Errorf("the page holds %q: it should load nothing", bad)
		}
	}
	if n, m := strings.Count(page, "http://"), strings.Count(page, "http://www.w3.org/2000/svg"); n != m {
		t.Errorf("the page names %d addresses besides the SVG namespace", n-m)
	}
	// A page of other scenarios together is refused.
	other := *reps[1]
	other.Scenario = "other"
	if _, err := WritePage(dir, reps[0], &other); err == nil {
		t.Error("a page of two scenarios: want an error")
	}
}

func abs(v float64) float64 { return max(v, -v) }

func sortedKeys(m map[float64]float64) []float64 {
	var out []float64
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestComparison: the comparison page has a row per scenario and mode,
// each scenario linking its page, and the compared outcomes as the
// scenario's own page shows them.
func TestComparison(t *testing.T) {
	reps := runSmall(t)
	other := make([]*Report, len(reps))
	for i, r := range reps {
		c := *r
		c.Scenario, c.Faults = "calm", nil
		other[i] = &c
	}
	dir := t.TempDir()
	path, err := WriteComparison(dir, reps, other)
	if err != nil || path != filepath.Join(dir, "index.html") {
		t.Fatalf("%s, %v", path, err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	for _, scenario := range []string{reps[0].Scenario, "calm"} {
		if !strings.Contains(page, fmt.Sprintf(`rowspan="%d"><a href="%s-index.html">%s</a>`, len(reps), scenario, scenario)) {
			t.Errorf("no row group linking %s's page", scenario)
		}
	}
	rows := strings.Count(page, "<tr>") - 1 // the heading's
	if rows != 2*len(reps) {
		t.Errorf("%d rows, want %d (a scenario and mode each)", rows, 2*len(reps))
	}
	compared := 0
	for _, row := range outcomeRows {
		if !row.compare {
			if strings.Contains(page, "<th>"+row.name+"</th>") {
				t.Errorf("%q compared, though not marked so", row.name)
			}
			continue
		}
		compared++
		if !strings.Contains(page, "<th>"+row.name+"</th>") {
			t.Errorf("no column %q", row.name)
		}
		for _, r := range reps {
			if !strings.Contains(page, "<td>"+row.cell(r)+"</td>") {
				t.Errorf("%s %s: no cell %q for %q", r.Scenario, r.Mode, row.cell(r), row.name)
			}
		}
	}
	if compared < 5 {
		t.Errorf("%d outcomes compared", compared)
	}
	if _, err := WriteComparison(dir); err == nil {
		t.Error("a comparison of nothing written")
	}
}
