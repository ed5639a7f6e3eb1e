-- head.lua: how limits.lua, bucket.lua and fixed.lua begin (the store
-- puts it before each): the time, from ARGV[1] in microseconds (tests
-- only) or the server's TIME, and the minimum TTL in milliseconds from
-- ARGV[2] (tests only).
local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local min_ttl = tonumber(ARGV[2]) or 0

