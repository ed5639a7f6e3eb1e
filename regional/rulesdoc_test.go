package regional

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// rulesDoc is the reference of the rules file, which this test keeps true.
const rulesDoc = "../docs/rules.md"

// docExample is one fenced YAML block of the rules reference.
type docExample struct {
	line    int    // of the opening fence, for messages
	yaml    string // the block's text
	refused bool   // fenced ```yaml refused: Parse must fail
	want    string // what the error must contain, from the Refused: line
}

// docExamples finds the ```yaml and ```yaml refused blocks of a Markdown
// text. A refused block must be followed by a line "Refused: `text`"
// (between double backquotes when the text holds a backquote) naming part
// of the error.
func docExamples(doc string) ([]docExample, error) {
	lines := strings.Split(doc, "\n")
	var out []docExample
	for i := 0; i < len(lines); i++ {
		fence, ok := strings.CutPrefix(strings.TrimSpace(lines[i]), "```")
		if !ok {
			continue
		}
		info := strings.TrimSpace(fence)
		start := i + 1
		end := start
		for end < len(lines) && !strings.HasPrefix(strings.TrimSpace(lines[end]), "```") {
			end++
		}
		if end == len(lines) {
			return nil, fmt.Errorf("line %d: fence not closed", i+1)
		}
		i = end // past the block, whatever its language
		lang, _, _ := strings.Cut(info, " ")
		if lang != "yaml" && lang != "yml" {
			continue
		}
		ex := docExample{line: start, yaml: strings.Join(lines[start:end], "\n") + "\n"}
		switch info {
		case "yaml":
		case "yaml refused":
			ex.refused = true
			next := end + 1
			for next < len(lines) && strings.TrimSpace(lines[next]) == "" {
				next++
			}
			if next == len(lines) {
				return nil, fmt.Errorf("line %d: a refused example with no Refused: line after it", start)
			}
			want, err := refusedText(lines[next])
			if err != nil {
				return nil, fmt.Errorf("line %d: %v", next+1, err)
			}
			ex.want = want
		default:
			return nil, fmt.Errorf("line %d: fence %q: a YAML example is ```yaml (a whole rules file that loads) or ```yaml refused", start, "```"+info)
		}
		out = append(out, ex)
	}
	return out, nil
}

// refusedText returns the quoted part of a "Refused: `text`" line.
func refusedText(line string) (string, error) {
	rest, ok := strings.CutPrefix(line, "Refused: ")
	if !ok {
		return "", fmt.Errorf("want a line starting %q after a refused example, not %q", "Refused: ", line)
	}
	quote := "`"
	if strings.HasPrefix(rest, "``") {
		quote = "``"
	}
	rest, ok = strings.CutPrefix(rest, quote)
	if !ok {
		return "", fmt.Errorf("want the error's text in backquotes: %q", line)
	}
	text, _, ok := strings.Cut(rest, quote)
	if quote == "``" { // Markdown pads a span that starts or ends with a backquote
		text = strings.TrimPrefix(strings.TrimSuffix(text, " "), " ")
	}
	if !ok || text == "" {
		return "", fmt.Errorf("want the error's text in backquotes: %q", line)
	}
	return text, nil
}

// yamlFields returns the YAML fields of a spec type, and those of the types
// it holds, as paths ("rules.match.endpoint"): the fields the decoder
// accepts, since it refuses unknown ones.
func yamlFields(t reflect.Type, path string) []string {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name) // the decoder's default
		}
		where := strings.TrimPrefix(path+"."+name, ".")
		out = append(out, where)
		out = append(out, yamlFields(f.Type, where)...)
	}
	return out
}

// fieldNames returns how the doc may name a field, in backquotes: by its
// name, or by its parent's and its ("match.endpoint").
func fieldNames(path string) []string {
	parts := strings.Split(path, ".")
	names := []string{"`" + parts[len(parts)-1] + "`"}
	if len(parts) > 1 {
		names = append(names, "`"+strings.Join(parts[len(parts)-2:], ".")+"`")
	}
	return names
}

// documented reports whether a table row of doc has one of names in its
// first cell.
func documented(doc string, names []string) bool {
	for _, line := range strings.Split(doc, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 3 || strings.TrimSpace(cells[0]) != "" {
			continue
		}
		for _, n := range names {
			if strings.Contains(cells[1], n) {
				return true
			}
		}
	}
	return false
}

