-- sched_define.lua: write or delete one recurring job's definition, compare-and-set against
-- what the caller read (so a concurrent change is never overwritten blindly).
--
-- KEYS[1]  next zset     jq:{sched#k}:next
-- KEYS[2]  def hash      jq:{sched#k}:def
-- KEYS[3]  state hash    jq:{sched#k}:state
-- KEYS[4]  held hash     jq:{sched#k}:held   (untouched: a buffered run waiting for its
--                                               predecessor is still released after a delete)
-- ARGV[1]  job_id
-- ARGV[2]  'put' or 'delete'
-- ARGV[3]  expected definition ('' = expect none)
-- ARGV[4]  expected next fire (ms, '' = expect none)
-- ARGV[5]  new definition (JSON; put only)
-- ARGV[6]  new next fire (ms, or '' = not scheduled: paused or ended; put only)
-- ARGV[7]  state text to set ('' = keep; put only)
-- Returns  1 = written, 0 = conflict (the definition or next fire changed since it was read).

local job = ARGV[1]
local def = redis.call('HGET', KEYS[2], job) or ''
local cur = redis.call('ZSCORE', KEYS[1], job)
if def ~= ARGV[3] then return 0 end
if ARGV[4] == '' then
  if cur then return 0 end
elseif tonumber(cur) ~= tonumber(ARGV[4]) then
  return 0
end

if ARGV[2] == 'delete' then
  redis.call('HDEL', KEYS[2], job)
  redis.call('ZREM', KEYS[1], job)
  redis.call('HDEL', KEYS[3], job)
  return 1
end

redis.call('HSET', KEYS[2], job, ARGV[5])
if ARGV[6] == '' then
  redis.call('ZREM', KEYS[1], job)
else
  redis.call('ZADD', KEYS[1], tonumber(ARGV[6]), job)
end
if ARGV[7] ~= '' then redis.call('HSET', KEYS[3], job, ARGV[7]) end
return 1
