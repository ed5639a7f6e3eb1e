package namespace

import (
	"slices"
	"strings"
	"testing"
)

func TestNames(t *testing.T) {
	var def Names
	prod, err := New("prod")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ got, want string }{
		{def.Delta("us"), "geoquota.delta.us"},
		{def.Ask("eu", "us"), "geoquota.ask.eu.us"},
		{def.Repair("eu", "us"), "geoquota.repair.eu.us"},
		{def.Heartbeat("ap"), "geoquota.heartbeat.ap"},
		{def.PushBudgets(), "geoquota.push.budgets"},
		{def.PushRules(), "geoquota.push.rules"},
		{def.BudgetsBucket(), "geoquota-budgets"},
		{def.RulesBucket(), "geoquota-rules"},
		{def.LeaderBucket(), "geoquota-leader"},
		{prod.Delta("us"), "geoquota.d.prod.delta.us"},
		{prod.Ask("eu", GlobalSync), "geoquota.d.prod.ask.eu.globalsync"},
		{prod.PushRules(), "geoquota.d.prod.push.rules"},
		{prod.BudgetsBucket(), "geoquota-prod-budgets"},
		{prod.LeaderBucket(), "geoquota-prod-leader"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
	for _, bad := range []string{"a.b", "a*", ">", "a b", strings.Repeat("x", MaxDeploymentLen+1), "é"} {
		if _, err := New(bad); err == nil || !strings.Contains(err.Error(), "deployment") {
			t.Errorf("New(%q): %v, want an error naming the deployment", bad, err)
		}
	}
}

func TestParse(t *testing.T) {
	prod, _ := New("prod")
	for _, n := range []Names{{}, prod} {
		for _, tc := range []struct {
			subject  string
			kind     Kind
			from, to string
		}{
			{n.Delta("us"), Delta, "us", ""},
			{n.Heartbeat("eu"), Heartbeat, "eu", ""},
			{n.Ask("eu", "us"), Ask, "us", "eu"},
			{n.Repair("us", GlobalSync), Repair, GlobalSync, "us"},
		} {
			k, from, to, ok := n.Parse(tc.subject)
			if !ok || k != tc.kind || from != tc.from || to != tc.to {
				t.Errorf("%q: %v %q %q %v, want %v %q %q", tc.subject, k, from, to, ok, tc.kind, tc.from, tc.to)
			}
		}
	}
	var def Names
	for _, s := range []string{
		prod.Delta("us"),        // another deployment's
		"geoquota.delta.us.eu",  // a region name of two tokens
		"geoquota.delta.",       // no region
		"geoquota.push.budgets", // not gossip
		"geoquota.ask.eu",       // no sender
		"geoquota.delta." + strings.Repeat("r", 300),
		"other.delta.us",
	} {
		if _, _, _, ok := def.Parse(s); ok {
			t.Errorf("%q parsed as gossip of the unnamed deployment", s)
		}
	}
}

// TestPermissionsStayInTheDeployment: every subject an identity may
// publish is under its deployment's prefix or names its deployment's
// buckets, and a region's gossip subjects carry its own name only.
func TestPermissionsStayInTheDeployment(t *testing.T) {
	prod, _ := New("prod")
	for _, p := range []Permissions{prod.Region("us"), prod.GlobalSync()} {
		for _, s := range p.Publish {
			ok := strings.HasPrefix(s, "geoquota.d.prod.") || strings.Contains(s, "geoquota-prod-") ||
				s == "$JS.API.INFO" || s == "$JS.FC.>" || s == "$JS.ACK.>"
			if !ok {
				t.Errorf("may publish %q, outside deployment prod", s)
			}
		}
	}
	for _, s := range prod.Region("us").Publish {
		if k, from, _, ok := prod.Parse(s); ok && from != "us" {
			t.Errorf("region us may publish %q, as %s (%v)", s, from, k)
		}
		if strings.HasPrefix(s, "$KV.") {
			t.Errorf("region us may write a bucket: %q", s)
		}
	}
}

// TestDeploymentsCannotReachEachOther: no subject one deployment's
// identities may publish or subscribe to (wildcards and all) matches a
// subject of another, whatever the names (those of subject kinds
// included).
func TestDeploymentsCannotReachEachOther(t *testing.T) {
	var all []Names
	for _, name := range []string{"", "ask", "delta", "repair", "heartbeat", "push", "d", "prod"} {
		n, err := New(name)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, n)
	}
	subjects := func(n Names) []string {
		return []string{n.Delta("us"), n.Delta("eu"), n.Ask("eu", "us"), n.Ask("us", GlobalSync), n.Repair("eu", "us"),
			n.Heartbeat("us"), n.PushBudgets(), n.PushRules(), n.Inbox("us") + ".x1", n.Inbox(GlobalSync) + ".x2"}
	}
	for _, a := range all {
		for _, b := range all {
			if a == b {
				continue
			}
			for _, p := range []Permissions{a.Region("us"), a.GlobalSync()} {
				for _, pattern := range append(slices.Clone(p.Publish), p.Subscribe...) {
					for _, s := range subjects(b) {
						if matches(pattern, s) {
							t.Errorf("deployment %q may use %q, which matches %q of deployment %q", a.Deployment(), pattern, s, b.Deployment())
						}
					}
				}
			}
		}
	}
}

// matches is NATS's subject matching: * one token, > the rest.
func matches(pattern, subject string) bool {
	p, s := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, tok := range p {
		if tok == ">" {
			return len(s) > i
		}
		if i >= len(s) || (tok != "*" && tok != s[i]) {
			return false
		}
	}
	return len(p) == len(s)
}

// TestInboxesApart: an identity may subscribe to its own replies alone.
func TestInboxesApart(t *testing.T) {
	var n Names
	for _, pattern := range n.Region("us").Subscribe {
		for _, other := range []string{n.Inbox("eu") + ".x", n.Inbox(GlobalSync) + ".x", "_INBOX.x"} {
			if matches(pattern, other) {
				t.Errorf("us may subscribe to %q, which matches %q", pattern, other)
			}
		}
	}
	if !slices.ContainsFunc(n.Region("us").Subscribe, func(p string) bool { return matches(p, n.Inbox("us")+".x") }) {
		t.Error("us may not subscribe to its own replies")
	}
}
