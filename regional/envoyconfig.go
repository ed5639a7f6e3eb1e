package regional

import (
	"bytes"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// envoyproxy/ratelimit's configuration, read as a migration path: a domain
// per YAML document, each a tree of descriptors. Every limit of the tree
// becomes a fixed-window rule of that domain, and the tree itself decides
// which of them a request meets, as envoyproxy/ratelimit does: the one at
// the end of a path whose length is the request's number of descriptors,
// taking at each level the entry with the request's value, else a wildcard
// value that matches (in file order), else the entry without a value. A
// request of the domain meets at most one of its rules. docs/rules.md
// says what is read, converted and refused.

// envoyUnits are the units of rate_limit.unit, as envoyproxy/ratelimit
// counts them (a month is 30 days, a year 365).
var envoyUnits = map[string]time.Duration{
	"second": time.Second,
	"minute": time.Minute,
	"hour":   time.Hour,
	"day":    24 * time.Hour,
	"week":   7 * 24 * time.Hour,
	"month":  30 * 24 * time.Hour,
	"year":   365 * 24 * time.Hour,
}

// maxEnvoyDepth bounds how deep a descriptor tree goes, and with it the
// work of placing a request in it.
const maxEnvoyDepth = 16

// descNode is an entry of a domain's descriptor tree.
type descNode struct {
	key, value string
	wildcard   *glob // for a value with *
	rule       *Rule // its limit, or nil (none, or unlimited)
	children   []*descNode
	keys       []string             // the children's keys, each once, in file order
	exact      map[string]*descNode // key + "\x00" + value
	wild       map[string][]*descNode
	byKey      map[string]*descNode // the entries without a value
}

func newDescNode(key, value string) *descNode {
	return &descNode{key: key, value: value, exact: map[string]*descNode{},
		wild: map[string][]*descNode{}, byKey: map[string]*descNode{}}
}

// resolve returns the rule of the tree the request meets, or nil, when
// the order of its descriptors is not known (an HTTP or gRPC check; Envoy
// RLS requests are placed by their order: Place). It walks the tree as
// envoyproxy/ratelimit does, trying at each level the keys the request
// carries in the tree's order, and takes the first path that uses every
// descriptor and ends at a limit; a bounded number of steps.
func (n *descNode) resolve(req *Request) *Rule {
	carried := req.carried()
	if carried == 0 || carried > maxEnvoyDepth {
		return nil
	}
	var used [maxEnvoyDepth]string
	steps := 0
	var walk func(n *descNode, depth int) *Rule
	walk = func(n *descNode, depth int) *Rule {
		for _, k := range n.keys {
			if steps++; steps > maxEnvoySteps {
				return nil
			}
			if slices.Contains(used[:depth], k) {
				continue
			}
			v, ok := req.Value(k)
			if !ok {
				continue
			}
			next := n.child(k, v)
			if next == nil {
				continue
			}
			if depth+1 == carried {
				if next.rule != nil {
					return next.rule
				}
				continue
			}
			used[depth] = k
			if r := walk(next, depth+1); r != nil {
				return r
			}
		}
		return nil
	}
	return walk(n, 0)
}

// child is the entry below n that an entry of the request meets: the one
// of its key and value, else the first whose wildcard value matches, else
// the one of its key alone; nil for none.
func (n *descNode) child(k, v string) *descNode {
	if next := n.exact[k+"\x00"+v]; next != nil {
		return next
	}
	for _, w := range n.wild[k] {
		if w.wildcard.match(v) {
			return w
		}
	}
	return n.byKey[k]
}

// maxEnvoySteps bounds the keys resolve looks at for one request.
const maxEnvoySteps = 1024

// resolveOrdered returns the rule of the tree that entries, in order, meet
// (nil for none), exactly as envoyproxy/ratelimit walks its tree: for each
// entry the child of its key and value, else a wildcard child that
// matches, else the child of its key alone; the limit of the child the
// last entry reaches.
func (n *descNode) resolveOrdered(keys, values []string) *Rule {
	for i, k := range keys {
		next := n.child(k, values[i])
		if next == nil {
			return nil
		}
		if i == len(keys)-1 {
			return next.rule
		}
		if len(next.children) == 0 {
			return nil
		}
		n = next
	}
	return nil
}

// Placing reports whether the domain's requests are placed by a
// descriptor tree (see Place).
func (rs *RuleSet) Placing(domain string) bool {
	_, ok := rs.trees[domain]
	return ok
}

// Place puts the request where the descriptor tree of its domain, an
// envoyproxy/ratelimit configuration's, takes its entries in the order
// given (keys as the request names them: remote_address is ip): the rule
// it meets, or none, is then the request's in this rule set, whatever
// its descriptors' order elsewhere. It returns that rule (nil for none;
// an unlimited one limits nothing) and whether the domain has a tree.
func (rs *RuleSet) Place(req *Request, keys, values []string) (*Rule, bool) {
	t, ok := rs.trees[req.Domain]
	if !ok {
		return nil, false
	}
	req.placed, req.placedIn = t.resolveOrdered(keys, values), rs
	return req.placed, true
}

// carried counts the descriptors the request carries.
func (req *Request) carried() int {
	n := len(req.Descriptors)
	for _, v := range [...]string{req.APIKey, req.Endpoint, req.Method, req.IP, req.Tier} {
		if v != "" {
			n++
		}
	}
	return n
}

// Resolve returns the rule of an envoyproxy/ratelimit domain that the
// request meets (the one Place put it at, or else found from its
// descriptors in any order), and whether its domain came from such a
// configuration. An unlimited rule (Unlimited) limits nothing.
func (rs *RuleSet) Resolve(req *Request) (*Rule, bool) {
	t, ok := rs.trees[req.Domain]
	if !ok {
		return nil, false
	}
	if req.placedIn == rs {
		return req.placed, true
	}
	return t.resolve(req), true
}

// isEnvoyConfig reports whether the YAML is envoyproxy/ratelimit's: its
// first document that is not empty a mapping with domain and without
// rules. (envoyproxy/ratelimit's own files start with ---, and a
// directory's files are joined with --- between them: joinSources.)
func isEnvoyConfig(src []byte) bool {
	dec := yaml.NewDecoder(bytes.NewReader(src))
	var doc yaml.Node
	for emptyDocument(&doc) {
		doc = yaml.Node{}
		if dec.Decode(&doc) != nil {
			return false
		}
	}
	if doc.Content[0].Kind != yaml.MappingNode {
		return false
	}
	m := doc.Content[0]
	domain, rules := false, false
	for i := 0; i+1 < len(m.Content); i += 2 {
		switch m.Content[i].Value {
		case "domain":
			domain = true
		case "rules":
			rules = true
		}
	}
	return domain && !rules
}

// emptyDocument reports whether a YAML document holds nothing, as the one
// between two --- does.
func emptyDocument(doc *yaml.Node) bool {
	return len(doc.Content) == 0 || doc.Content[0].Kind == yaml.ScalarNode && doc.Content[0].Tag == "!!null"
}

// envoySource is a file of envoyproxy/ratelimit's configuration.
type envoySource struct {
	name string
	src  []byte
}

// ReadRules reads the rules at path: a file, or a directory of
// envoyproxy/ratelimit domain files (*.yaml and *.yml not starting with a
// dot, in name order) joined as one YAML stream, one document a file.
func ReadRules(path string) ([]byte, error) {
	srcs, err := readSources(path)
	if err != nil {
		return nil, err
	}
	return joinSources(srcs), nil
}

func readSources(path string) ([]envoySource, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, &RuleError{File: path, Msg: err.Error()}
	}
	if !fi.IsDir() {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, &RuleError{File: path, Msg: err.Error()}
		}
		return []envoySource{{path, b}}, nil
	}
	ents, err := os.ReadDir(path)
	if err != nil {
		return nil, &RuleError{File: path, Msg: err.Error()}
	}
	var srcs []envoySource
	for _, e := range ents {
		name := e.Name()
		if e.IsDir() || strings.HasPrefix(name, ".") || (!strings.HasSuffix(name, ".yaml") && !strings.HasSuffix(name, ".yml")) {
			continue
		}
		p := filepath.Join(path, name)
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, &RuleError{File: p, Msg: err.Error()}
		}
		srcs = append(srcs, envoySource{p, b})
	}
	if len(srcs) == 0 {
		return nil, &RuleError{File: path, Msg: "no .yaml or .yml file in the directory"}
	}
	return srcs, nil
}

