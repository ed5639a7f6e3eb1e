-- add.lua: what one replica admitted of a global counter's window while
-- the store could not answer (degraded.go) is counted in this region's
-- slot, once: a hash beside the window keeps, per replica, how much of its
-- admissions are counted, and only what is beyond that is added, so that
-- a write sent again (its answer lost) counts nothing twice. The region's
-- fields are first raised to what the replica knows of them, as a check
-- raises them (graise in limits.lua): a store that lost them gets them
-- back before the replica's admissions are added.
--
-- KEYS[1]: the window's hash; KEYS[2]: the hash of what each replica's
--          admissions counted so far (the window's key and ":added")
-- ARGV[1]: their time to live in milliseconds, set if they have none
-- ARGV[2]: this region's name; ARGV[3]: the replica's
-- ARGV[4]: everything the replica admitted of the window without the store
-- ARGV[5], ARGV[6]: the region's P and N as the replica knows them
--
-- Returns {the region's P, its N} after.
local region, replica = ARGV[2], ARGV[3]
local admitted, kp, kn = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local p = tonumber(redis.call('HGET', KEYS[1], region)) or 0
local n = tonumber(redis.call('HGET', KEYS[1], '-' .. region)) or 0
if kp > p then
  p = kp
  redis.call('HSET', KEYS[1], region, string.format('%d', p))
end
if kn > n then
  n = kn
  redis.call('HSET', KEYS[1], '-' .. region, string.format('%d', n))
end
local done = tonumber(redis.call('HGET', KEYS[2], replica)) or 0
if admitted > done then
  p = redis.call('HINCRBY', KEYS[1], region, admitted - done)
  redis.call('HSET', KEYS[2], replica, string.format('%d', admitted))
end
for k = 1, 2 do
  if redis.call('PTTL', KEYS[k]) < 0 then redis.call('PEXPIRE', KEYS[k], ARGV[1]) end
end
return {p, n}
