// Package control is the control plane's adapters: what carries the
// coordination protocols between processes.
//
//   - Gossip carries a gossip node (transport/gossip) over NATS: it hands
//     every message on the node's subjects to Node.Step, ticks the node
//     when it is due, and publishes what the node returns.
//   - The budgets bucket (JetStream KV, namespace.Names.BudgetsBucket: one
//     key per global rule, BudgetKey) holds the budget documents the
//     leading globalsync writes; WatchBudgets puts a region's lease in force
//     from it, and from the documents globalsync also pushes (PushBudget).
//     The rules bucket (RulesBucket) and WatchRules do the same for published rules, once
//     per revision; the leader bucket holds the leading globalsync's
//     claim. Resync makes the watches again, beside the ones in place,
//     when the gossip hears a region again after a silence: a watch
//     through a NATS gateway that was cut may not notice by itself.
//   - Members joins a region's replicas with memberlist: the first alive,
//     by name, is elected to ask the other regions for what the region
//     lacks and to send back a region's lost slots, and a replica
//     tells its siblings of keys it found over their limits.
//
// Every byte that arrives is checked by what it is handed to: the gossip
// node, budget.DecodeDocument, regional.Parse.
package control
