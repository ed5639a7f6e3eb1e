package control

import "testing"

// TestShardBudgetKey: a slice's key of a rule reads back as its slice;
// keys that are no rule's, or that spell a slice otherwise than
// ShardBudgetKey does, are not taken for one.
func TestShardBudgetKey(t *testing.T) {
	for _, shard := range []int{0, 1, 7, 63} {
		key := ShardBudgetKey("tenant.global", shard)
		if got, ok := ShardOfBudgetKey(key); !ok || got != shard {
			t.Errorf("ShardOfBudgetKey(%q) = %d, %v; want %d", key, got, ok, shard)
		}
	}
	if ShardBudgetKey("g", 0) != BudgetKey("g") {
		t.Errorf("slice 0's key %q, want the rule's %q", ShardBudgetKey("g", 0), BudgetKey("g"))
	}
	for _, key := range []string{"", "r.", "x.Zw", BudgetKey("g") + ".01", BudgetKey("g") + ".+1", BudgetKey("g") + ".0", BudgetKey("g") + ".64", BudgetKey("g") + ".a"} {
		if s, ok := ShardOfBudgetKey(key); ok {
			t.Errorf("ShardOfBudgetKey(%q) = %d: want no slice", key, s)
		}
	}
}
