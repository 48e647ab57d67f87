-- sched_due.lua: the recurring jobs of one scheduler partition that fall due, with their
-- definitions and counters, in one round trip (read only).
--
-- KEYS[1]  next zset     jq:{sched#k}:next   job_id -> next fire time (ms)
-- KEYS[2]  def hash      jq:{sched#k}:def    job_id -> definition (JSON)
-- KEYS[3]  state hash    jq:{sched#k}:state  job_id -> counters and cursors (text)
-- ARGV[1]  now ms, or '' for the server clock
-- ARGV[2]  lookahead ms: jobs whose next fire <= now + lookahead are due
-- ARGV[3]  at most this many jobs (earliest next fire first)
-- Returns  {now, job_1, next_1, def_1, state_1, job_2, ...}; a missing definition or state
--          is returned as ''.

local now = clock(ARGV[1])
local horizon = now + tonumber(ARGV[2])
local found = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', horizon, 'WITHSCORES',
  'LIMIT', 0, tonumber(ARGV[3]))
local out = {now}
for i = 1, #found, 2 do
  local job = found[i]
  out[#out + 1] = job
  out[#out + 1] = found[i + 1]
  out[#out + 1] = redis.call('HGET', KEYS[2], job) or ''
  out[#out + 1] = redis.call('HGET', KEYS[3], job) or ''
end
return out