// anchorLink is a Markdown link within the same document.
var anchorLink = regexp.MustCompile(`\]\(#([^)]+)\)`)

// headingAnchors returns the anchors GitHub makes of a document's headings:
// lower case, punctuation other than - and _ dropped, spaces made -.
func headingAnchors(doc string) []string {
	var out []string
	inFence := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
		}
		text, ok := strings.CutPrefix(line, "#")
		if inFence || !ok {
			continue
		}
		text = strings.TrimSpace(strings.TrimLeft(text, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		out = append(out, b.String())
	}
	return out
}

// TestRulesDocExamples keeps docs/rules.md true: every whole rules file it
// shows loads, every file it shows refused is refused with the error it
// quotes, every field the parser accepts has a row in one of its tables,
// every algorithm, fallback and well-known descriptor is named in it, and
// its links to its own headings lead somewhere.
func TestRulesDocExamples(t *testing.T) {
	b, err := os.ReadFile(rulesDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	examples, err := docExamples(doc)
	if err != nil {
		t.Fatalf("%s: %v", rulesDoc, err)
	}
	loads, refused := 0, 0
	for _, ex := range examples {
		name := fmt.Sprintf("line%d", ex.line)
		t.Run(name, func(t *testing.T) {
			rs, err := Parse("rules.yaml", []byte(ex.yaml))
			switch {
			case !ex.refused && err != nil:
				t.Errorf("%s:%d: the example does not load: %v\n%s", rulesDoc, ex.line, err, ex.yaml)
			case !ex.refused && len(rs.Rules()) == 0:
				t.Errorf("%s:%d: the example loads no rule", rulesDoc, ex.line)
			case ex.refused && err == nil:
				t.Errorf("%s:%d: the example is shown refused, but it loads (%d rules)\n%s", rulesDoc, ex.line, len(rs.Rules()), ex.yaml)
			case ex.refused && !errors.Is(err, ErrInvalidRules):
				t.Errorf("%s:%d: error %q does not wrap ErrInvalidRules", rulesDoc, ex.line, err)
			case ex.refused && !strings.Contains(err.Error(), ex.want):
				t.Errorf("%s:%d: error %q does not contain %q, as the doc says", rulesDoc, ex.line, err, ex.want)
			}
		})
		if ex.refused {
			refused++
		} else {
			loads++
		}
	}
	t.Logf("%s: %d examples that load, %d refused", rulesDoc, loads, refused)
	// A doc whose blocks went unseen would check nothing.
	if loads < 10 || refused < 5 {
		t.Errorf("%s: found %d examples that load and %d refused; the doc has more: are the fences ```yaml and ```yaml refused?", rulesDoc, loads, refused)
	}

	// Every field the parser accepts is named in backquotes, and has a
	// row of its own in a table (its name in the first cell).
	fields := yamlFields(reflect.TypeFor[fileSpec](), "")
	if len(fields) < 30 {
		t.Fatalf("found only %d fields in fileSpec: %v", len(fields), fields)
	}
	for _, path := range fields {
		names := fieldNames(path)
		switch {
		case !slices.ContainsFunc(names, func(n string) bool { return strings.Contains(doc, n) }):
			t.Errorf("%s does not name the field %s (%s)", rulesDoc, path, strings.Join(names, " or "))
		case !documented(doc, names):
			t.Errorf("%s has no table row for the field %s (a first cell naming %s)", rulesDoc, path, strings.Join(names, " or "))
		}
	}
	// The table of contents and the other links within the doc lead
	// somewhere.
	for _, m := range anchorLink.FindAllStringSubmatch(doc, -1) {
		if !slices.Contains(headingAnchors(doc), m[1]) {
			t.Errorf("%s links to #%s, which no heading makes", rulesDoc, m[1])
		}
	}
	for _, a := range algorithmNames[1:] {
		if !strings.Contains(doc, "`"+a+"`") {
			t.Errorf("%s does not name the algorithm `%s`", rulesDoc, a)
		}
	}
	for _, f := range fallbackNames {
		if !strings.Contains(doc, "`"+f+"`") {
			t.Errorf("%s does not name the fallback `%s`", rulesDoc, f)
		}
	}
	for _, d := range wellKnown {
		if !strings.Contains(doc, "`"+d+"`") {
			t.Errorf("%s does not name the well-known descriptor `%s`", rulesDoc, d)
		}
	}
}
