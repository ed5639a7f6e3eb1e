-- wait.lua: what limits.lua and checks.lua share (the store puts it
-- before each, after head.lua): exactWait and the token bucket.
local floor, ceil, max, min = math.floor, math.ceil, math.max, math.min
local TB_EXPIRY_MARGIN = 1000
-- debtCap() in algorithm.go: the most a counter keeps past its limit.
local MAX_DEBT, MAX_DEBT_WAIT = 1099511627776, 31622400000000
local function debt_cap(rate)
  if rate > 0 then return min(MAX_DEBT, rate * MAX_DEBT_WAIT / 1e6) end
  return MAX_DEBT
end

-- exactWait is exactWait() in algorithm.go: the shortest whole wait after which
-- allows(t, ...) holds, found exactly however far off the estimate is. The
-- predicate's own arguments follow it, so that no closure is made for it.
local function exactWait(t0, wait, allows, ...)
  local w = max(1, ceil(wait))
  local lo, hi = 0, 0
  if allows(t0 + w, ...) then
    if w == 1 or not allows(t0 + w - 1, ...) then return w end
    hi = w - 1
    local step = 1
    for _ = 1, 64 do
      lo = max(0, hi - step)
      if lo == 0 or not allows(t0 + lo, ...) then break end
      hi, step = lo, step * 2
    end
  else
    lo = w
    local step = 1
    for _ = 1, 64 do
      hi = lo + step
      if allows(t0 + hi, ...) then break end
      lo, step = hi, step * 2
    end
  end
  while hi - lo > 1 do
    local mid = lo + floor((hi - lo) / 2)
    if allows(t0 + mid, ...) then hi = mid else lo = mid end
  end
  return hi
end

local function tb_tokens(limit, rate, ex, a, b, t)
  if not ex then return limit end
  local elapsed = max(0, t - b)
  return min(limit, a + elapsed * rate / 1e6)
end

-- tb_has: whether the bucket holds need at t (exactWait's predicate).
local function tb_has(t, limit, rate, ex, a, b, need)
  return tb_tokens(limit, rate, ex, a, b, t) >= need
end

-- tb_until is when a bucket of a tokens stops mattering (ttl() in
-- algorithm.go): once full again, and a margin.
local function tb_until(limit, rate, a)
  return now + ceil((limit - a) * 1e6 / rate) + TB_EXPIRY_MARGIN
end

-- tb_decide decides a token bucket's check of cost (with a batch of up to
-- batch, if take): allowed, the cost taken, the tokens left, retry_after,
-- reset_at, and the state to store if the request goes ahead.
local function tb_decide(limit, rate, ex, a, b, cost, take, batch)
  local tokens = tb_tokens(limit, rate, ex, a, b, now)
  if take then cost = max(cost, min(batch, floor(tokens))) end
  local allowed, retry, reset = false, 0, now
  if tokens >= cost then
    allowed = true
    tokens = tokens - cost
    ex, a, b = true, tokens, now
  else
    retry = exactWait(now, (cost - tokens) * 1e6 / rate, tb_has, limit, rate, ex, a, b, cost)
  end
  if tokens < limit then
    reset = now + exactWait(now, (limit - tokens) * 1e6 / rate, tb_has, limit, rate, ex, a, b, limit)
  end
  return allowed, cost, tokens, retry, reset, a, b
end
