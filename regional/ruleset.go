package regional

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"unicode/utf8"
)

// RuleSet is a compiled, validated set of rules: immutable, safe to share
// between goroutines, swapped whole when the rules change.
type RuleSet struct {
	// Source names where the rules came from (a file), for messages.
	Source string
	yaml   []byte

	rules       []*Rule
	byID        map[string]*Rule
	allow       []glob
	block       []glob
	tierOf      []tierOf
	descriptors map[string]bool // names a request may carry
	refunds     bool            // a rule refunds reservations when they end (on_expiry)

	// Rules are indexed by the first segment of their endpoint prefix. Each
	// list holds, in rule order, the rules of that segment and the rules
	// that any path may match (no endpoint, a regex, or the prefix "/").
	bySegment map[string][]*Rule
	anyPath   []*Rule

	// trees are the descriptor trees of the domains of an
	// envoyproxy/ratelimit configuration, which alone decide what
	// applies to their requests (see envoyconfig.go); nil for a geoquota
	// rules file.
	trees map[string]*descNode

	// warnings are what the sources hold that is read and not
	// enforced (see Warnings).
	warnings []*RuleError
}

type tierOf struct {
	apiKey glob
	tier   string
}

// YAML returns the rules file the set was compiled from.
func (rs *RuleSet) YAML() []byte { return rs.yaml }

// Rules returns the rules in file order.
func (rs *RuleSet) Rules() []*Rule { return rs.rules }

// Rule returns the rule with the given id, or nil.
func (rs *RuleSet) Rule(id string) *Rule { return rs.byID[id] }

func (rs *RuleSet) buildIndex() {
	rs.bySegment = map[string][]*Rule{}
	for _, r := range rs.rules {
		if seg := firstSegment(r.match.endpoint); seg != "" && r.match.endpointRegex == nil {
			rs.bySegment[seg] = nil
		}
	}
	for _, r := range rs.rules {
		seg := firstSegment(r.match.endpoint)
		if seg == "" || r.match.endpointRegex != nil {
			rs.anyPath = append(rs.anyPath, r)
			for s := range rs.bySegment {
				rs.bySegment[s] = append(rs.bySegment[s], r)
			}
			continue
		}
		rs.bySegment[seg] = append(rs.bySegment[seg], r)
	}
}

// firstSegment returns "search" for "/search/x?q=1", and "" for "" or "/".
func firstSegment(path string) string {
	if len(path) < 2 || path[0] != '/' {
		return ""
	}
	for i := 1; i < len(path); i++ {
		if path[i] == '/' || path[i] == '?' {
			return path[1:i]
		}
	}
	return path[1:]
}

func (rs *RuleSet) candidates(req *Request) []*Rule {
	if rs.trees != nil {
		if r, _ := rs.Resolve(req); r != nil && !r.unlimited {
			return r.self
		}
		return nil
	}
	if list, ok := rs.bySegment[firstSegment(req.Endpoint)]; ok {
		return list
	}
	return rs.anyPath
}

// Allowed reports whether the API key is on the allow list: never limited.
func (rs *RuleSet) Allowed(apiKey string) bool { return apiKey != "" && anyMatch(rs.allow, apiKey) }

// Blocked reports whether the API key is on the block list: always denied.
func (rs *RuleSet) Blocked(apiKey string) bool { return apiKey != "" && anyMatch(rs.block, apiKey) }

func anyMatch(globs []glob, s string) bool {
	for i := range globs {
		if globs[i].match(s) {
			return true
		}
	}
	return false
}

// Tier returns the request's tier: the one it names, or else the first
// tier_of entry its API key matches, or "".
func (rs *RuleSet) Tier(req *Request) string {
	if req.Tier != "" {
		return req.Tier
	}
	if req.APIKey != "" {
		for i := range rs.tierOf {
			if rs.tierOf[i].apiKey.match(req.APIKey) {
				return rs.tierOf[i].tier
			}
		}
	}
	return ""
}

// ErrInvalidRequest is wrapped by every error about a request.
var ErrInvalidRequest = errors.New("regional: invalid request")

// ErrUnknownDescriptor and ErrCostAboveLimit tell two RequestErrors apart
// that Envoy's protocol answers as decisions (a descriptor no rule knows
// is OK, a cost no rule can ever allow OVER_LIMIT), not as errors.
var (
	ErrUnknownDescriptor = errors.New("no rule knows this descriptor")
	ErrCostAboveLimit    = errors.New("more than the rule can ever allow")
)

