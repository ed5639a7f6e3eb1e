-- checks.lua: checks of one limit each, a token bucket or a fixed window,
-- not global (the common case), as many as the store gathered in one
-- pipeline: what limits.lua does for each, with nothing else for Redis to
-- run, and one script call for them all (a call costs Redis more than a
-- check: docs/benchmarks.md). The checks run in turn, as separate calls
-- would. It reads and writes the state limits.lua does (head.lua), and
-- decides a token bucket with the same tb_decide (wait.lua);
-- TestStoresDecideAlike holds both to the in-memory store.
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

-- now, read_state and write_state: head.lua; floor, max, min, tb_decide
-- and tb_until: wait.lua; the store puts both first.
local TOKEN_BUCKET, FIXED = 1, 4
-- Every check's algorithm is known before any is decided: an error after
-- the first would leave what it took counted.
if #ARGV ~= 2 + 5 * #KEYS then
  return redis.error_reply('checks.lua: ' .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments')
end
for j = 3, #ARGV, 5 do
  local alg = tonumber(ARGV[j])
  if alg ~= TOKEN_BUCKET and alg ~= FIXED then
    return redis.error_reply('checks.lua: algorithm ' .. tostring(ARGV[j]) .. ' at ARGV[' .. j .. ']')
  end
end
local out, o, j = {now}, 1, 3
for k = 1, #KEYS do
  local key = KEYS[k]
  local alg, limit, cost, batch = tonumber(ARGV[j]), tonumber(ARGV[j + 1]), tonumber(ARGV[j + 3]), tonumber(ARGV[j + 4])
  local allowed, remaining, reset, retry, taken = 0, 0, 0, 0, 0
  if alg == TOKEN_BUCKET then
    local rate = tonumber(ARGV[j + 2])
    local ex, a, b = read_state(key, TOKEN_BUCKET)
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
    remaining, reset, retry = floor(tokens), at, wait
  else -- FIXED
    local window = tonumber(ARGV[j + 2])
    local ex, a, b = read_state(key, FIXED)
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
    remaining, reset = limit - n, start + window
  end
  out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = allowed, remaining, reset, retry, taken
  o = o + 5
  j = j + 5
end
return out
