-- plain.lua: what checks.lua and settles.lua share (the store puts it
-- after head.lua and wait.lua): the decision of one limit of a common
-- kind, a token bucket or a fixed window, not global.
local TOKEN_BUCKET, FIXED = 1, 4

-- plain_args checks a plain script's call before anything is decided (an
-- error after the first decision would leave what it took counted): keys
-- keys and per entries values each, the first an algorithm of plain's.
-- It returns an error reply, or nil.
local function plain_args(script, keys, per)
  if #KEYS % keys ~= 0 or #ARGV ~= 2 + per * #KEYS / keys then
    return redis.error_reply(script .. ': ' .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments')
  end
  for j = 3, #ARGV, per do
    local alg = tonumber(ARGV[j])
    if alg ~= TOKEN_BUCKET and alg ~= FIXED then
      return redis.error_reply(script .. ': algorithm ' .. tostring(ARGV[j]) .. ' at ARGV[' .. j .. ']')
    end
  end
  return nil
end

-- plain decides a check of cost on the counter at key, whose state (read
-- by the caller, read_state) is ex, a, b: limit, then the refill per
-- second or the window (µs), and batch (0: none; -1: debt, the cost
-- counted whatever the decision, as limits.lua's charge counts it; else
-- take up to batch, at least cost). It writes the state if it takes
-- anything, and returns allowed (0/1), remaining, reset_at, retry_after
-- and taken.
local function plain(key, alg, limit, rw, cost, batch, ex, a, b)
  local allowed, remaining, reset, retry, taken = 0, 0, 0, 0, 0
  if alg == TOKEN_BUCKET then
    local rate = rw
    local ok, got, tokens, wait, at, na, nb = tb_decide(limit, rate, ex, a, b, cost, batch > 0, batch)
    if ok then
      allowed, taken = 1, got
    elseif batch < 0 and cost > 0 then
      -- Debt: the bucket below zero, refilling from there (chargeDebt).
      tokens = max(tokens - cost, -debt_cap(rate))
      na, nb, got, taken = tokens, now, cost, cost
      wait = exactWait(now, -tokens * 1e6 / rate, tb_has, limit, rate, true, tokens, now, 0)
      at = now + exactWait(now, (limit - tokens) * 1e6 / rate, tb_has, limit, rate, true, tokens, now, limit)
    end
    -- A check of cost 0 (counting nothing) writes nothing.
    if taken > 0 then write_state(key, TOKEN_BUCKET, na, nb, 0, tb_until(limit, rate, na)) end
    return allowed, floor(tokens), at, wait, taken
  end
  -- FIXED
  local window = rw
  local start = floor(now / window) * window
  local n = 0
  if ex and a == start then n = b end
  if batch > 0 then cost = max(cost, min(batch, limit - n)) end
  if n + cost <= limit or (batch < 0 and cost > 0) then
    -- Allowed, or debt: the window past its limit (chargeDebt).
    if n + cost <= limit then allowed = 1 else retry = start + window - now end
    taken = cost
    n = min(n + cost, limit + debt_cap(0))
    if cost > 0 then write_state(key, FIXED, start, n, 0, start + window) end
  else
    -- The count is this window's, over the limit: the next window takes
    -- the cost (exactWait in limits.lua finds the same, the cost being
    -- at most the limit).
    retry = max(1, start + window - now)
  end
  return allowed, limit - n, start + window, retry, taken
end
