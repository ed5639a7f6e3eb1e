-- settles.lua: settlements of reservations (reserve.go) of one limit
-- each, a token bucket or a fixed window, not global, whose limit has not
-- changed since the estimate was taken (the common case), as many as the
-- store gathered in one pipeline: what limits.lua's 'settle' does for
-- each, with nothing else for Redis to run, and one script call for them
-- all, as checks.lua does for checks. The settlements run in turn, as
-- separate calls would. TestStoresSettleAlike holds it to the in-memory
-- store.
--
-- KEYS: per settlement, its counter key, then the hash of the counter's
--       settlements of reservations that end in the same minute, by mark
--       (settledKey), so that each is made once.
-- ARGV: now in µs (tests only) or '', minimum TTL in ms (tests only) or '',
--       then per settlement 9 values: algorithm (1 token bucket, 4 fixed
--       window), limit, refill per second (%.17g) or window (µs), the
--       estimate, when it was taken (µs), the actual cost (-1: a release;
--       -2: an expiry, a release made past the reservation's end, once),
--       when the reservation ends (µs), its mark, and how many
--       settlements of that minute the counter keeps at most (settledCap).
-- Returns {now, then per settlement: allowed (0/1), remaining, reset_at,
-- retry_after, taken, then 0 (settled now), 1 (settled before), 2 (ended)
-- or 3 (refused: the counter keeps as many settlements as it may), and
-- what it charged}.

-- now, ttl_px, read_state and write_state: head.lua; floor, max, min,
-- tb_tokens and tb_until: wait.lua; plain, plain_args and TOKEN_BUCKET:
-- plain.lua; the store puts them first.
local bad = plain_args('settles.lua', 2, 9)
if bad then return bad end
local call = redis.call
local out, o, j = {now}, 1, 3
for k = 1, #KEYS, 2 do
  local key, marks = KEYS[k], KEYS[k + 1]
  local alg, limit, rw, estimate = tonumber(ARGV[j]), tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2]), tonumber(ARGV[j + 3])
  local taken_at, actual, until_us, mark, cap = tonumber(ARGV[j + 4]), tonumber(ARGV[j + 5]), tonumber(ARGV[j + 6]), ARGV[j + 7], tonumber(ARGV[j + 8])
  -- The minute the reservation ends in, and a minute more, its
  -- settlements are kept (settledBucket); an expiry is made past the end
  -- (before it by this server's clock it is answered as ended), and only
  -- while they are kept.
  local kept_until = (floor((until_us - 1) / 60000000) + 1) * 60000000 + 60000000
  local ended = now >= until_us and (actual ~= -2 or now >= kept_until) or actual == -2 and now < until_us
  local again, charged, cost, batch = 0, max(0, actual), 0, 0
  local ex, a, b = read_state(key, alg)
  if ended then
    again = 2 -- unknown: its estimate stays charged
  elseif call('HSETNX', marks, mark, string.format('%d', charged)) == 0 then
    again, charged = 1, tonumber(call('HGET', marks, mark))
  else
    -- Kept first, then counted: past the cap it is taken out again, and
    -- nothing else is written.
    local kept = call('HLEN', marks)
    if kept > cap then
      call('HDEL', marks, mark)
      again = 3
    else
      if kept == 1 then call('PEXPIRE', marks, ttl_px(kept_until)) end
      if actual > estimate then
        cost, batch = actual - estimate, -1 -- the rest, as debt
      else
        -- What comes back: the estimate, or what the commit did not use;
        -- a fixed window's only into the window it was taken in.
        local back = estimate
        if actual >= 0 then back = estimate - actual end
        if back > 0 and alg == TOKEN_BUCKET then
          ex, a, b = true, min(limit, tb_tokens(limit, rw, ex, a, b, now) + back), now
          write_state(key, alg, a, b, 0, tb_until(limit, rw, a))
        elseif back > 0 then
          local start = floor(now / rw) * rw
          if floor(taken_at / rw) * rw == start then
            local n = 0
            if ex and a == start then n = b end
            ex, a, b = true, start, n - back
            write_state(key, alg, a, b, 0, start + rw)
          end
        end
      end
    end
  end
  out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = plain(key, alg, limit, rw, cost, batch, ex, a, b)
  out[o + 6], out[o + 7] = again, charged
  o = o + 7
  j = j + 9
end
return out
