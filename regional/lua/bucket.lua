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

local floor, ceil, max, min = math.floor, math.ceil, math.max, math.min
local call = redis.call
local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local min_ttl = tonumber(ARGV[2]) or 0
local limit, rate, cost, batch = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local key = KEYS[1]

-- exactWait as in limits.lua, with tb_has as its predicate.
local ex, a, b = false, 0, 0
local function tokens_at(t)
  if not ex then return limit end
  return min(limit, a + max(0, t - b) * rate / 1e6)
end
local function exactWait(t0, wait, need)
  local w = max(1, ceil(wait))
  local lo, hi = 0, 0
  if tokens_at(t0 + w) >= need then
    if w == 1 or not (tokens_at(t0 + w - 1) >= need) then return w end
    hi = w - 1
    local step = 1
    for _ = 1, 64 do
      lo = max(0, hi - step)
      if lo == 0 or not (tokens_at(t0 + lo) >= need) then break end
      hi, step = lo, step * 2
    end
  else
    lo = w
    local step = 1
    for _ = 1, 64 do
      hi = lo + step
      if tokens_at(t0 + hi) >= need then break end
      lo, step = hi, step * 2
    end
  end
  while hi - lo > 1 do
    local mid = lo + floor((hi - lo) / 2)
    if tokens_at(t0 + mid) >= need then hi = mid else lo = mid end
  end
  return hi
end

local v = call('GET', key)
if v then
  local sa, x, y = string.match(v, '^(%d+) (%S+) (%S+) (%S+)$')
  if tonumber(sa) == 1 then ex, a, b = true, tonumber(x), tonumber(y) end
end
local tokens = tokens_at(now)
if batch > 0 then cost = max(cost, min(batch, floor(tokens))) end
local allowed, reset, retry = 0, now, 0
if tokens >= cost then
  allowed = 1
  tokens = tokens - cost
  ex, a, b = true, tokens, now
else
  retry = exactWait(now, (cost - tokens) * 1e6 / rate, cost)
end
if tokens < limit then
  reset = now + exactWait(now, (limit - tokens) * 1e6 / rate, limit)
end
if allowed == 1 then
  local until_us = now + ceil((limit - a) * 1e6 / rate) + 1000
  call('SET', key, string.format('%d %.17g %.17g %.17g', 1, a, b, 0), 'PX',
    string.format('%d', max(min_ttl, floor(max(1, until_us - now) / 1000) + 1)))
end
return {now, allowed, floor(tokens), reset, retry, allowed * cost}
