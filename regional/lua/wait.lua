-- wait.lua: what limits.lua and bucket.lua share (the store puts it
-- before each, after head.lua): exactWait and the token bucket's count.
local floor, ceil, max, min = math.floor, math.ceil, math.max, math.min

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

