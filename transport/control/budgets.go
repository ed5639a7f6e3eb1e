package control

import (
	"context"
	"encoding/base64"
	"log/slog"
	"strconv"
	"strings"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/budget/coord"
	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport/namespace"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The budgets bucket (namespace.Names.BudgetsBucket) is where globalsync
// publishes the leases of every global rule, one key per rule
// (BudgetKey), and every regiond watches it.

// BudgetKey is a rule's key in the bucket: its id, base64url-encoded, so
// that any rule id makes a valid key.
func BudgetKey(rule string) string { return "r." + base64.RawURLEncoding.EncodeToString([]byte(rule)) }

// ShardBudgetKey is the key of a rule's documents of one slice of its
// counters, when globalsync runs as several instances (budget.ShardOf):
// BudgetKey for slice 0, and BudgetKey, a dot and the slice's number for
// the others.
func ShardBudgetKey(rule string, shard int) string {
	if shard == 0 {
		return BudgetKey(rule)
	}
	return BudgetKey(rule) + "." + strconv.Itoa(shard)
}

// ShardOfBudgetKey returns the slice a budget key is of (see
// ShardBudgetKey), and false for a key that is no rule's.
func ShardOfBudgetKey(key string) (int, bool) {
	rest, ok := strings.CutPrefix(key, "r.")
	if !ok || rest == "" {
		return 0, false
	}
	_, n, sliced := strings.Cut(rest, ".")
	if !sliced {
		return 0, true
	}
	i, err := strconv.Atoi(n)
	if err != nil || i <= 0 || i >= budget.MaxShards || strconv.Itoa(i) != n {
		return 0, false
	}
	return i, true
}

// BudgetsBucketConfig is the budgets bucket's configuration: it keeps
// enough of each rule's documents (coord.History) to cover a lease's life,
// so that a globalsync taking over knows every lease still in force.
func BudgetsBucketConfig(n namespace.Names) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: n.BudgetsBucket(), History: coord.History,
		Description: "geoquota budget leases, one key per global rule"}
}

// LeaderKey is the key of the leading globalsync's claim in the leader
// bucket (namespace.Names.LeaderBucket), taken and renewed with
// compare-and-swap.
const LeaderKey = "globalsync"

// ShardLeaderKey is the key of the claim of the leader of one slice of the
// counters, when globalsync runs as several instances: LeaderKey for
// slice 0, and LeaderKey, a dot and the slice's number for the others.
func ShardLeaderKey(shard int) string {
	if shard == 0 {
		return LeaderKey
	}
	return LeaderKey + "." + strconv.Itoa(shard)
}

// LeaderBucketConfig is the leader bucket's configuration.
func LeaderBucketConfig(n namespace.Names) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: n.LeaderBucket(), Description: "the claim of the leading globalsync"}
}

// WatchBudgets keeps the engine's lease current from the bucket until ctx
// ends (and notes the other regions' leases, for usage reports), waiting
// for the bucket if globalsync has not made it yet and watching again
// after errors; and takes the documents globalsync pushes (PushBudget) as
// they come.
func WatchBudgets(ctx context.Context, js jetstream.JetStream, s namespace.Names, e *regional.Engine, log *slog.Logger, resync *Resync) {
	apply := func(key string, value []byte) {
		d, err := budget.DecodeDocument(value)
		if err != nil {
			log.Warn("budgets: bad document ignored", "key", key, "err", err)
			return
		}
		e.SetBudget(d) // ours in force (if newer than the one held); the others' noted for usage reports
	}
	if sub, err := js.Conn().Subscribe(s.PushBudgets(), func(m *nats.Msg) { apply("pushed", m.Data) }); err != nil {
		log.Warn("budgets: not subscribed to pushed documents; the bucket alone keeps the lease", "err", err)
	} else {
		defer sub.Unsubscribe()
	}
	watchKV(ctx, js, s.BudgetsBucket(), jetstream.AllKeys, log, resync, func(en jetstream.KeyValueEntry) { apply(en.Key(), en.Value()) })
}
