-- limits.lua: the rate-limit algorithms of regional/algorithm.go, in Lua,
-- operation for operation, so that the Redis and in-memory stores decide
-- alike to the bit.
--
-- KEYS: per limit, its counter key; a sliding_window_log limit also its log
--       key (a sorted set of "seq:cost" members scored by time).
-- ARGV[1]: now in microseconds (tests only), or '' to use the server's TIME
-- ARGV[2]: minimum TTL in milliseconds (tests only), or ''
-- ARGV[3]: mode: 'check', 'inspect' or 'grant'
-- ARGV[4]: grant amount ('grant' only)
-- ARGV[5...]: per limit 7 values: algorithm, limit, rate, window, cost,
--            shadow, lease (0: none; else take up to lease, at least cost)
--
-- Returns {now, then per limit: allowed (0/1), remaining, reset_at,
-- retry_after, taken}.
--
-- Every number sent to Redis is formatted with %.17g: Lua's own conversion
-- keeps 14 digits, and a time in microseconds has 16.

local floor, ceil, max, min = math.floor, math.ceil, math.max, math.min
local TOKEN_BUCKET, LOG, COUNTER, FIXED, GCRA = 1, 2, 3, 4, 5
local TB_EXPIRY_MARGIN = 1000

local function fmt(x) return string.format('%.17g', x) end

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local min_ttl = tonumber(ARGV[2]) or 0
local mode = ARGV[3]
local grant_n = tonumber(ARGV[4]) or 0

local function settle(t0, wait, allows)
  wait = max(1, ceil(wait))
  local i = 0
  while i < 16 and wait > 1 and allows(t0 + wait - 1) do wait = wait - 1; i = i + 1 end
  i = 0
  while i < 16 and not allows(t0 + wait) do wait = wait + 1; i = i + 1 end
  return wait
end

