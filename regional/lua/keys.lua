-- The keys a rule tracks in a region, counted across its replicas: a set
-- of hashes per generation (a window of the rule), the previous one kept
-- beside it. A key seen in either passes; a new one only while this
-- generation holds fewer than the cap.
--
-- KEYS[1]  this generation's set      KEYS[2]  the previous generation's
-- ARGV[1]  the key's hash             ARGV[2]  the cap (max_keys)
-- ARGV[3]  how long a set lives, ms (two generations)
--
-- Returns 1 if the key may be tracked, 0 if the cap refuses it.
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then
  return 1
end
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 0
    and redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
