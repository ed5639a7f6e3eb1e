-- bucket.lua: one token bucket checked alone (a request that meets one
-- limit, not global): the TOKEN_BUCKET case of limits.lua, with nothing
-- else for Redis to run. It reads and writes the state limits.lua does,
-- and decides alike to the bit (TestStoresDecideAlike runs both).
--
-- KEYS[1]: the counter key.
-- ARGV: now in µs (tests only) or '', minimum TTL in ms (tests only) or '',
--       capacity, refill per second (%.17g), cost, batch (0: none; else
--       take up to batch, at least cost).
-- Returns {now, allowed (0/1), remaining, reset_at, retry_after, taken}.

-- now and min_ttl: head.lua; floor, ceil, max, min, exactWait, tb_tokens and
-- tb_has: wait.lua; the store puts both first.
local call = redis.call
local limit, rate, cost, batch = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local key = KEYS[1]

local ex, a, b = false, 0, 0
local v = call('GET', key)
if v then
  local sa, x, y = string.match(v, '^(%d+) (%S+) (%S+) (%S+)$')
  if tonumber(sa) == 1 then ex, a, b = true, tonumber(x), tonumber(y) end
end
local tokens = tb_tokens(limit, rate, ex, a, b, now)
if batch > 0 then cost = max(cost, min(batch, floor(tokens))) end
local allowed, reset, retry = 0, now, 0
if tokens >= cost then
  allowed = 1
  tokens = tokens - cost
  ex, a, b = true, tokens, now
else
  retry = exactWait(now, (cost - tokens) * 1e6 / rate, tb_has, limit, rate, ex, a, b, cost)
end
if tokens < limit then
  reset = now + exactWait(now, (limit - tokens) * 1e6 / rate, tb_has, limit, rate, ex, a, b, limit)
end
if allowed == 1 then
  local until_us = now + ceil((limit - a) * 1e6 / rate) + 1000
  call('SET', key, string.format('%d %.17g %.17g %.17g', 1, a, b, 0), 'PX',
    string.format('%d', max(min_ttl, floor(max(1, until_us - now) / 1000) + 1)))
end
return {now, allowed, floor(tokens), reset, retry, allowed * cost}