local function load(key)
  local v = redis.call('GET', key)
  if not v then return nil end
  local s = {}
  for x in string.gmatch(v, '%S+') do s[#s + 1] = tonumber(x) end
  return s
end

-- Token bucket: s = {tokens, last}.
local function tb_tokens(limit, rate, s, t)
  if not s then return limit end
  local elapsed = max(0, t - s[2])
  return min(limit, s[1] + elapsed * rate / 1e6)
end

local function token_bucket(l, s, cost)
  local limit, rate = l.limit, l.rate
  local tokens = tb_tokens(limit, rate, s, now)
  local allowed, retry, ns = false, 0, nil
  if tokens >= cost then
    allowed = true
    tokens = tokens - cost
    ns = {tokens, now}
  else
    retry = settle(now, (cost - tokens) * 1e6 / rate, function(t) return tb_tokens(limit, rate, s, t) >= cost end)
  end
  local st = ns or s
  local reset = now
  if tokens < limit then
    reset = reset + settle(now, (limit - tokens) * 1e6 / rate, function(t) return tb_tokens(limit, rate, st, t) >= limit end)
  end
  return allowed, floor(tokens), reset, retry, ns
end

-- GCRA: s = {tat}.
local function gcra(l, s, cost)
  local interval = 1e6 / l.rate
  local tolerance = l.limit * interval
  local function arrival(t)
    if s then return max(s[1], t) end
    return t
  end
  local tat = arrival(now)
  local nxt = tat + cost * interval
  local allowed, retry, ns = false, 0, nil
  if now >= nxt - tolerance then
    allowed = true
    tat = nxt
    ns = {nxt}
  else
    retry = settle(now, nxt - tolerance - now, function(t) return t >= arrival(t) + cost * interval - tolerance end)
  end
  return allowed, floor((tolerance - (tat - now)) / interval), ceil(tat), retry, ns
end

-- Fixed window: s = {start, count}.
local function fw_count(window, s, t)
  local start = floor(t / window) * window
  if s and s[1] == start then return start, s[2] end
  return start, 0
end

local function fixed_window(l, s, cost)
  local limit, window = l.limit, l.window
  local start, n = fw_count(window, s, now)
  local allowed, retry, ns = false, 0, nil
  if n + cost <= limit then
    allowed = true
    n = n + cost
    ns = {start, n}
  else
    retry = settle(now, start + window - now, function(t)
      local _, m = fw_count(window, s, t)
      return m + cost <= limit
    end)
  end
  return allowed, limit - n, start + window, retry, ns
end

-- Sliding window counter: s = {start, current, previous}.
local function swc_counts(window, s, t)
  local start = floor(t / window) * window
  local cur, prev = 0, 0
  if s then
    if s[1] == start then
      cur, prev = s[2], s[3]
    elseif s[1] == start - window then
      prev = s[2]
    end
  end
  return start, cur, prev
end

local function swc_estimate(window, start, cur, prev, t)
  return prev * ((window - (t - start)) / window) + cur
end

local function sliding_counter(l, s, cost)
  local limit, window = l.limit, l.window
  local start, cur, prev = swc_counts(window, s, now)
  local allowed, retry, ns = false, 0, nil
  if swc_estimate(window, start, cur, prev, now) + cost <= limit then
    allowed = true
    cur = cur + cost
    ns = {start, cur, prev}
  else
    local at
    if cur + cost <= limit then
      at = start + (window - (limit - cur - cost) * window / prev)
    else
      at = start + window + max(0, window - (limit - cost) * window / cur)
    end
    retry = settle(now, at - now, function(t)
      local st, c, p = swc_counts(window, s, t)
      return swc_estimate(window, st, c, p, t) + cost <= limit
    end)
  end
  local reset = now
  if cur > 0 then
    reset = start + 2 * window
  elseif prev > 0 then
    reset = start + window
  end
  return allowed, floor(limit - swc_estimate(window, start, cur, prev, now)), reset, retry, ns
end

-- Sliding window log: s = {sum, seq}; the log key holds the entries.
local function member_cost(m) return tonumber(string.match(m, ':(.+)$')) end

local function sliding_log(l, s, cost)
  local limit, window = l.limit, l.window
  local cut = now - window
  local sum, seq = 0, 0
  if s then sum, seq = s[1], s[2] end
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', l.logkey, '-inf', fmt(cut))) do
    sum = sum - member_cost(m)
  end
  local allowed, retry, ns = false, 0, nil
  local newest = nil
  if sum + cost <= limit then
    allowed = true
    if cost > 0 then
      sum = sum + cost
      ns = {sum, seq + 1}
      newest = now
    end
  else
    local live = redis.call('ZRANGEBYSCORE', l.logkey, '(' .. fmt(cut), '+inf', 'WITHSCORES')
    local freed = 0
    for i = 1, #live, 2 do
      freed = freed + member_cost(live[i])
      if sum - freed + cost <= limit then
        retry = tonumber(live[i + 1]) + window - now
        break
      end
    end
  end
  if not newest then
    local last = redis.call('ZREVRANGEBYSCORE', l.logkey, '+inf', '(' .. fmt(cut), 'WITHSCORES', 'LIMIT', 0, 1)
    if #last > 0 then newest = tonumber(last[2]) end
  end
  local reset = now
  if newest then reset = newest + window end
  return allowed, limit - sum, reset, retry, ns
end

local decide = {[TOKEN_BUCKET] = token_bucket, [GCRA] = gcra, [FIXED] = fixed_window,
  [COUNTER] = sliding_counter, [LOG] = sliding_log}

-- ttl mirrors ttl() in algorithm.go, in µs; Redis keeps milliseconds, so
-- the key lives a little longer, which changes nothing.
local function ttl_ms(l, ns)
  local until_us
  if l.algorithm == TOKEN_BUCKET then
    until_us = now + ceil((l.limit - ns[1]) * 1e6 / l.rate) + TB_EXPIRY_MARGIN
  elseif l.algorithm == GCRA then
    until_us = ceil(ns[1])
  elseif l.algorithm == FIXED then
    until_us = ns[1] + l.window
  elseif l.algorithm == COUNTER then
    until_us = ns[1] + 2 * l.window
  else
    until_us = l.newest + l.window
  end
  return max(min_ttl, floor(max(1, until_us - now) / 1000) + 1)
end

local function store(l, ns)
  local parts = {}
  for i, x in ipairs(ns) do parts[i] = fmt(x) end
  redis.call('SET', l.key, table.concat(parts, ' '), 'PX', fmt(ttl_ms(l, ns)))
end

-- Grant mirrors grant() in memory.go: the state after giving n back.
local function granted(l, s, n)
  local a = l.algorithm
  if a == TOKEN_BUCKET then
    return {min(l.limit, tb_tokens(l.limit, l.rate, s, now) + n), now}
  elseif a == GCRA then
    local tat = now
    if s then tat = max(s[1], now) end
    return {max(now, tat - n * (1e6 / l.rate))}
  elseif a == FIXED then
    local start, count = fw_count(l.window, s, now)
    return {start, count - n}
  elseif a == COUNTER then
    local start, cur, prev = swc_counts(l.window, s, now)
    return {start, cur - n, prev}
  end
  -- The log forgets its newest n units, at most what the window holds.
  local cut = now - l.window
  redis.call('ZREMRANGEBYSCORE', l.logkey, '-inf', fmt(cut))
  local live = redis.call('ZREVRANGEBYSCORE', l.logkey, '+inf', '-inf', 'WITHSCORES')
  local sum = 0
  for i = 1, #live, 2 do sum = sum + member_cost(live[i]) end
  for i = 1, #live, 2 do
    if n <= 0 then break end
    local m, at = live[i], live[i + 1]
    local c = member_cost(m)
    local take = min(n, c)
    redis.call('ZREM', l.logkey, m)
    if c - take > 0 then
      redis.call('ZADD', l.logkey, at, string.match(m, '^(.-):') .. ':' .. fmt(c - take))
    end
    sum, n = sum - take, n - take
  end
  local seq = 0
  if s then seq = s[2] end
  return {sum, seq}
end

-- Read the limits.
local limits, k = {}, 1
local i = 5
while i + 6 <= #ARGV do
  local l = {algorithm = tonumber(ARGV[i]), limit = tonumber(ARGV[i + 1]), rate = tonumber(ARGV[i + 2]),
    window = tonumber(ARGV[i + 3]), cost = tonumber(ARGV[i + 4]), shadow = ARGV[i + 5] == '1',
    lease = tonumber(ARGV[i + 6]), key = KEYS[k]}
  k = k + 1
  if l.algorithm == LOG then
    l.logkey = KEYS[k]
    k = k + 1
  end
  limits[#limits + 1] = l
  i = i + 7
end

if mode == 'grant' then
  for _, l in ipairs(limits) do
    local ns = granted(l, load(l.key), grant_n)
    if l.algorithm == LOG then
      if ns[1] == 0 and redis.call('ZCARD', l.logkey) == 0 then
        redis.call('DEL', l.key)
      else
        l.newest = now
        store(l, ns)
        redis.call('PEXPIRE', l.logkey, fmt(ttl_ms(l, ns)))
      end
    else
      store(l, ns)
    end
    l.cost = 0
  end
  mode = 'inspect'
end

-- Decide every limit, changing nothing yet.
local out, commit, decided = {now}, true, {}
for _, l in ipairs(limits) do
  local s = load(l.key)
  local cost = l.cost
  if mode == 'inspect' then
    cost = 0
  elseif l.lease > 0 then
    local _, avail = decide[l.algorithm](l, s, 0)
    cost = max(l.cost, min(l.lease, avail))
  end
  l.cost = cost
  local allowed, remaining, reset, retry, ns = decide[l.algorithm](l, s, cost)
  decided[#decided + 1] = {allowed, ns}
  if not allowed and not l.shadow then commit = false end
  out[#out + 1] = allowed and 1 or 0
  out[#out + 1] = remaining
  out[#out + 1] = reset
  out[#out + 1] = retry
  out[#out + 1] = allowed and cost or 0
end

-- Then, if the request goes ahead, take its cost from every limit that allowed.
if mode == 'check' and commit then
  for j, l in ipairs(limits) do
    local allowed, ns = decided[j][1], decided[j][2]
    if allowed and ns then
      if l.algorithm == LOG then
        local cut = now - l.window
        redis.call('ZREMRANGEBYSCORE', l.logkey, '-inf', fmt(cut))
        redis.call('ZADD', l.logkey, fmt(now), string.format('%d:%d', ns[2], l.cost))
        l.newest = now
        redis.call('PEXPIRE', l.logkey, fmt(ttl_ms(l, ns)))
      end
      store(l, ns)
    end
  end
end
return out
