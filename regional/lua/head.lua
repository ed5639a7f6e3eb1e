-- head.lua: how limits.lua and checks.lua begin (the store
-- puts it before each): the time, from ARGV[1] in microseconds (tests
-- only) or the server's TIME, the minimum TTL in milliseconds from
-- ARGV[2] (tests only), and a counter's state as they read and write it.
local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local min_ttl = tonumber(ARGV[2]) or 0

-- ttl_px is the TTL, in the milliseconds Redis keeps, of what matters
-- until until_us: rounded up, so that the key lives a little longer,
-- which changes nothing.
local function ttl_px(until_us)
  return string.format('%d', math.max(min_ttl, math.floor(math.max(1, until_us - now) / 1000) + 1))
end

-- A counter's state is one string: its algorithm, then three numbers (see
-- State in algorithm.go). It is written as text, the numbers formatted
-- with %.17g (Lua's own conversion keeps 14 digits, and a time in
-- microseconds has 16), and read in that form or in 25 bytes: the
-- algorithm's byte and three little-endian doubles (struct, a library of
-- Redis's Lua), which costs Redis less to write and read
-- (docs/benchmarks.md). The scripts do not write that form yet: a regiond
-- of before, sharing the Redis through a rolling upgrade, would read it as
-- no state and admit anew what was counted; once every replica reads it,
-- write_state can write it. State of another algorithm is no state, and
-- so is anything else the key holds (a value of another type, other
-- bytes, numbers not finite): read_state returns whether there is one,
-- and its numbers. It never fails, so that one key cannot fail the checks
-- a call of checks.lua decides with it.
local function read_state(key, alg)
  local v = redis.pcall('GET', key)
  if type(v) ~= 'string' then return false, 0, 0, 0 end
  local x, y, z
  if #v == 25 and string.byte(v, 1) == alg then
    local _
    _, x, y, z = struct.unpack('<Bddd', v)
  else
    local sa
    sa, x, y, z = string.match(v, '^(%d+) (%S+) (%S+) (%S+)$')
    x, y, z = tonumber(x), tonumber(y), tonumber(z)
    if tonumber(sa) ~= alg or not (x and y and z) then return false, 0, 0, 0 end
  end
  -- x - x is 0 for a finite number, NaN for an infinite one or NaN.
  if x - x == 0 and y - y == 0 and z - z == 0 then return true, x, y, z end
  return false, 0, 0, 0
end

-- write_state stores a counter's state until until_us.
local function write_state(key, alg, a, b, c, until_us)
  redis.call('SET', key, string.format('%d %.17g %.17g %.17g', alg, a, b, c), 'PX', ttl_px(until_us))
end
