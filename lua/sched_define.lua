-- sched_define.lua: write or delete one recurring job's definition, compare-and-set against
-- what the caller read (so a concurrent change is never overwritten blindly).
--
-- uses: core
--
-- KEYS[1]  next      zset    jq:{sched#k}:next   job_id -> next fire time (ms)
-- KEYS[2]  defs      hash    jq:{sched#k}:def    job_id -> definition (JSON)
-- KEYS[3]  state     hash    jq:{sched#k}:state  job_id -> counters and cursors (text)
-- ARGV[1]  now                now ms, or '' for the server clock (read first, as every
--                             script does; nothing here depends on it)
-- ARGV[2]  job_id             the recurring job
-- ARGV[3]  action             'put' or 'delete'
-- ARGV[4]  expected_def       expected definition ('' = expect none)
-- ARGV[5]  expected_next      expected next fire (ms, '' = expect none)
-- ARGV[6]  definition         new definition (JSON; put only)
-- ARGV[7]  next               new next fire (ms, or '' = not scheduled: paused or ended; put
--                             only)
-- ARGV[8]  state              state text to set ('' = keep; put only)
-- Returns  1 = written, 0 = conflict (the definition or next fire changed since it was read).
--          Refused whole (an error reply, nothing changed) when a key holds another type or
--          is not on this node.
--
-- The buffered hash (buffer-one) is left alone: a buffered run waiting for its predecessor is
-- still released after a delete.

local _ = clock(ARGV[1])
local job = ARGV[2]

local ok, plan = reading(function()
  expect(KEYS[3], 'hash')
  return {def = read('HGET', KEYS[2], job) or '', cur = read('ZSCORE', KEYS[1], job)}
end)
if not ok then return plan end
if plan.def ~= ARGV[4] then return 0 end
if ARGV[5] == '' then
  if plan.cur then return 0 end
elseif tonumber(plan.cur) ~= tonumber(ARGV[5]) then
  return 0
end

if ARGV[3] == 'delete' then
  redis.call('HDEL', KEYS[2], job)
  redis.call('ZREM', KEYS[1], job)
  redis.call('HDEL', KEYS[3], job)
  return 1
end

redis.call('HSET', KEYS[2], job, ARGV[6])
if ARGV[8] ~= '' then redis.call('HSET', KEYS[3], job, ARGV[8]) end
if ARGV[7] == '' then
  redis.call('ZREM', KEYS[1], job)
else
  redis.call('ZADD', KEYS[1], tonumber(ARGV[7]), job)
end
return 1
