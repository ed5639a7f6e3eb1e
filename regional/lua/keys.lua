-- The keys a rule tracks in a region, counted across its replicas: a set
-- of their hashes per generation (see regionKeys in local.go), the
-- previous one kept beside it. A key in this generation's set passes; one
-- in the previous set passes and is counted in this one; a new key passes
-- and is counted only while neither set holds the cap. A set so holds
-- fewer than twice the cap: new keys join one only while the set before
-- held fewer than the cap, and the rest came from that set.
--
-- KEYS[1]  this generation's set      KEYS[2]  the previous generation's
-- ARGV[1]  the key's hash             ARGV[2]  the cap (max_keys)
-- ARGV[3]  how long a set lives, ms (two generations)
--
-- Returns 1 if the key may be tracked, 0 if the cap refuses it.
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then
  return 1
end
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 0 then
  local cap = tonumber(ARGV[2])
  if redis.call('SCARD', KEYS[1]) >= cap or redis.call('SCARD', KEYS[2]) >= cap then
    return 0
  end
end
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
