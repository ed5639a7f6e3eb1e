package control

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport/namespace"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// RulesKey is the key of the rules (the YAML of a rules file) in the rules
// bucket (namespace.Names.RulesBucket), where globalsync publishes them and
// every regiond watches: a published change is in force in every region
// within a second or two.
const RulesKey = "rules"

// RulesBucketConfig is the rules bucket's configuration.
func RulesBucketConfig(n namespace.Names) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: n.RulesBucket(), History: 8,
		Description: "geoquota rules, as YAML, for every region"}
}

// PublishRules puts rules (YAML) in the bucket, after checking that they
// compile: an invalid set is refused here rather than in every region.
func PublishRules(ctx context.Context, kv jetstream.KeyValue, yaml []byte) (uint64, error) {
	if _, err := regional.Parse("published rules", yaml); err != nil {
		return 0, err
	}
	return kv.Put(ctx, RulesKey, yaml)
}

// WatchRules puts the rules published in the bucket in force in the
// engine, until ctx ends: each published set as it comes, from the bucket
// or pushed by globalsync (PushRules), once, in the order of their
// revisions (an invalid one is rejected whole, logged and counted, and the
// last good rules stay). Whatever changed last, the rules file or the
// bucket, is in force: a revision already applied is not applied again
// over a rules file edited since.
func WatchRules(ctx context.Context, js jetstream.JetStream, s namespace.Names, e *regional.Engine, log *slog.Logger, resync *Resync) {
	var mu sync.Mutex
	var applied uint64 // the last revision put in force, or found in force
	apply := func(rev uint64, value []byte, fromBucket bool) {
		mu.Lock()
		defer mu.Unlock()
		if fromBucket && rev < applied {
			applied = 0 // the bucket was made anew: its revisions start again
		}
		if rev <= applied {
			return
		}
		applied = rev
		if bytes.Equal(value, e.Rules().YAML()) {
			return
		}
		source := fmt.Sprintf("%s/%s@%d", s.RulesBucket(), RulesKey, rev)
		if rs, err := e.PutRules(source, value); err != nil {
			log.Error("published rules rejected; the last good rules stay in force", "revision", rev, "error", err)
		} else {
			log.Info("published rules in force", "revision", rev, "rules", len(rs.Rules()))
			for _, w := range rs.Warnings() {
				log.Warn("published rules: read and not enforced", "revision", rev, "warning", w)
			}
		}
	}
	if sub, err := js.Conn().Subscribe(s.PushRules(), func(m *nats.Msg) {
		if rev := pushedRevision(m); rev > 0 {
			apply(rev, m.Data, false)
		}
	}); err != nil {
		log.Warn("rules: not subscribed to pushed rules; the bucket alone brings them", "err", err)
	} else {
		defer sub.Unsubscribe()
	}
	watchKV(ctx, js, s.RulesBucket(), RulesKey, log, resync, func(en jetstream.KeyValueEntry) { apply(en.Revision(), en.Value(), true) })
}
