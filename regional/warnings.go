package regional

import "errors"

// A rule set may load with warnings: fields of envoyproxy/ratelimit's
// configuration that geoquota reads and does not enforce (a descriptor's
// metadata, which that service returns as Envoy's dynamic metadata). The
// rest of the set is enforced as written. The daemons log each warning
// when they put the set in force, and a strict load (regiond and
// globalsync's --rules-strict) refuses such a set whole, as every invalid
// set is refused.

// Warnings returns what the set's sources hold that geoquota reads and
// does not enforce, each naming the file, line, limit and field (as a
// RuleError does) and why; nil if nothing.
func (rs *RuleSet) Warnings() []string {
	if len(rs.warnings) == 0 {
		return nil
	}
	out := make([]string, len(rs.warnings))
	for i, w := range rs.warnings {
		e := *w
		e.Msg = "read and ignored: " + w.Msg
		out[i] = e.Error()
	}
	return out
}

// Strict returns nil if the set has no warnings, else an error naming
// each: what a strict load refuses. The error wraps one *RuleError a
// warning, and ErrInvalidRules.
func (rs *RuleSet) Strict() error {
	errs := make([]error, len(rs.warnings))
	for i, w := range rs.warnings {
		e := *w
		e.Msg = "not enforced, so refused when strict: " + w.Msg
		errs[i] = &e
	}
	return errors.Join(errs...)
}

// warn notes something of the source that is read and not enforced; Msg
// says why.
func (rs *RuleSet) warn(w *RuleError) { rs.warnings = append(rs.warnings, w) }
