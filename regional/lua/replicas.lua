-- replicas.lua: each replica of a region says, at every Maintain, how
-- many windows of global counters it admitted without the store and has
-- not written to it yet (degraded.go), and reads what every replica said:
-- a hash of replica to "<windows> <time>", the time the server's (TIME,
-- µs). Replicas not heard from for ARGV[3] µs are dropped from it.
--
-- KEYS[1]: the region's hash
-- ARGV[1]: this replica's name; ARGV[2]: its windows not yet written
-- ARGV[3]: how long, in µs, a replica's word is kept
--
-- Returns {now, then per replica: its name, its windows, its time}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ' ' .. string.format('%d', now))
local keep = tonumber(ARGV[3])
local out = {now}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local n, at = string.match(all[i + 1], '^(%d+) (%d+)$')
  at = tonumber(at)
  if not at or now - at > keep then
    redis.call('HDEL', KEYS[1], all[i])
  else
    out[#out + 1], out[#out + 2], out[#out + 3] = all[i], tonumber(n), at
  end
end
redis.call('PEXPIRE', KEYS[1], math.floor(keep / 1000) + 1)
return out
