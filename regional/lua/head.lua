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

-- A counter's state is one string of 25 bytes: its algorithm (a byte),
-- then three numbers (see State in algorithm.go) as little-endian
-- doubles, exact for a time in microseconds (struct, a library of Redis's
-- Lua; two to three times cheaper than writing and reading them as text).
-- The text form of before, the algorithm and three %.17g numbers, is read
-- too, so that counters survive an upgrade. State of another algorithm is
-- no state, and so is anything else the key holds (a value of another
-- type, other bytes, numbers not finite): read_state returns whether there
-- is one, and its numbers. It never fails, so that one key cannot fail the
-- checks a call of checks.lua decides with it.
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
  redis.call('SET', key, struct.pack('<Bddd', alg, a, b, c), 'PX', ttl_px(until_us))
end
