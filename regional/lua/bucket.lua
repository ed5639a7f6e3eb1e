-- bucket.lua: one token bucket checked alone (a request that meets one
-- limit, not global): the TOKEN_BUCKET case of limits.lua, with nothing
-- else for Redis to run. Both decide with tb_decide (wait.lua) and keep
-- the same state (head.lua); TestStoresDecideAlike runs both.
--
-- KEYS[1]: the counter key.
-- ARGV: now in µs (tests only) or '', minimum TTL in ms (tests only) or '',
--       capacity, refill per second (%.17g), cost, batch (0: none; else
--       take up to batch, at least cost).
-- Returns {now, allowed (0/1), remaining, reset_at, retry_after, taken}.

-- now, read_state and write_state: head.lua; tb_decide and tb_until:
-- wait.lua; the store puts both first.
local limit, rate, cost, batch = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local key = KEYS[1]
local ex, a, b = read_state(key, 1)
local allowed, taken, tokens, retry, reset, na, nb = tb_decide(limit, rate, ex, a, b, cost, batch > 0, batch)
if allowed then
  write_state(key, 1, na, nb, 0, tb_until(limit, rate, na))
  return {now, 1, floor(tokens), reset, retry, taken}
end
return {now, 0, floor(tokens), reset, retry, 0}
