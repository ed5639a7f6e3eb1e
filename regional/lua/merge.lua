-- merge.lua: gossip brings other regions' slots of a global counter's
-- window (global.go); each field is raised to the value that arrived if
-- that is more, never lowered, so merging is idempotent and order does not
-- matter.
--
-- KEYS[1]: the window's hash
-- ARGV[1]: its time to live in milliseconds, set if it has none
-- ARGV[2...]: field, value pairs ("region": its P, "-region": its N)
--
-- Returns the number of fields raised.
local raised = 0
for i = 2, #ARGV, 2 do
  local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[i])) or 0
  if tonumber(ARGV[i + 1]) > cur then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
    raised = raised + 1
  end
end
if raised > 0 and redis.call('PTTL', KEYS[1]) < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return raised