// joinSources makes one YAML stream of the files, one document each.
func joinSources(srcs []envoySource) []byte {
	if len(srcs) == 1 {
		return srcs[0].src
	}
	var b bytes.Buffer
	for _, s := range srcs {
		fmt.Fprintf(&b, "# %s\n---\n", filepath.Base(s.name))
		b.Write(s.src)
		if !bytes.HasSuffix(s.src, []byte("\n")) {
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

// loadSources compiles the files read from path.
func loadSources(path string, srcs []envoySource) (*RuleSet, error) {
	if len(srcs) == 1 {
		return Parse(srcs[0].name, srcs[0].src)
	}
	for _, s := range srcs {
		if !isEnvoyConfig(s.src) {
			return nil, &RuleError{File: s.name, Msg: "a directory of rules holds envoyproxy/ratelimit domain files (domain:, descriptors:); give a geoquota rules file as a file"}
		}
	}
	rs, err := compileEnvoy(srcs)
	if err != nil {
		return nil, err
	}
	rs.Source, rs.yaml = path, joinSources(srcs)
	return rs, nil
}

// compileEnvoy builds a rule set of every domain of the files.
func compileEnvoy(srcs []envoySource) (*RuleSet, error) {
	c := &envoyCompiler{rs: &RuleSet{byID: map[string]*Rule{}, descriptors: map[string]bool{}, trees: map[string]*descNode{}},
		domainAt: map[string]string{}}
	for _, d := range wellKnown {
		c.rs.descriptors[d] = true
	}
	for _, s := range srcs {
		c.file = s.name
		dec := yaml.NewDecoder(bytes.NewReader(s.src))
		for {
			var doc yaml.Node
			err := dec.Decode(&doc)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, yamlError(s.name, s.src, err)
			}
			if emptyDocument(&doc) {
				continue
			}
			if err := c.domain(doc.Content[0]); err != nil {
				return nil, err
			}
		}
	}
	if len(c.rs.trees) == 0 {
		return nil, &RuleError{File: c.file, Field: "domain", Msg: "no domain: every request would go through unlimited"}
	}
	c.rs.buildIndex()
	return c.rs, nil
}

type envoyCompiler struct {
	rs       *RuleSet
	file     string
	domainAt map[string]string // domain to where it was first given
}

func (c *envoyCompiler) fail(n *yaml.Node, field, format string, args ...any) *RuleError {
	return &RuleError{File: c.file, Line: n.Line, Field: field, Msg: fmt.Sprintf(format, args...)}
}

// fields returns a mapping's values by key, refusing a key not in known,
// one given twice, and a node that is not a mapping.
func (c *envoyCompiler) fields(n *yaml.Node, what string, known ...string) (map[string]*yaml.Node, error) {
	if n.Kind != yaml.MappingNode {
		return nil, c.fail(n, what, "want a mapping")
	}
	out := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		if !slices.Contains(known, k.Value) {
			return nil, c.fail(k, strings.TrimPrefix(what+"."+k.Value, "."), "unknown key (known: %s)", strings.Join(known, ", "))
		}
		if _, dup := out[k.Value]; dup {
			return nil, c.fail(k, strings.TrimPrefix(what+"."+k.Value, "."), "given twice")
		}
		out[k.Value] = n.Content[i+1]
	}
	return out, nil
}

func (c *envoyCompiler) str(n *yaml.Node, field string) (string, error) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		return "", c.fail(n, field, "want a string")
	}
	return n.Value, nil
}

