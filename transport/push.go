package transport

import (
	"strconv"

	"github.com/nats-io/nats.go"
)

// Budgets and rules travel through JetStream KV (WatchBudgets,
// WatchRules), and the lead globalsync also pushes each budget document
// it writes, and the rules it last published, as plain NATS messages.
// After a partition heals, a NATS gateway carries plain messages within a
// second, while JetStream may answer "temporarily unavailable" for
// several more as its servers catch up: the push brings a healed region
// its lease and its rules in the meantime. Each message carries the KV
// revision it was written at; a region applies rules only newer than the
// last it applied, and a lease only newer (by Seq) than the one it holds.
const (
	// PushBudgetsSubject carries budget documents (BudgetDoc, JSON).
	PushBudgetsSubject = "geoquota.push.budgets"
	// PushRulesSubject carries the published rules (YAML).
	PushRulesSubject = "geoquota.push.rules"
	// HeaderRevision is the KV revision a pushed value was written at.
	HeaderRevision = "Geoquota-Revision"
)

// PushBudget publishes a budget document written at revision rev.
func PushBudget(nc *nats.Conn, rev uint64, doc []byte) error {
	return push(nc, PushBudgetsSubject, rev, doc)
}

// PushRules publishes the rules (YAML) published at revision rev.
func PushRules(nc *nats.Conn, rev uint64, yaml []byte) error {
	return push(nc, PushRulesSubject, rev, yaml)
}

func push(nc *nats.Conn, subject string, rev uint64, data []byte) error {
	m := nats.NewMsg(subject)
	m.Header.Set(HeaderRevision, strconv.FormatUint(rev, 10))
	m.Data = data
	return nc.PublishMsg(m)
}

// pushedRevision reads a pushed message's revision; 0 if it has none.
func pushedRevision(m *nats.Msg) uint64 {
	rev, _ := strconv.ParseUint(m.Header.Get(HeaderRevision), 10, 64)
	return rev
}