// RequestError names the field of a request that is wrong.
type RequestError struct {
	Field string // "api_key", "cost", "descriptors.plan", …
	Msg   string
	// Kind, if set, is ErrUnknownDescriptor or ErrCostAboveLimit.
	Kind error
}

func (e *RequestError) Error() string { return e.Field + ": " + e.Msg }

func (e *RequestError) Unwrap() []error {
	if e.Kind != nil {
		return []error{ErrInvalidRequest, e.Kind}
	}
	return []error{ErrInvalidRequest}
}

// Request is one request to check.
type Request struct {
	// Domain is the Envoy rate-limit domain, or "".
	Domain   string
	APIKey   string
	Endpoint string // the path, starting with /
	Method   string
	IP       string
	// Tier is the caller's tier; "" lets tier_of decide.
	Tier string
	// Descriptors are the request's other descriptors.
	Descriptors []Descriptor
	// Cost is the request's weight; 0 means each rule's own cost (1 unless
	// the rule says otherwise).
	Cost int64
	// CountNothing makes the request a check that counts nothing, whatever
	// its Cost: is the key past its limit already? (Envoy's descriptor
	// hits_addend of 0.) A limit past its limit by a debt denies it.
	CountNothing bool
	// Report makes the request usage reported once it has run
	// (/v1/report): it counts its cost, and takes no slot in concurrency
	// limits (the request is no longer in flight).
	Report bool

	// reserve, set by Engine.Reserve, holds each limit's cost as a
	// reservation.
	reserve *reserveReq
	// placed is the rule RuleSet.Place found for the request in placedIn.
	placed   *Rule
	placedIn *RuleSet
}

// Descriptor is a named value of a request.
type Descriptor struct {
	Name, Value string
}

// Value returns the value of the named descriptor, well-known or custom,
// and whether the request carries it.
func (req *Request) Value(name string) (string, bool) {
	var v string
	switch name {
	case "api_key":
		v = req.APIKey
	case "endpoint":
		v = req.Endpoint
	case "method":
		v = req.Method
	case "ip":
		v = req.IP
	case "tier":
		v = req.Tier
	default:
		for i := range req.Descriptors {
			if req.Descriptors[i].Name == name {
				return req.Descriptors[i].Value, true
			}
		}
		return "", false
	}
	return v, v != ""
}

// ipAddr returns the request's IP, or the zero Addr if it has none or it
// does not parse.
func (req *Request) ipAddr() netip.Addr {
	addr, _ := parseIP(req.IP)
	return addr
}

// parseIP parses an IP address as netip.ParseAddr does, unmapping IPv4 in
// IPv6; an empty string is no address.
func parseIP(s string) (netip.Addr, bool) {
	if s == "" {
		return netip.Addr{}, false // ParseAddr would allocate its error
	}
	addr, err := netip.ParseAddr(s)
	return addr.Unmap(), err == nil
}

// plainValue reports whether a request's value is at most MaxValueLen
// bytes of UTF-8.
func plainValue(v string) bool { return len(v) <= MaxValueLen && utf8.ValidString(v) }

// checkValue says what is wrong with a value that is not plain, naming
// its field; nil if nothing is.
func checkValue(field, v string) error {
	switch {
	case len(v) > MaxValueLen:
		return &RequestError{Field: field, Msg: fmt.Sprintf("%d bytes, more than %d", len(v), MaxValueLen)}
	case !utf8.ValidString(v):
		return &RequestError{Field: field, Msg: "not valid UTF-8"}
	}
	return nil
}

// validate checks what can be checked without the rules' limits: value
// lengths, the IP, the endpoint, descriptor names. It returns the parsed IP.
func (rs *RuleSet) validate(req *Request) (netip.Addr, error) {
	var addr netip.Addr
	if !plainValue(req.APIKey) || !plainValue(req.Endpoint) || !plainValue(req.Method) ||
		!plainValue(req.IP) || !plainValue(req.Tier) || !plainValue(req.Domain) {
		for _, f := range [...]struct{ name, value string }{
			{"api_key", req.APIKey}, {"endpoint", req.Endpoint}, {"method", req.Method},
			{"ip", req.IP}, {"tier", req.Tier}, {"domain", req.Domain},
		} {
			if err := checkValue(f.name, f.value); err != nil {
				return addr, err
			}
		}
	}
	if req.Endpoint != "" && req.Endpoint[0] != '/' {
		return addr, &RequestError{Field: "endpoint", Msg: "a path starts with /"}
	}
	if req.IP != "" {
		var ok bool
		if addr, ok = parseIP(req.IP); !ok {
			return addr, &RequestError{Field: "ip", Msg: fmt.Sprintf("%q is not an IP address", req.IP)}
		}
	}
	if req.Cost < 0 {
		return addr, &RequestError{Field: "cost", Msg: "must be positive"}
	}
	for i := range req.Descriptors {
		d := &req.Descriptors[i]
		switch {
		case !rs.descriptors[d.Name]:
			return addr, &RequestError{Field: "descriptors." + d.Name, Msg: "no rule knows this descriptor", Kind: ErrUnknownDescriptor}
		case isWellKnown(d.Name):
			return addr, &RequestError{Field: "descriptors." + d.Name, Msg: "pass " + d.Name + " in its own field"}
		case d.Value == "":
			return addr, &RequestError{Field: "descriptors." + d.Name, Msg: "empty value"}
		case !plainValue(d.Value):
			return addr, checkValue("descriptors."+d.Name, d.Value)
		}
		for j := range i {
			if req.Descriptors[j].Name == d.Name {
				return addr, &RequestError{Field: "descriptors." + d.Name, Msg: "given twice"}
			}
		}
	}
	return addr, nil
}