func (c *envoyCompiler) boolean(n *yaml.Node, field string) (bool, error) {
	var b bool
	if n.Kind != yaml.ScalarNode || n.Decode(&b) != nil {
		return false, c.fail(n, field, "want true or false")
	}
	return b, nil
}

func (c *envoyCompiler) domain(n *yaml.Node) error {
	f, err := c.fields(n, "", "domain", "descriptors")
	if err != nil {
		return err
	}
	dn, ok := f["domain"]
	if !ok {
		return c.fail(n, "domain", "required")
	}
	domain, err := c.str(dn, "domain")
	if err != nil {
		return err
	}
	if domain == "" {
		return c.fail(dn, "domain", "must not be empty")
	}
	if err := checkValue("domain", domain); err != nil {
		return c.fail(dn, "domain", "%v", err)
	}
	if at, dup := c.domainAt[domain]; dup {
		return c.fail(dn, "domain", "%q is given in %s too", domain, at)
	}
	c.domainAt[domain] = fmt.Sprintf("%s:%d", c.file, dn.Line)
	root := newDescNode("", "")
	c.rs.trees[domain] = root
	if ds, ok := f["descriptors"]; ok {
		return c.descriptors(ds, domain, root, nil, "descriptors")
	}
	return nil
}

// envoyLevel is an entry of the path from the root to an entry.
type envoyLevel struct {
	key, value string
	shared     bool // share_threshold: its values share one counter
}

