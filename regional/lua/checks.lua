-- checks.lua: checks of one limit each, a token bucket or a fixed window,
-- not global (the common case), as many as the store gathered in one
-- pipeline: what limits.lua does for each, with nothing else for Redis to
-- run, and one script call for them all (a call costs Redis more than a
-- check: docs/benchmarks.md). The checks run in turn, as separate calls
-- would. It reads and writes the state limits.lua does (head.lua), and
-- decides a token bucket with the same tb_decide (wait.lua, through
-- plain.lua); TestStoresDecideAlike holds both to the in-memory store.
--
-- KEYS: per check, its counter key.
-- ARGV: now in µs (tests only) or '', minimum TTL in ms (tests only) or '',
--       then per check 5 values: algorithm (1 token bucket, 4 fixed
--       window), limit, refill per second (%.17g) or window (µs), cost,
--       batch (0: none; -1: debt, the cost counted whatever the decision,
--       as limits.lua's charge counts it; else take up to batch, at least
--       cost).
-- Returns {now, then per check: allowed (0/1), remaining, reset_at,
-- retry_after, taken}.

-- now and read_state: head.lua; plain and plain_args: plain.lua; the
-- store puts them first, with wait.lua.
local bad = plain_args('checks.lua', 1, 5)
if bad then return bad end
local out, o, j = {now}, 1, 3
for k = 1, #KEYS do
  local key, alg = KEYS[k], tonumber(ARGV[j])
  out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] =
    plain(key, alg, tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2]), tonumber(ARGV[j + 3]), tonumber(ARGV[j + 4]), read_state(key, alg))
  o = o + 5
  j = j + 5
end
return out