func isWellKnown(name string) bool {
	switch name {
	case "api_key", "endpoint", "method", "ip", "tier":
		return true
	}
	return false
}

// matches reports whether rule r applies to the request, whose tier and
// parsed IP are given.
func (r *Rule) matches(req *Request, tier string, addr netip.Addr) bool {
	m := &r.match
	switch {
	case r.Domain != "" && r.Domain != req.Domain,
		m.endpoint != "" && !matchPath(m.endpoint, req.Endpoint),
		m.endpointRegex != nil && (req.Endpoint == "" || !m.endpointRegex.MatchString(req.Endpoint)),
		m.method != "" && !strings.EqualFold(m.method, req.Method),
		m.apiKey != nil && (req.APIKey == "" || !m.apiKey.match(req.APIKey)),
		m.ip.IsValid() && (!addr.IsValid() || !m.ip.Contains(addr)),
		m.tier != "" && m.tier != tier:
		return false
	}
	if r.Tiers != nil {
		if _, ok := r.Tiers[tier]; !ok {
			return false
		}
	}
	for i := range m.custom {
		v, ok := req.Value(m.custom[i].name)
		if !ok || !m.custom[i].glob.match(v) {
			return false
		}
	}
	for _, name := range r.By {
		if name == "tier" {
			if tier == "" {
				return false
			}
		} else if _, ok := req.Value(name); !ok {
			return false
		}
	}
	return true
}

// AppliesWithoutKey reports whether some rule may apply to a request of
// no domain that carries only an endpoint, a method and an IP address:
// what regiond's reverse proxy and the middleware's DefaultRequest make
// of an HTTP request without an API key.
func (rs *RuleSet) AppliesWithoutKey() bool {
	for _, r := range rs.rules {
		m := &r.match
		if r.Domain != "" || m.apiKey != nil || m.tier != "" || len(m.custom) > 0 || r.Tiers != nil {
			continue
		}
		if !slices.ContainsFunc(r.By, func(d string) bool { return d != "endpoint" && d != "method" && d != "ip" }) {
			return true
		}
	}
	return false
}

// AppendMatches appends to dst the rules that apply to the request, in
// file order. It does not check the request; Engine.Check does.
func (rs *RuleSet) AppendMatches(dst []*Rule, req *Request) []*Rule {
	addr, tier := req.ipAddr(), rs.Tier(req)
	for _, r := range rs.candidates(req) {
		if r.matches(req, tier, addr) {
			dst = append(dst, r)
		}
	}
	return dst
}

// appendKey appends the counter key of rule r for the request: the values
// of its By descriptors, joined by |, with | and \ escaped by \.
func (r *Rule) appendKey(dst []byte, req *Request, tier string) []byte {
	for i, name := range r.By {
		if i > 0 {
			dst = append(dst, '|')
		}
		v := tier
		if name != "tier" {
			v, _ = req.Value(name)
		}
		if strings.IndexByte(v, '|') < 0 && strings.IndexByte(v, '\\') < 0 {
			dst = append(dst, v...)
			continue
		}
		for j := 0; j < len(v); j++ {
			if v[j] == '|' || v[j] == '\\' {
				dst = append(dst, '\\')
			}
			dst = append(dst, v[j])
		}
	}
	return dst
}

// params returns the limit rule r applies to the counter key: an override
// for the key, else the tier's, else the rule's own.
func (r *Rule) params(key []byte, tier string) Params {
	if n, ok := r.Overrides[string(key)]; ok {
		return r.Base.scaled(n)
	}
	if n, ok := r.Tiers[tier]; ok {
		return r.Base.scaled(n)
	}
	return r.Base
}
