package namespace

import (
	"fmt"
	"strings"

	"github.com/geoquota/geoquota/crdt"
)

// Root starts every subject and bucket name.
const Root = "geoquota"

// GlobalSync is globalsync's name where a region's stands in a subject
// (its asks).
const GlobalSync = "globalsync"

// MaxDeploymentLen bounds a deployment's name.
const MaxDeploymentLen = 32

// Names are the subjects and buckets of one deployment:
//
//	<prefix>.delta.<region>        a region's changed slots, from any of its replicas
//	<prefix>.ask.<to>.<from>       what <from> asks of <to>'s replicas (anti-entropy)
//	<prefix>.repair.<to>.<from>    what <from> answers <to>
//	<prefix>.heartbeat.<region>    a replica's demand and leases, for globalsync
//	<prefix>.push.budgets          budget documents, pushed beside the KV bucket
//	<prefix>.push.rules            the published rules, pushed beside the KV bucket
//
// where the prefix is "geoquota", or "geoquota.d.<deployment>" for a named
// deployment (a token no subject of the unnamed one has there, so that
// none of either's subjects, or what their permissions allow, is the
// other's); and the buckets geoquota-budgets, geoquota-rules and
// geoquota-leader, or geoquota-<deployment>-budgets and so on. The region
// that sends comes last in a subject, so that a subscriber can tell it
// without reading the message. The zero value is the unnamed deployment's.
type Names struct{ deployment string }

// New returns the names of a deployment: "" is the unnamed one, every
// other name is letters, digits, - and _, at most MaxDeploymentLen.
func New(deployment string) (Names, error) {
	if len(deployment) > MaxDeploymentLen {
		return Names{}, fmt.Errorf("deployment %q: at most %d characters", deployment, MaxDeploymentLen)
	}
	for _, c := range deployment {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return Names{}, fmt.Errorf("deployment %q: want letters, digits, - and _ only", deployment)
		}
	}
	return Names{deployment: deployment}, nil
}

// Deployment returns the deployment's name ("" for the unnamed one).
func (n Names) Deployment() string { return n.deployment }

// Prefix returns what every subject of the deployment starts with.
func (n Names) Prefix() string {
	if n.deployment == "" {
		return Root
	}
	return Root + ".d." + n.deployment
}

// bucket names one of the deployment's buckets.
func (n Names) bucket(what string) string {
	if n.deployment == "" {
		return Root + "-" + what
	}
	return Root + "-" + n.deployment + "-" + what
}

// BudgetsBucket is where globalsync publishes every global rule's leases.
func (n Names) BudgetsBucket() string { return n.bucket("budgets") }

// RulesBucket is where globalsync publishes the rules.
func (n Names) RulesBucket() string { return n.bucket("rules") }

// LeaderBucket holds the leading globalsync's claim.
func (n Names) LeaderBucket() string { return n.bucket("leader") }

// Inbox is the prefix of an identity's reply subjects (a region's
// replicas, by the region's name, or GlobalSync): its own, so that no
// other identity may subscribe to its replies, JetStream's included. The
// daemons set it (nats.CustomInboxPrefix); the servers' permissions let
// each identity subscribe to its own alone.
func (n Names) Inbox(identity string) string {
	if n.deployment == "" {
		return "_INBOX_GQ." + identity
	}
	return "_INBOX_GQ_D." + n.deployment + "." + identity
}

// Subscriptions are the wildcards that cover every subject of the
// deployment, and no other deployment's.
func (n Names) Subscriptions() []string {
	if n.deployment != "" {
		return []string{n.Prefix() + ".>"}
	}
	var subs []string
	for _, k := range []string{"delta", "ask", "repair", "heartbeat", "push"} {
		subs = append(subs, Root+"."+k+".>")
	}
	return subs
}

// Kind is what a gossip subject carries.
type Kind uint8

// The kinds of gossip subjects.
const (
	Delta Kind = iota
	Ask
	Repair
	Heartbeat
)

var kindNames = [...]string{"delta", "ask", "repair", "heartbeat"}

func (k Kind) String() string { return kindNames[k] }

// Delta is the subject of a region's deltas.
func (n Names) Delta(region string) string { return n.Prefix() + ".delta." + region }

// Ask is the subject of what from (a region or globalsync) asks of the
// region to's replicas.
func (n Names) Ask(to, from string) string { return n.Prefix() + ".ask." + to + "." + from }

// Repair is the subject of what from sends to (a region or globalsync) in
// answer to its asks.
func (n Names) Repair(to, from string) string { return n.Prefix() + ".repair." + to + "." + from }

// Heartbeat is the subject of a region's replicas' heartbeats.
func (n Names) Heartbeat(region string) string { return n.Prefix() + ".heartbeat." + region }

// PushBudgets carries budget documents (budget.Document, JSON) as globalsync
// writes them to the budgets bucket.
func (n Names) PushBudgets() string { return n.Prefix() + ".push.budgets" }

// PushRules carries the rules globalsync last published (YAML).
func (n Names) PushRules() string { return n.Prefix() + ".push.rules" }

// Parse reads a gossip subject of the deployment: its kind, the sending
// region, and for an ask or a repair the region it is for.
func (n Names) Parse(subject string) (k Kind, from, to string, ok bool) {
	rest, ok := strings.CutPrefix(subject, n.Prefix()+".")
	if !ok {
		return 0, "", "", false
	}
	name, rest, _ := strings.Cut(rest, ".")
	for k = Delta; k <= Heartbeat; k++ {
		if k.String() == name {
			break
		}
	}
	if k > Heartbeat {
		return 0, "", "", false
	}
	addressed := k == Repair || k == Ask
	if addressed {
		to, rest, _ = strings.Cut(rest, ".")
	}
	if !ValidName(rest) || (addressed && !ValidName(to)) {
		return 0, "", "", false
	}
	return k, rest, to, true
}

// ValidName reports whether a region's name can stand in a subject: one
// token, no wildcard, and short enough for the counters' encoding.
func ValidName(name string) bool {
	return name != "" && len(name) <= crdt.MaxRegionNameLen && !strings.ContainsAny(name, ".*> \t\r\n")
}
