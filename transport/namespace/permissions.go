package namespace

// Permissions are the NATS subjects one of a deployment's identities may
// publish and subscribe to: what a NATS server's authorization gives it
// (deploy/nats/accounts.conf, and deploy/local's servers, are written from
// these). A reply to a request it received is allowed besides
// (allow_responses); replies to its own requests come to its Inbox.
type Permissions struct {
	Publish, Subscribe []string
}

// Region returns a region's regiond replicas' permissions: gossip under
// the region's own name only; the JetStream calls that read and watch the
// budgets and rules buckets, and nothing that writes them.
func (n Names) Region(region string) Permissions {
	pub := []string{n.Delta(region), n.Heartbeat(region), n.Ask("*", region), n.Repair("*", region),
		"$JS.API.INFO", "$JS.FC.>"}
	for _, b := range []string{n.BudgetsBucket(), n.RulesBucket()} {
		stream := "KV_" + b
		pub = append(pub, "$JS.API.STREAM.INFO."+stream,
			"$JS.API.CONSUMER.CREATE."+stream, "$JS.API.CONSUMER.CREATE."+stream+".>",
			"$JS.API.CONSUMER.INFO."+stream+".>", "$JS.API.CONSUMER.DELETE."+stream+".>",
			"$JS.API.STREAM.MSG.GET."+stream, "$JS.API.DIRECT.GET."+stream, "$JS.API.DIRECT.GET."+stream+".>")
	}
	return Permissions{Publish: pub, Subscribe: append(n.Subscriptions(), n.Inbox(region)+".>")}
}

// GlobalSync returns globalsync's permissions: its own asks, the pushes of
// budgets and rules, and the JetStream API of the deployment's buckets
// alone, under which it makes and writes them. Nothing it may publish
// passes for a region's gossip, or touches another deployment's buckets.
func (n Names) GlobalSync() Permissions {
	pub := []string{n.Ask("*", GlobalSync), n.PushBudgets(), n.PushRules(), "$JS.API.INFO", "$JS.FC.>", "$JS.ACK.>"}
	for _, b := range []string{n.BudgetsBucket(), n.RulesBucket(), n.LeaderBucket()} {
		stream := "KV_" + b
		pub = append(pub, "$KV."+b+".>", "$JS.API.STREAM.*."+stream, "$JS.API.STREAM.MSG.GET."+stream,
			"$JS.API.CONSUMER.*."+stream, "$JS.API.CONSUMER.*."+stream+".>",
			"$JS.API.DIRECT.GET."+stream, "$JS.API.DIRECT.GET."+stream+".>")
	}
	return Permissions{Publish: pub, Subscribe: append(n.Subscriptions(), n.Inbox(GlobalSync)+".>")}
}
