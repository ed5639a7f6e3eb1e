package namespace

import (
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
		{prod.Delta("us"), "geoquota.prod.delta.us"},
		{prod.Ask("eu", GlobalSync), "geoquota.prod.ask.eu.globalsync"},
		{prod.PushRules(), "geoquota.prod.push.rules"},
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
			ok := strings.HasPrefix(s, "geoquota.prod.") || strings.Contains(s, "geoquota-prod-") ||
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
