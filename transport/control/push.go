package control

import (
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/geoquota/geoquota/transport/gossip"
	"github.com/geoquota/geoquota/transport/namespace"
)

// Budgets and rules travel through JetStream KV (WatchBudgets,
// WatchRules), and the lead globalsync also pushes each budget document
// it writes, and the rules it last published, as plain NATS messages
// (namespace.Names.PushBudgets, PushRules). After a partition heals, a NATS
// gateway carries plain messages within a second, while JetStream may
// answer "temporarily unavailable" for several more as its servers catch
// up: the push brings a healed region its lease and its rules in the
// meantime. Each message carries the KV revision it was written at
// (gossip.HeaderRevision); a region applies rules only newer than the last
// it applied, and a lease only newer (by Seq) than the one it holds.

// PushBudget publishes a budget document written at revision rev.
func PushBudget(nc *nats.Conn, s namespace.Names, rev uint64, doc []byte) error {
	return push(nc, s.PushBudgets(), rev, doc)
}

// PushRules publishes the rules (YAML) published at revision rev.
func PushRules(nc *nats.Conn, s namespace.Names, rev uint64, yaml []byte) error {
	return push(nc, s.PushRules(), rev, yaml)
}

func push(nc *nats.Conn, subject string, rev uint64, data []byte) error {
	m := nats.NewMsg(subject)
	m.Header.Set(gossip.HeaderRevision, strconv.FormatUint(rev, 10))
	m.Data = data
	return nc.PublishMsg(m)
}

// pushedRevision reads a pushed message's revision; 0 if it has none.
func pushedRevision(m *nats.Msg) uint64 {
	rev, _ := strconv.ParseUint(m.Header.Get(gossip.HeaderRevision), 10, 64)
	return rev
}
