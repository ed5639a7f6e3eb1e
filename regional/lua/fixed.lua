-- fixed.lua: one fixed window checked alone (a request that meets one
-- limit, not global): the FIXED case of limits.lua, with nothing else for
-- Redis to run. It reads and writes the state limits.lua does (head.lua),
-- and decides alike to the bit (TestStoresDecideAlike runs both).
--
-- KEYS[1]: the counter key.
-- ARGV: now in µs (tests only) or '', minimum TTL in ms (tests only) or '',
--       limit, window in µs, cost, batch (0: none; else take up to batch,
--       at least cost).
-- Returns {now, allowed (0/1), remaining, reset_at, retry_after, taken}.

local floor, max, min = math.floor, math.max, math.min
-- now, read_state and write_state: head.lua, which the store puts first.
local limit, window, cost, batch = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local key = KEYS[1]
local ex, a, b = read_state(key, 4)
local start = floor(now / window) * window
local n = 0
if ex and a == start then n = b end
if batch > 0 then cost = max(cost, min(batch, limit - n)) end
local allowed, retry = 0, 0
if n + cost <= limit then
  allowed = 1
  n = n + cost
  write_state(key, 4, start, n, 0, start + window)
else
  -- The count is this window's, over the limit: the next window takes
  -- the cost (exactWait in limits.lua finds the same, the cost being at
  -- most the limit).
  retry = max(1, start + window - now)
end
return {now, allowed, limit - n, start + window, retry, allowed * cost}