func (c *envoyCompiler) descriptors(n *yaml.Node, domain string, parent *descNode, path []envoyLevel, field string) error {
	if n.Tag == "!!null" {
		return nil // descriptors: left empty
	}
	if n.Kind != yaml.SequenceNode {
		return c.fail(n, field, "want a list")
	}
	if len(path) >= maxEnvoyDepth {
		return c.fail(n, field, "nested more than %d deep", maxEnvoyDepth)
	}
	for i, e := range n.Content {
		if err := c.descriptor(e, domain, parent, path, fmt.Sprintf("%s[%d]", field, i)); err != nil {
			return err
		}
	}
	return nil
}

func (c *envoyCompiler) descriptor(n *yaml.Node, domain string, parent *descNode, path []envoyLevel, field string) error {
	f, err := c.fields(n, field, "key", "value", "rate_limit", "descriptors", "shadow_mode", "detailed_metric",
		"value_to_metric", "share_threshold", "quota_mode", "metadata")
	if err != nil {
		return err
	}
	kn, ok := f["key"]
	if !ok {
		return c.fail(n, field+".key", "required")
	}
	key, err := c.str(kn, field+".key")
	if err != nil {
		return err
	}
	if key == "" {
		return c.fail(kn, field+".key", "must not be empty")
	}
	if alias, ok := envoyAliases[key]; ok {
		key = alias // what the RLS server names it
	}
	var value string
	if vn, ok := f["value"]; ok && vn.Tag != "!!null" {
		if value, err = c.str(vn, field+".value"); err != nil {
			return err
		}
	}
	flag := func(name string) (bool, error) {
		if v, ok := f[name]; ok {
			return c.boolean(v, field+"."+name)
		}
		return false, nil
	}
	shadow, err := flag("shadow_mode")
	if err != nil {
		return err
	}
	for _, name := range []string{"detailed_metric", "value_to_metric"} {
		// They name metrics: geoquota's are per rule.
		if _, err := flag(name); err != nil {
			return err
		}
	}
	shared, err := flag("share_threshold")
	if err != nil {
		return err
	}
	quota, err := flag("quota_mode")
	if err != nil {
		return err
	}
	// metadata is what envoyproxy/ratelimit adds to Envoy's dynamic
	// metadata for a descriptor its limit lets through, when started
	// with RESPONSE_DYNAMIC_METADATA=true: read, not enforced (Warnings).
	var metadata bool
	if md, ok := f["metadata"]; ok && md.Tag != "!!null" {
		if md.Kind != yaml.MappingNode {
			return c.fail(md, field+".metadata", "want a mapping")
		}
		metadata = len(md.Content) > 0
	}
	node := newDescNode(key, value)
	if strings.Contains(value, "*") {
		if strings.Contains(value, "?") {
			return c.fail(f["value"], field+".value", "%q: a ? in a wildcard value is a wildcard in geoquota, a character in envoyproxy/ratelimit; write the value without it", value)
		}
		g, _ := compileGlob(value)
		node.wildcard = &g
	} else if shared {
		return c.fail(f["share_threshold"], field+".share_threshold", "only for a value with a wildcard (*)")
	}
	composite := key + "\x00" + value
	switch {
	case node.wildcard != nil:
		if slices.ContainsFunc(parent.wild[key], func(w *descNode) bool { return w.value == value }) {
			return c.fail(n, field, "%s %q given twice at this level", key, value)
		}
		parent.wild[key] = append(parent.wild[key], node)
	case value != "":
		if parent.exact[composite] != nil {
			return c.fail(n, field, "%s %q given twice at this level", key, value)
		}
		parent.exact[composite] = node
	default:
		if parent.byKey[key] != nil {
			return c.fail(n, field, "%s without a value given twice at this level", key)
		}
		parent.byKey[key] = node
	}
	parent.children = append(parent.children, node)
	if !slices.Contains(parent.keys, key) {
		parent.keys = append(parent.keys, key)
	}
	c.rs.descriptors[key] = true
	path = append(slices.Clip(path), envoyLevel{key: key, value: value, shared: shared})
	if rl, ok := f["rate_limit"]; ok && rl.Tag != "!!null" {
		if node.rule, err = c.rateLimit(rl, domain, path, shadow, quota, field+".rate_limit"); err != nil {
			return err
		}
	}
	if metadata {
		name := envoyName(domain, path)
		if node.rule != nil {
			name = node.rule.ID
		}
		c.rs.warn(&RuleError{File: c.file, Line: keyLine(n, "metadata"), Rule: name, Field: field + ".metadata",
			Msg: "geoquota's Envoy RLS responses carry no dynamic metadata (envoyproxy/ratelimit returns it with RESPONSE_DYNAMIC_METADATA=true)"})
	}
	if ds, ok := f["descriptors"]; ok {
		return c.descriptors(ds, domain, node, path, field+".descriptors")
	}
	return nil
}

