package regional

import "strings"

// A counter's key in a store is gq:{rule:values}: the rule's id, then the
// descriptor values the rule counts by, joined. The braces are a Redis
// hash tag, so that a Cluster keeps every key of one counter (a sliding
// log's, a global counter's windows) in one slot and spreads a rule's
// counters over the others. Rule ids hold no colon and no brace.
const (
	keyOpen  = "gq:{"
	keyClose = '}'
)

// CounterKey returns the key of rule's counter for the descriptor values.
func CounterKey(rule, values string) string {
	var b strings.Builder
	b.Grow(len(keyOpen) + len(rule) + len(values) + 2)
	b.WriteString(keyOpen)
	b.WriteString(rule)
	b.WriteByte(':')
	b.WriteString(values)
	b.WriteByte(keyClose)
	return b.String()
}

// appendCounterKey appends CounterKey(rule, values) to dst.
func appendCounterKey(dst []byte, rule, values string) []byte {
	return append(append(appendKeyPrefix(dst, rule), values...), keyClose)
}

// ParseCounterKey splits a counter key into its rule and descriptor values.
func ParseCounterKey(key string) (rule, values string, ok bool) {
	inner, ok := strings.CutPrefix(key, keyOpen)
	if !ok {
		return "", "", false
	}
	inner, ok = strings.CutSuffix(inner, string(keyClose))
	if !ok {
		return "", "", false
	}
	rule, values, ok = strings.Cut(inner, ":")
	return rule, values, ok
}

// overflowSuffix ends the key of the counter a rule's keys beyond its
// max_keys share (on_key_overflow: fold): gq:{rule}:overflow. A counter
// key ends in a brace: no counter key ends so.
const overflowSuffix = "}:overflow"

// overflowKey returns the key of rule's overflow counter.
func overflowKey(dst []byte, rule string) []byte {
	return append(append(append(dst, keyOpen...), rule...), overflowSuffix...)
}

// parseKey splits a counter key, or an overflow counter's key, into its
// rule and descriptor values (none for an overflow counter).
func parseKey(key string) (rule, values string, overflow, ok bool) {
	if inner, ok := strings.CutPrefix(key, keyOpen); ok {
		if r, ok := strings.CutSuffix(inner, overflowSuffix); ok && !strings.ContainsAny(r, ":{}") {
			return r, "", true, true
		}
	}
	rule, values, ok = ParseCounterKey(key)
	return rule, values, false, ok
}

// appendKeyPrefix appends what a rule's counter keys start with.
func appendKeyPrefix(dst []byte, rule string) []byte {
	return append(append(append(dst, keyOpen...), rule...), ':')
}
