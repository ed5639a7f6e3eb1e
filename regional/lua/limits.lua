-- limits.lua: the rate-limit algorithms of regional/algorithm.go, in Lua,
-- operation for operation, so that the Redis and in-memory stores decide
-- alike to the bit.
--
-- KEYS: per limit, its counter key; a sliding_window_log or concurrency
--       limit also its log key (a sorted set of "seq:cost" members scored
--       by time: for concurrency, a slot per request in flight).
-- ARGV[1]: now in microseconds (tests only), or '' to use the server's TIME
-- ARGV[2]: minimum TTL in milliseconds (tests only), or ''
-- ARGV[3]: mode: 'check', 'inspect', 'grant', 'refund' or 'settle'
-- ARGV[4]: the amount to give back ('grant', 'refund'); the actual cost
--          of a reservation, or -1 to release it ('settle')
-- ARGV[5]: when the refunded amount was taken, µs ('refund'); when the
--          reservation ends, µs ('settle')
-- ARGV[6]: this region's name: its slot of global counters
-- ARGV[7]: for 'check', the time in µs past which the call does nothing
--          and answers the error "LATE <now>" (its caller has given up
--          and decided without the store), or ''; for 'settle', the
--          reservation's mark
-- ARGV[8...]: per limit 7 values: algorithm, limit, rate, window, cost,
--            flags (1: shadow; 2: debt, the cost counted whatever the
--            decision: Op.Debt), batch (0: none; else take up to batch,
--            at least cost).
--            'settle' settles a reservation (reserve.go) of each limit:
--            its cost is the estimate, its batch when the estimate was
--            taken (µs), its flags 1 if the limit has changed since (the
--            settlement is kept, the counter not touched), and it has a
--            key after its counter's (and its log's): the hash of the
--            counter's settlements of reservations that end in the same
--            minute, by mark, so that each is made once.
--            A global limit (global.go) has algorithm 10 + its own, its
--            allowance in place of the rate, its ceiling (-1: strict) in
--            place of the batch, and 3 more: the window (ms) the engine
--            knows this region's slot of, and that slot's P and N; for
--            'settle', when the estimate was taken (µs) in that window's
--            place, and it too has the settlements' key after its own.
--            A concurrency limit's slot (regional or global) has no
--            settlements' key: it is freed once without one. A global
--            one's cost is its number in its window's set of slots in
--            flight (the region's P after it was taken).
--
-- Returns {now, then per limit: allowed (0/1), remaining, reset_at,
-- retry_after, taken, and for a global limit the region's P and N after
-- (and for a global concurrency limit decided, its P and N of the window
-- before); for 'settle', then (after P and N for a global limit) 0 (settled now),
-- 1 (settled before), 2 (ended) or 3
-- (refused: the counter keeps settled_cap settlements of that minute),
-- and what it charged}; for 'refund', {now, then per limit the amount
-- given back}.
--
-- A counter's state is one string (read_state, write_state: head.lua).
-- Every number sent to Redis is formatted with %.17g: Lua's own conversion
-- keeps 14 digits, and a time in microseconds has 16.
--
-- The script runs for every check, and Redis runs its whole body each
-- time, creating every function it defines: so the common algorithms are
-- written out in the main loop, and the sliding log's helpers are made only
-- when a request needs them.

local format, match, tonumber, call = string.format, string.match, tonumber, redis.call
local TOKEN_BUCKET, LOG, COUNTER, FIXED, GCRA, SLOTS = 1, 2, 3, 4, 5, 6
-- SLOTS (concurrency) is a sliding window log whose window is its slots'
-- TTL, each request one slot; settling a reservation frees its slot,
-- whatever the cost committed.

-- now and min_ttl: head.lua, which the store puts first, then wait.lua.
local mode = ARGV[3]
local give_n = tonumber(ARGV[4]) or 0
local give_at = tonumber(ARGV[5]) or -1
local region = ARGV[6]
local GLOBAL = 10
local not_after = mode == 'check' and tonumber(ARGV[7])
-- A settlement's mark (ARGV[7] of 'settle'), and the least of how many
-- settlements of reservations that end in one minute a counter keeps
-- (maxSettled in reservation.go).
local rsv_mark, MAX_SETTLED = ARGV[7], 10000
-- settled_cap is settledCap in reservation.go: twice what a counter can
-- admit in a minute, at least MAX_SETTLED, at most 2^40.
local function settled_cap(alg, limit, rate, window)
  local per = limit
  if alg == TOKEN_BUCKET or alg == GCRA then
    per = per + rate * 60
  else
    per = per * ceil(60000000 / window)
  end
  return max(MAX_SETTLED, floor(min(2 * per, 2 ^ 40)))
end
-- settled_until is the end of the minute until_us is in (settledBucket in
-- reservation.go): the settlements of reservations that end then are
-- kept a minute past it (an expiry comes after the end).
local function settled_until(until_us)
  return (floor((until_us - 1) / 60000000) + 1) * 60000000
end
if not_after and now > not_after then
  return redis.error_reply(format('LATE %d', now))
end

-- exactWait, tb_tokens and tb_has: wait.lua, which the store puts first.

-- swc_counts is swcCounts() in algorithm.go: the window that holds t, and
-- its count and the previous window's, from the counter's state.
local function swc_counts(window, ex, a, b, c, t)
  local start = floor(t / window) * window
  local cur, prev = 0, 0
  if ex then
    if a == start then cur, prev = b, c elseif a == start - window then prev = b end
  end
  return start, cur, prev
end

-- swc_estimate is swcEstimate(): the previous window's count weighed by
-- how much of it the sliding window still covers, and the current one's.
local function swc_estimate(window, start, cur, prev, t)
  return prev * ((window - (t - start)) / window) + cur
end

-- swc_fits: whether the counter at t takes cost within limit (exactWait's
-- predicate).
local function swc_fits(t, window, ex, a, b, c, cost, limit)
  local start, cur, prev = swc_counts(window, ex, a, b, c, t)
  return swc_estimate(window, start, cur, prev, t) + cost <= limit
end

local function gcra_debt(rate, ex, a, b, t)
  if not ex then return 0 end
  local elapsed = max(0, t - b)
  return max(0, a - elapsed * rate / 1e6)
end

-- gcra_fits is gcraFits() in algorithm.go.
local function gcra_fits(debt, burst)
  local n = floor(burst - debt)
  for _ = 1, 2 do if debt + (n + 1) <= burst then n = n + 1 end end
  for _ = 1, 2 do if n > 0 and debt + n > burst then n = n - 1 end end
  return n
end

-- gcra_within: whether the meter at t takes cost within the burst
-- (exactWait's predicate); with cost and burst 0, whether it is empty.
local function gcra_within(t, rate, ex, a, b, cost, burst)
  return gcra_debt(rate, ex, a, b, t) + cost <= burst
end

-- until_of mirrors ttl() in algorithm.go, in µs: when a counter's state
-- stops mattering. newest is the log's newest entry.
local function until_of(alg, limit, rate, window, a, b, newest)
  if alg == TOKEN_BUCKET then
    return tb_until(limit, rate, a)
  elseif alg == GCRA then
    return b + ceil(a * 1e6 / rate) + TB_EXPIRY_MARGIN
  elseif alg == FIXED then
    return a + window
  elseif alg == COUNTER then
    return a + 2 * window
  end
  return newest + window
end

local function ttl_ms(alg, limit, rate, window, a, b, newest)
  return ttl_px(until_of(alg, limit, rate, window, a, b, newest))
end

local function store(key, alg, limit, rate, window, a, b, c, newest)
  write_state(key, alg, a, b, c, until_of(alg, limit, rate, window, a, b, newest))
end

-- The sliding window log: made only when a request needs it.
local log_helpers
local function logs()
  if log_helpers then return log_helpers end
  local function member_cost(m) return tonumber(match(m, ':(.+)$')) end
  -- decide: allowed, remaining, reset_at, retry_after, sum, seq, and
  -- the time the entry is logged at: now, or for a slot (unique) just
  -- after the newest entry if that is not before now (slotAt in
  -- algorithm.go).
  local function decide(limit, window, ex, a, b, logkey, cost, slot)
    local cut = now - window
    local sum, seq = 0, 0
    if ex then sum, seq = a, b end
    local expired = call('ZRANGEBYSCORE', logkey, '-inf', format('%.17g', cut))
    for i = 1, #expired do sum = sum - member_cost(expired[i]) end
    local allowed, retry, newest, at = false, 0, nil, now
    if sum + cost <= limit then
      allowed = true
      if cost > 0 then
        sum = sum + cost
        seq = seq + 1
        if slot then
          local last = call('ZREVRANGEBYSCORE', logkey, '+inf', '(' .. format('%.17g', cut), 'WITHSCORES', 'LIMIT', 0, 1)
          if #last > 0 and tonumber(last[2]) >= now then at = tonumber(last[2]) + 1 end
        end
        newest = at
      end
    else
      local live = call('ZRANGEBYSCORE', logkey, '(' .. format('%.17g', cut), '+inf', 'WITHSCORES')
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
      local last = call('ZREVRANGEBYSCORE', logkey, '+inf', '(' .. format('%.17g', cut), 'WITHSCORES', 'LIMIT', 0, 1)
      if #last > 0 then newest = tonumber(last[2]) end
    end
    local reset = now
    if newest then reset = newest + window end
    return allowed, limit - sum, reset, retry, sum, seq, at
  end
  -- forget: the log forgets n units, the newest (at < 0) or those logged
  -- at at; returns the sum left, and what it forgot.
  local function forget(window, ex, logkey, n, at)
    call('ZREMRANGEBYSCORE', logkey, '-inf', format('%.17g', now - window))
    local live = call('ZREVRANGEBYSCORE', logkey, '+inf', '-inf', 'WITHSCORES')
    local sum, given = 0, 0
    for i = 1, #live, 2 do sum = sum + member_cost(live[i]) end
    for i = 1, #live, 2 do
      if given >= n then break end
      local m, t = live[i], tonumber(live[i + 1])
      if at < 0 or t == at then
        local cm = member_cost(m)
        local take = min(n - given, cm)
        call('ZREM', logkey, m)
        if cm - take > 0 then
          call('ZADD', logkey, live[i + 1], match(m, '^(.-):') .. ':' .. format('%.17g', cm - take))
        end
        given = given + take
      end
    end
    return sum - given, given
  end
  log_helpers = {decide = decide, forget = forget}
  return log_helpers
end

-- give_back mirrors giveBack() in memory.go: the state after n is given
-- back (at < 0: a grant; else a refund of n taken at at), and how much was.
local function give_back(alg, limit, rate, window, ex, a, b, c, logkey, n, at)
  if alg == TOKEN_BUCKET then
    return min(limit, tb_tokens(limit, rate, ex, a, b, now) + n), now, 0, n
  elseif alg == GCRA then
    return max(0, gcra_debt(rate, ex, a, b, now) - n), now, 0, n
  elseif alg == FIXED then
    local start = floor(now / window) * window
    local count = 0
    if ex and a == start then count = b end
    if at >= 0 and floor(at / window) * window ~= start then return a, b, c, 0 end
    return start, count - n, 0, n
  elseif alg == COUNTER then
    local start = floor(now / window) * window
    local cur, prev = 0, 0
    if ex then
      if a == start then cur, prev = b, c elseif a == start - window then prev = b end
    end
    local w = floor(at / window) * window
    if at < 0 or w == start then
      cur = cur - n
    elseif w == start - window then
      prev = prev - n
    else
      return a, b, c, 0
    end
    return start, cur, prev, n
  end
  local sum, given = logs().forget(window, ex, logkey, n, at)
  local seq = 0
  if ex then seq = b end
  return sum, seq, 0, given
end

-- Global counters (global.go): one hash per window, a field per region
-- (its P) and "-region" (its N).
local function gkey(key, start) return key .. ':' .. format('%d', floor(start / 1000)) end

-- gview: this region's P and N in a window, and the sum of P less N.
local function gview(h)
  local vals = call('HGETALL', h)
  local p, n, total = 0, 0, 0
  for j = 1, #vals, 2 do
    local f, x = vals[j], tonumber(vals[j + 1])
    if string.byte(f, 1) == 45 then
      total = total - x
      if f == '-' .. region then n = x end
    else
      total = total + x
      if f == region then p = x end
    end
  end
  return p, n, total
end

local function gttl(alg, window, start)
  local until_us = start + window + max(window, 60e6)
  if alg == COUNTER or alg == SLOTS then until_us = until_us + window end
  return ttl_px(until_us)
end

-- gadd counts n in field f of the window that holds at (now if nil);
-- returns the region's P and N after.
local function gadd(key, alg, window, f, n, at)
  local start = floor((at or now) / window) * window
  local h = gkey(key, start)
  call('HINCRBY', h, f, n)
  call('PEXPIRE', h, gttl(alg, window, start))
  return tonumber(call('HGET', h, region)) or 0, tonumber(call('HGET', h, '-' .. region)) or 0
end

-- graise raises this region's fields of the window that holds now to at
-- least p and n, if the window starts at known (ms): the engine's memory of
-- its own slot, so that a store that lost its data (flushed, failed over
-- to an empty replica) does not admit the window's usage again.
local function graise(key, alg, window, known, p, n)
  local start = floor(now / window) * window
  if (p <= 0 and n <= 0) or known * 1000 ~= start then return end
  local h = gkey(key, start)
  local cp = tonumber(call('HGET', h, region)) or 0
  local cn = tonumber(call('HGET', h, '-' .. region)) or 0
  if p > cp then call('HSET', h, region, format('%d', p)) end
  if n > cn then call('HSET', h, '-' .. region, format('%d', n)) end
  if p > cp or n > cn then call('PEXPIRE', h, gttl(alg, window, start)) end
end

-- gdecide mirrors decideGlobal() in global.go; it returns the region's P
-- and N of the window in course and, for a concurrency limit, of the one
-- before.
local function gdecide(key, alg, limit, window, cost, allowance, ceiling)
  local start = floor(now / window) * window
  local p, n, total = gview(gkey(key, start))
  local own, pp, pn, ptotal = p - n, 0, 0, 0
  if alg == COUNTER then
    local pp, pn, ptotal = gview(gkey(key, start - window))
    own = swc_estimate(window, start, own, pp - pn, now)
    total = swc_estimate(window, start, total, ptotal, now)
  elseif alg == SLOTS then
    -- Slots taken in the window before are in flight still.
    pp, pn, ptotal = gview(gkey(key, start - window))
    own = own + pp - pn
    total = total + ptotal
  end
  local allowed = own + cost <= allowance
  local rem = allowance - own
  if ceiling >= 0 then
    allowed = (allowed and total + cost <= limit) or total + cost <= ceiling
    rem = max(min(rem, limit - total), ceiling - total)
  end
  local retry = 0
  if allowed then rem = rem - cost else retry = start + window - now end
  return allowed, floor(max(0, rem)), start + window, retry, p, n, pp, pn
end

-- charge mirrors chargeDebt() in algorithm.go: a denied request's cost
-- counted all the same, past the limit. It returns remaining, reset_at,
-- retry_after and the state to store.
local function charge(alg, limit, rate, window, ex, a, b, c, cost)
  if alg == TOKEN_BUCKET then
    local tokens = max(tb_tokens(limit, rate, ex, a, b, now) - cost, -debt_cap(rate))
    return floor(tokens), now + exactWait(now, (limit - tokens) * 1e6 / rate, tb_has, limit, rate, true, tokens, now, limit),
      exactWait(now, -tokens * 1e6 / rate, tb_has, limit, rate, true, tokens, now, 0), tokens, now, 0
  elseif alg == GCRA then
    local debt = min(gcra_debt(rate, ex, a, b, now) + cost, limit + debt_cap(rate))
    return gcra_fits(debt, limit), now + exactWait(now, debt * 1e6 / rate, gcra_within, rate, true, debt, now, 0, 0),
      exactWait(now, (debt - limit) * 1e6 / rate, gcra_within, rate, true, debt, now, 0, limit), debt, now, 0
  elseif alg == FIXED then
    local start = floor(now / window) * window
    local n = 0
    if ex and a == start then n = b end
    n = min(n + cost, limit + debt_cap(rate))
    return limit - n, start + window, start + window - now, start, n, 0
  end
  local start, cur, prev = swc_counts(window, ex, a, b, c, now)
  cur = min(cur + cost, limit + debt_cap(rate))
  return floor(limit - swc_estimate(window, start, cur, prev, now)), start + 2 * window,
    exactWait(now, start + window - now, swc_fits, window, true, start, cur, prev, 0, limit), start, cur, prev
end

-- Decide every limit, changing nothing yet; pending lists, flattened
-- eleven values a limit, what to store if the request goes ahead; owed (eight
-- values a limit) and owedg (five, a global limit's), what limits that
-- count debt store whatever happens.
-- A settlement reads each counter's settlements first (prevs: this one's
-- mark, if settled before; kept: how many that minute): it is refused
-- whole if one counter keeps as many as it may and has not this one, and
-- nothing is written (refused).
local refused, prevs, kept = false, {}, {}
-- An expiry (ARGV[4] = -2: a release of a reservation that ended
-- unsettled, whose rule refunds it) is made past its end, once, as any
-- settlement.
-- An expiry before the end by this server's clock (another's, a Cluster's
-- index node, saw it end) does nothing yet: it is answered as ended.
local expiry = mode == 'settle' and give_n == -2
local ended = mode == 'settle' and ((now >= give_at and (not expiry or now >= settled_until(give_at) + 60000000)) or (expiry and now < give_at))
if mode == 'settle' and not ended then
  local kk, ii, n = 1, 8, 1
  while ii + 6 <= #ARGV do
    local a = tonumber(ARGV[ii])
    if a == LOG then kk = kk + 1 end
    if a == GLOBAL + SLOTS then
      kk = kk + 1 -- a global slot keeps no settlement: it leaves its window's set once (below)
      prevs[n], kept[n] = false, 0
      ii = ii + 3 -- and the 7 below
    elseif a > GLOBAL then
      -- A global limit's: its key, then its settlements'.
      local marks = KEYS[kk + 1]
      kk = kk + 2
      prevs[n], kept[n] = call('HGET', marks, rsv_mark), 0
      if not prevs[n] then
        kept[n] = call('HLEN', marks)
        refused = refused or kept[n] >= settled_cap(a - GLOBAL, tonumber(ARGV[ii + 1]), 0, tonumber(ARGV[ii + 3]))
      end
      ii = ii + 3 -- and the 7 below
    elseif a == SLOTS then
      kk = kk + 2 -- a slot keeps no settlement: it is freed once (below)
    else
      local marks = KEYS[kk + 1]
      kk = kk + 2
      prevs[n], kept[n] = call('HGET', marks, rsv_mark), 0
      if not prevs[n] then
        kept[n] = call('HLEN', marks)
        refused = refused or kept[n] >= settled_cap(a, tonumber(ARGV[ii + 1]), tonumber(ARGV[ii + 2]), tonumber(ARGV[ii + 3]))
      end
    end
    ii, n = ii + 7, n + 1
  end
end
local settles = 0 -- settlements decided so far: the index into prevs and kept
local out, commit, pending, np, owed, no, owedg, ng = {now}, true, {}, 0, {}, 0, {}, 0
local k, i = 1, 8
while i + 6 <= #ARGV do
  local alg, limit, rate, window = tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  local cost, flags, batch = tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5]), tonumber(ARGV[i + 6])
  local shadow, owes = flags % 2 == 1, flags >= 2
  local key, logkey = KEYS[k], nil
  k = k + 1
  if alg > GLOBAL then
    alg = alg - GLOBAL
    if mode == 'settle' and alg == SLOTS then
      -- A global slot, released or committed: it leaves the set of its
      -- window's slots in flight (its cost is its number there: the
      -- region's P after it was taken), once, and is freed into that
      -- window's N, while the window counts (it or the one before).
      local seq, taken_at = cost, tonumber(ARGV[i + 7])
      local taken, cur = floor(taken_at / window) * window, floor(now / window) * window
      settles = settles + 1
      local again = 0
      if ended then
        again = 2
      elseif refused then
        again = 3 -- another counter keeps as many settlements as it may: nothing is settled
      elseif flags % 2 == 1 then
        -- The limit changed since: its window is another's.
      elseif (taken == cur or taken == cur - window) and call('SREM', gkey(key, taken) .. ':in', format('%d', seq)) == 1 then
        gadd(key, alg, window, '-' .. region, 1, taken_at)
      else
        again = 1 -- released before, or freed by itself
      end
      local allowed, rem, reset, retry = gdecide(key, alg, limit, window, 0, rate, batch)
      -- The region's slot of the window the slot was taken in, while it
      -- counts (none after).
      local p, n = 0, 0
      if taken == cur or taken == cur - window then p, n = gview(gkey(key, taken)) end
      local o = #out
      out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = allowed and 1 or 0, rem, reset, retry, 0
      out[o + 6], out[o + 7], out[o + 8], out[o + 9] = p, n, again, 0
    elseif mode == 'settle' then
      -- A reservation's part of a global limit: the estimate was counted
      -- in the region's P when reserved. What comes back goes to its N,
      -- in the window it was taken in (while that window holds); what
      -- the commit charges past the estimate, to its P now, as debt.
      -- Its taken-at time is where a check's known window is.
      local actual, estimate, taken_at, marks = give_n, cost, tonumber(ARGV[i + 7]), KEYS[k]
      k = k + 1
      settles = settles + 1
      local prev, again, charged = prevs[settles], 0, max(0, actual)
      if ended then
        again = 2
      elseif prev then
        again, charged = 1, tonumber(prev)
      elseif refused then
        again = 3
      else
        call('HSET', marks, rsv_mark, format('%d', charged))
        if kept[settles] == 0 then call('PEXPIRE', marks, ttl_px(settled_until(give_at) + 60000000)) end
        if flags % 2 == 1 then
          -- The limit changed since: its window is another's.
        elseif actual < 0 or actual <= estimate then
          local back = estimate
          if actual >= 0 then back = estimate - actual end
          if back > 0 and floor(taken_at / window) * window == floor(now / window) * window then
            gadd(key, alg, window, '-' .. region, back)
          end
        else
          gadd(key, alg, window, region, actual - estimate)
        end
      end
      local allowed, rem, reset, retry, p, n = gdecide(key, alg, limit, window, 0, rate, batch)
      local o = #out
      out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = allowed and 1 or 0, rem, reset, retry, 0
      out[o + 6], out[o + 7], out[o + 8], out[o + 9] = p, n, again, charged
    elseif mode == 'refund' or mode == 'grant' then
      -- Given back as N, into the window it was taken in (a refund), or
      -- the current one (a grant).
      local start = floor(now / window) * window
      local given = 0
      if give_at < 0 or floor(give_at / window) * window == start then
        gadd(key, alg, window, '-' .. region, give_n)
        given = give_n
      end
      if mode == 'refund' then
        out[#out + 1] = given
      else
        local _, rem, reset, _, p, n = gdecide(key, alg, limit, window, 0, rate, batch)
        local o = #out
        out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6], out[o + 7] = 1, rem, reset, 0, 0, p, n
      end
    else
      if mode == 'inspect' then cost = 0 end
      graise(key, alg, window, tonumber(ARGV[i + 7]), tonumber(ARGV[i + 8]), tonumber(ARGV[i + 9]))
      local allowed, rem, reset, retry, p, n, pp, pn = gdecide(key, alg, limit, window, cost, rate, batch)
      if not allowed and not shadow then commit = false end
      local taken = allowed and cost or 0
      if owes and mode == 'check' and cost > 0 then
        -- Counted whatever the decision, in the region's slot.
        owedg[ng + 1], owedg[ng + 2], owedg[ng + 3], owedg[ng + 4], owedg[ng + 5] = key, alg, window, cost, #out + 6
        ng = ng + 5
        taken = cost
      elseif allowed and mode == 'check' and cost > 0 then
        pending[np + 1], pending[np + 2], pending[np + 3], pending[np + 4], pending[np + 5] = key, alg + GLOBAL, 0, 0, window
        pending[np + 6], pending[np + 7], pending[np + 8], pending[np + 9], pending[np + 10] = cost, #out + 6, 0, 0, ''
        pending[np + 11] = now
        np = np + 11
      end
      local o = #out
      out[o + 1], out[o + 2], out[o + 3], out[o + 4] = allowed and 1 or 0, rem, reset, retry
      out[o + 5], out[o + 6], out[o + 7] = taken, p, n
      if alg == SLOTS then out[o + 8], out[o + 9] = pp, pn end
    end
    i = i + 10
  else
    if alg == LOG or alg == SLOTS then
      logkey = KEYS[k]
      k = k + 1
    end
    -- lm is this limit's mode: a settlement chooses its own, and what to
    -- give back (lm_n, lm_at).
    local lm, lm_n, lm_at, again, charged = mode, give_n, give_at, 0, 0
    if mode == 'settle' and alg == SLOTS then
      -- The request is over, committed or released: its slot, logged at
      -- a time no other slot of the counter has, is forgotten once
      -- (again: none was left), unless the reservation has ended.
      shadow, owes, lm, settles = true, false, 'inspect', settles + 1
      if ended then
        again = 2
      elseif flags % 2 == 0 then
        lm, lm_at, lm_n = 'grant', batch, cost
      end
      batch = 0
    elseif mode == 'settle' then
      local actual, estimate, marks, stale = give_n, cost, KEYS[k], flags % 2 == 1
      k = k + 1
      charged = max(0, actual)
      shadow, owes, lm = true, false, 'inspect' -- settlements do not hold each other up
      settles = settles + 1
      local prev = prevs[settles]
      if ended then
        again = 2 -- ended: unknown, its estimate charged
      elseif prev then
        again, charged = 1, tonumber(prev)
      elseif refused then
        again = 3 -- a counter keeps as many settlements as it may
      else
        call('HSET', marks, rsv_mark, format('%d', charged))
        if kept[settles] == 0 then call('PEXPIRE', marks, ttl_px(settled_until(give_at) + 60000000)) end
        if stale then
          -- The limit changed since: its state is another's.
        elseif actual < 0 or actual <= estimate then
          lm, lm_at, lm_n = 'grant', batch, estimate
          if actual >= 0 then lm_n = estimate - actual end
          -- Nothing to give back: the counter is read as it is (a grant of
          -- 0 would write a bucket's tokens anew as of now, rounded).
          if lm_n <= 0 then lm = 'inspect' end
        else
          lm, cost, owes = 'check', actual - estimate, alg ~= LOG
        end
      end
      batch = 0
    end
    local ex, a, b, c = read_state(key, alg)
    if lm == 'grant' or lm == 'refund' then
      local given
      a, b, c, given = give_back(alg, limit, rate, window, ex, a, b, c, logkey, lm_n, lm_at)
      if mode == 'settle' and alg == SLOTS and given == 0 then again = 1 end
      if alg == LOG or alg == SLOTS then
        -- give_back trimmed the log's expired entries: its sum is stored
        -- whether or not anything was given back.
        if a == 0 and call('ZCARD', logkey) == 0 then
          call('DEL', key)
          ex = false
        else
          store(key, alg, limit, rate, window, a, b, c, now)
          call('PEXPIRE', logkey, ttl_ms(alg, limit, rate, window, a, b, now))
          ex = true
        end
      elseif given > 0 then
        store(key, alg, limit, rate, window, a, b, c, now)
        ex = true
      end
      cost = 0
      if lm == 'refund' then out[#out + 1] = given end
    elseif lm == 'inspect' then
      cost = 0
    end
    if lm ~= 'refund' then
      local take = lm == 'check' and batch > 0
      local allowed, remaining, reset, retry, na, nb, nc, entry_at = false, 0, now, 0, 0, 0, 0, now

      if alg == TOKEN_BUCKET then
        local tokens
        allowed, cost, tokens, retry, reset, na, nb = tb_decide(limit, rate, ex, a, b, cost, take, batch)
        remaining = floor(tokens)

      elseif alg == FIXED then
        local start = floor(now / window) * window
        local n = 0
        if ex and a == start then n = b end
        if take then cost = max(cost, min(batch, limit - n)) end
        if n + cost <= limit then
          allowed = true
          n = n + cost
        else
          retry = exactWait(now, start + window - now, function(t)
            local st = floor(t / window) * window
            local m = 0
            if ex and a == st then m = b end
            return m + cost <= limit
          end)
        end
        remaining, reset, na, nb = limit - n, start + window, start, n

      elseif alg == GCRA then
        local burst = limit
        local debt = gcra_debt(rate, ex, a, b, now)
        if take then cost = max(cost, min(batch, gcra_fits(debt, burst))) end
        local nxt = debt + cost
        if nxt <= burst then
          allowed = true
          debt = nxt
        else
          retry = exactWait(now, (nxt - burst) * 1e6 / rate, gcra_within, rate, ex, a, b, cost, burst)
        end
        remaining, na, nb = gcra_fits(debt, burst), nxt, now
        if debt > 0 then
          -- The meter as it stands after the request: taken, or as it was.
          local sx, sa, sb = ex, a, b
          if allowed then sx, sa, sb = true, nxt, now end
          reset = now + exactWait(now, debt * 1e6 / rate, gcra_within, rate, sx, sa, sb, 0, 0)
        end

      elseif alg == COUNTER then
        local start, cur, prev = swc_counts(window, ex, a, b, c, now)
        local est = swc_estimate(window, start, cur, prev, now)
        if take then cost = max(cost, min(batch, floor(limit - est))) end
        if est + cost <= limit then
          allowed = true
          cur = cur + cost
        else
          local at
          if cur + cost <= limit then
            at = start + (window - (limit - cur - cost) * window / prev)
          else
            at = start + window + max(0, window - (limit - cost) * window / cur)
          end
          retry = exactWait(now, at - now, swc_fits, window, ex, a, b, c, cost, limit)
        end
        if cur > 0 then
          reset = start + 2 * window
        elseif prev > 0 then
          reset = start + window
        end
        remaining = floor(limit - swc_estimate(window, start, cur, prev, now))
        na, nb, nc = start, cur, prev

      else
        allowed, remaining, reset, retry, na, nb, entry_at = logs().decide(limit, window, ex, a, b, logkey, cost, alg == SLOTS)
      end

      if not allowed and not shadow then commit = false end
      local taken = allowed and cost or 0
      if owes and lm == 'check' and cost > 0 then
        if not allowed then
          remaining, reset, retry, na, nb, nc = charge(alg, limit, rate, window, ex, a, b, c, cost)
          taken = cost
        end
        owed[no + 1], owed[no + 2], owed[no + 3], owed[no + 4], owed[no + 5], owed[no + 6], owed[no + 7] = key, alg, limit, rate, window, na, nb
        owed[no + 8] = nc
        no = no + 8
      elseif allowed and lm == 'check' and cost > 0 then
        pending[np + 1], pending[np + 2], pending[np + 3], pending[np + 4], pending[np + 5] = key, alg, limit, rate, window
        pending[np + 6], pending[np + 7], pending[np + 8], pending[np + 9], pending[np + 10] = cost, na, nb, nc, logkey or ''
        pending[np + 11] = entry_at
        np = np + 11
      end
      local o = #out
      out[o + 1], out[o + 2], out[o + 3], out[o + 4] = allowed and 1 or 0, remaining, reset, retry
      out[o + 5] = taken
      if mode == 'settle' then out[o + 6], out[o + 7] = again, charged end
    end
    i = i + 7
  end
end

-- Then, if the request goes ahead, take its cost from every limit that allowed.
if commit then
  for j = 1, np, 11 do
    local key, alg, limit, rate, window = pending[j], pending[j + 1], pending[j + 2], pending[j + 3], pending[j + 4]
    local cost, a, b, c, logkey, at = pending[j + 5], pending[j + 6], pending[j + 7], pending[j + 8], pending[j + 9], pending[j + 10]
    if alg > GLOBAL then
      -- a is where the region's P and N go in the reply.
      out[a], out[a + 1] = gadd(key, alg - GLOBAL, window, region, cost)
      if alg == GLOBAL + SLOTS then
        -- A slot of a global concurrency limit (cost 1): numbered by the
        -- region's P after it, in its window's set of slots in flight,
        -- which a release leaves once.
        local start = floor(now / window) * window
        local set = gkey(key, start) .. ':in'
        call('SADD', set, format('%d', out[a]))
        call('PEXPIRE', set, gttl(SLOTS, window, start))
      end
    else
      store(key, alg, limit, rate, window, a, b, c, at)
      if alg == LOG or alg == SLOTS then
        call('ZREMRANGEBYSCORE', logkey, '-inf', format('%.17g', now - window))
        call('ZADD', logkey, format('%.17g', at), format('%d:%d', b, cost))
        call('PEXPIRE', logkey, ttl_ms(alg, limit, rate, window, a, b, at))
      end
    end
  end
end
for j = 1, no, 8 do
  store(owed[j], owed[j + 1], owed[j + 2], owed[j + 3], owed[j + 4], owed[j + 5], owed[j + 6], owed[j + 7], now)
end
for j = 1, ng, 5 do
  local a = owedg[j + 4] -- where the region's P and N go in the reply
  out[a], out[a + 1] = gadd(owedg[j], owedg[j + 1], owedg[j + 2], region, owedg[j + 3])
end
return out
