// Package regional is the enforcement engine of one region: rules and their
// matching, the rate-limit algorithms (token bucket, sliding window log,
// sliding window counter, fixed window, GCRA), the Redis store that runs
// them as Lua scripts in one round trip per check, the in-memory store with
// the same semantics, and the fallbacks used when Redis fails.
//
// Status: not built yet; see the project README.
package regional
