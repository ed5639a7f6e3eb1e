package regional

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Violation is a denial, as the audit trail keeps it. Denials of the same
// counter (or blocked key) for the same reason between two flushes are one
// Violation with a Count, so that a flood costs one entry, not millions.
type Violation struct {
	ID         string // the entry's id in the log, when read back
	Time       time.Time
	Region     string
	Rule       string // "" for a blocked key
	Key        string // the counter's store key
	Code       string // RATE_LIMIT_EXCEEDED or KEY_BLOCKED
	APIKey     string
	IP         string
	Endpoint   string
	Limit      int64
	Cost       int64
	RetryAfter time.Duration
	Count      int64
}

// ViolationLog keeps the audit trail of denials. Implementations are safe
// for concurrent use.
type ViolationLog interface {
	// Append adds violations, oldest first.
	Append(ctx context.Context, vs []Violation) error
	// Recent returns up to n violations, newest first.
	Recent(ctx context.Context, n int) ([]Violation, error)
}

// violationBuffer gathers violations between flushes.
type violationBuffer struct {
	mu      sync.Mutex
	max     int
	pending map[Code]map[string]*Violation
	order   []*Violation
	gen     uint64 // flushes so far
}

// violationRef is where a denial keeps its counter's violation of a
// flush (gen), so that the checks it denies count it without looking it
// up. Guarded by the buffer's lock.
type violationRef struct {
	v   *Violation
	gen uint64
}

// add counts a denial of id (a counter's key, or a blocked API key) for
// code, and builds its Violation with mk only if it is the first since the
// last flush, so that a flood allocates nothing.
//
// ref, if not nil, is the denial's reference to id's violation for code:
// counted through it if it is of this flush, and set to it otherwise.
func (b *violationBuffer) add(e *Engine, code Code, id []byte, ref *violationRef, mk func() Violation) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ref != nil && ref.v != nil && ref.gen == b.gen {
		ref.v.Count++
		return
	}
	if b.pending == nil {
		b.pending = map[Code]map[string]*Violation{}
	}
	m := b.pending[code]
	if m == nil {
		m = map[string]*Violation{}
		b.pending[code] = m
	}
	if old := m[string(id)]; old != nil {
		old.Count++
		if ref != nil {
			ref.v, ref.gen = old, b.gen
		}
		return
	}
	if len(b.order) >= b.max {
		e.stats.ViolationsDropped.Add(1)
		return
	}
	v := mk()
	v.Region, v.Code, v.Count = e.cfg.Region, code.String(), 1
	m[string(id)] = &v
	b.order = append(b.order, &v)
	if ref != nil {
		ref.v, ref.gen = &v, b.gen
	}
}

func (b *violationBuffer) drain() []Violation {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]Violation, len(b.order))
	for i, v := range b.order {
		out[i] = *v
	}
	b.order, b.pending = b.order[:0], nil
	b.gen++
	return out
}

// RedisViolations keeps the audit trail in a Redis stream per region,
// trimmed to about MaxLen entries (XADD … MAXLEN ~).
type RedisViolations struct {
	client redis.UniversalClient
	key    string
	maxLen int64
}

// NewRedisViolations returns the audit trail of a region in the stream
// gq:violations:{region}, keeping about maxLen entries (0 means 10,000).
func NewRedisViolations(client redis.UniversalClient, region string, maxLen int64) *RedisViolations {
	if maxLen <= 0 {
		maxLen = 10_000
	}
	return &RedisViolations{client: client, key: "gq:violations:{" + region + "}", maxLen: maxLen}
}

// Key returns the stream's key.
func (r *RedisViolations) Key() string { return r.key }

// Append implements ViolationLog.
func (r *RedisViolations) Append(ctx context.Context, vs []Violation) error {
	if len(vs) == 0 {
		return nil
	}
	pipe := r.client.Pipeline()
	for _, v := range vs {
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: r.key, MaxLen: r.maxLen, Approx: true, Values: []any{
			"time", v.Time.UTC().Format(time.RFC3339Nano), "region", v.Region, "rule", v.Rule, "key", v.Key,
			"code", v.Code, "api_key", v.APIKey, "ip", v.IP, "endpoint", v.Endpoint,
			"limit", v.Limit, "cost", v.Cost, "retry_after_ms", v.RetryAfter.Milliseconds(), "count", v.Count,
		}})
	}
	_, err := pipe.Exec(ctx)
	return err
}

// Recent implements ViolationLog.
func (r *RedisViolations) Recent(ctx context.Context, n int) ([]Violation, error) {
	msgs, err := r.client.XRevRangeN(ctx, r.key, "+", "-", int64(n)).Result()
	if err != nil {
		return nil, err
	}
	out := make([]Violation, 0, len(msgs))
	for _, m := range msgs {
		str := func(k string) string { s, _ := m.Values[k].(string); return s }
		num := func(k string) int64 { n, _ := strconv.ParseInt(str(k), 10, 64); return n }
		at, _ := time.Parse(time.RFC3339Nano, str("time"))
		out = append(out, Violation{ID: m.ID, Time: at, Region: str("region"), Rule: str("rule"), Key: str("key"),
			Code: str("code"), APIKey: str("api_key"), IP: str("ip"), Endpoint: str("endpoint"),
			Limit: num("limit"), Cost: num("cost"), RetryAfter: time.Duration(num("retry_after_ms")) * time.Millisecond,
			Count: num("count")})
	}
	return out, nil
}

// MemoryViolations keeps the last MaxLen violations in memory (--dev).
type MemoryViolations struct {
	mu     sync.Mutex
	maxLen int
	seq    int64
	vs     []Violation
}

// NewMemoryViolations keeps the last maxLen violations (0 means 10,000).
func NewMemoryViolations(maxLen int) *MemoryViolations {
	if maxLen <= 0 {
		maxLen = 10_000
	}
	return &MemoryViolations{maxLen: maxLen}
}

// Append implements ViolationLog.
func (m *MemoryViolations) Append(_ context.Context, vs []Violation) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, v := range vs {
		m.seq++
		v.ID = strconv.FormatInt(m.seq, 10)
		m.vs = append(m.vs, v)
	}
	if over := len(m.vs) - m.maxLen; over > 0 {
		m.vs = append(m.vs[:0], m.vs[over:]...)
	}
	return nil
}

// Recent implements ViolationLog.
func (m *MemoryViolations) Recent(_ context.Context, n int) ([]Violation, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Violation, 0, min(n, len(m.vs)))
	for i := len(m.vs) - 1; i >= 0 && len(out) < n; i-- {
		out = append(out, m.vs[i])
	}
	return out, nil
}

// RedactKey stands in for an API key, or a counter key holding one, where
// it should not be read: "sha256:" and the first 16 hex digits of its
// SHA-256, the same for the same key, so that an operator who knows a key
// can find it (printf %s KEY | sha256sum | cut -c1-16). Empty stays empty.
func RedactKey(key string) string {
	if key == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:8])
}

// redacted returns v with its keys redacted (RedactKey).
func (v Violation) redacted() Violation {
	v.Key, v.APIKey = RedactKey(v.Key), RedactKey(v.APIKey)
	return v
}
