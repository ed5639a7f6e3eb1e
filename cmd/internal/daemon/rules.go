package daemon

import (
	"flag"
	"fmt"
	"log/slog"

	"github.com/geoquota/geoquota/regional"
)

// StrictRulesFlag adds --rules-strict to fs.
func StrictRulesFlag(fs *flag.FlagSet, strict *bool) {
	fs.BoolVar(strict, "rules-strict", false,
		"refuse rules that load with warnings (envoyproxy/ratelimit's metadata, which geoquota reads and does not return) as invalid, instead of logging each")
}

// CheckRules refuses, when strict (--rules-strict), a rule set with
// warnings (regional.RuleSet.Warnings), naming each.
func CheckRules(rs *regional.RuleSet, strict bool) error {
	if !strict {
		return nil
	}
	if err := rs.Strict(); err != nil {
		return fmt.Errorf("--rules-strict: %w", err)
	}
	return nil
}

// LogRuleWarnings logs each warning of a rule set put in force: what its
// sources hold that geoquota reads and does not enforce, where.
func LogRuleWarnings(log *slog.Logger, rs *regional.RuleSet) {
	for _, w := range rs.Warnings() {
		log.Warn("rules: read and not enforced (--rules-strict refuses such rules)", "warning", w)
	}
}