// envoyAliases are the keys of envoyproxy/ratelimit's configuration that
// the RLS server names otherwise (see transport's descriptorAliases).
var envoyAliases = map[string]string{"remote_address": "ip"}

// keyLine is the line of the key name of the mapping n.
func keyLine(n *yaml.Node, name string) int {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == name {
			return n.Content[i].Line
		}
	}
	return n.Line
}

func (c *envoyCompiler) rateLimit(n *yaml.Node, domain string, path []envoyLevel, shadow, quota bool, field string) (*Rule, error) {
	f, err := c.fields(n, field, "unit", "requests_per_unit", "unlimited", "name", "replaces")
	if err != nil {
		return nil, err
	}
	unlimited := false
	if u, ok := f["unlimited"]; ok {
		if unlimited, err = c.boolean(u, field+".unlimited"); err != nil {
			return nil, err
		}
	}
	var window time.Duration
	if u, ok := f["unit"]; ok {
		unit, err := c.str(u, field+".unit")
		if err != nil {
			return nil, err
		}
		if window, ok = envoyUnits[strings.ToLower(unit)]; !ok {
			return nil, c.fail(u, field+".unit", "%q: want second, minute, hour, day, week, month or year", unit)
		}
		if unlimited {
			return nil, c.fail(u, field+".unit", "not with unlimited: true")
		}
	} else if !unlimited {
		return nil, c.fail(n, field+".unit", "required")
	}
	var perUnit int64
	if p, ok := f["requests_per_unit"]; ok {
		if p.Kind != yaml.ScalarNode || p.Decode(&perUnit) != nil || perUnit < 0 || perUnit > 1<<32-1 {
			return nil, c.fail(p, field+".requests_per_unit", "want a whole number from 0 to %d", uint32(1<<32-1))
		}
	}
	var name string
	if nn, ok := f["name"]; ok {
		if name, err = c.str(nn, field+".name"); err != nil {
			return nil, err
		}
	}
	var replaces []string
	if rn, ok := f["replaces"]; ok {
		if rn.Kind != yaml.SequenceNode {
			return nil, c.fail(rn, field+".replaces", "want a list of { name: … }")
		}
		for i, e := range rn.Content {
			ef, err := c.fields(e, fmt.Sprintf("%s.replaces[%d]", field, i), "name")
			if err != nil {
				return nil, err
			}
			var r string
			if v, ok := ef["name"]; ok {
				if r, err = c.str(v, fmt.Sprintf("%s.replaces[%d].name", field, i)); err != nil {
					return nil, err
				}
			}
			switch {
			case r == "":
				return nil, c.fail(e, fmt.Sprintf("%s.replaces[%d].name", field, i), "required")
			case r == name:
				return nil, c.fail(e, fmt.Sprintf("%s.replaces[%d].name", field, i), "a limit does not replace itself")
			}
			replaces = append(replaces, r)
		}
	}
	if unlimited {
		// Limits nothing; placed like the others, for its replaces.
		return &Rule{ID: c.ruleID(domain, path), Domain: domain, Name: name, Replaces: replaces, unlimited: true}, nil
	}
	// One counter per value of each level, but the levels whose
	// wildcard's values share one.
	var by []string
	for _, l := range path {
		if !l.shared {
			by = append(by, l.key)
		}
	}
	limit := max(perUnit, 1) // 0 denies every request: below
	r, rerr := compileRule(ruleSpec{ID: c.ruleID(domain, path), Domain: domain, By: by, Algorithm: "fixed_window",
		Limit: &limit, Window: &window, Shadow: shadow})
	if rerr != nil {
		rerr.File, rerr.Line = c.file, n.Line
		return nil, rerr
	}
	r.Name, r.Replaces, r.denyAll, r.Quota = name, replaces, perUnit == 0, quota
	c.rs.byID[r.ID] = r
	c.rs.rules = append(c.rs.rules, r)
	return r, nil
}

// ruleID names a limit as envoyproxy/ratelimit's statistics do
// (envoyName), made unique.
func (c *envoyCompiler) ruleID(domain string, path []envoyLevel) string {
	id := envoyName(domain, path)
	for base, i := id, 2; c.rs.byID[id] != nil; i++ {
		id = fmt.Sprintf("%s~%d", base, i)
	}
	return id
}

// envoyName names the entry at the end of path as envoyproxy/ratelimit's
// statistics do (domain.key_value.key), in the characters a rule id may
// hold.
func envoyName(domain string, path []envoyLevel) string {
	var b strings.Builder
	b.WriteString(domain)
	for _, l := range path {
		b.WriteString(".")
		b.WriteString(l.key)
		if l.value != "" {
			b.WriteString("_")
			b.WriteString(l.value)
		}
	}
	id := strings.Map(func(r rune) rune {
		if strings.ContainsRune("{}|\\: \t\n\r", r) {
			return '_'
		}
		return r
	}, b.String())
	if len(id) > 120 {
		h := fnv.New32a()
		h.Write([]byte(b.String()))
		id = fmt.Sprintf("%s~%08x", strings.ToValidUTF8(id[:110], ""), h.Sum32())
	}
	return id
}
