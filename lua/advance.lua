-- advance.lua: move recurring jobs' next fire times forward, compare-and-set, never backwards,
-- and add what the tick did to each job's counters (only when the move is accepted, so two
-- schedulers that fired the same tick count it once).
--
-- KEYS[1]  next zset     jq:{sched#k}:next
-- KEYS[2]  def hash      jq:{sched#k}:def
-- KEYS[3]  state hash    jq:{sched#k}:state
-- ARGV[1]  now ms, or '' for the server clock (unused but for the reply: one clock)
-- ARGV[2..] 9 fields per job:
--          job_id, expected next (ms), new next (ms, or '' when the schedule has ended),
--          fired, missed, skipped (overlap), dropped (fire-all cap),
--          last fired instant (ms, or '' to keep), through (ms: fire times <= it are handled)
-- Returns  {now, r1, r2, ...}: per job 1 = advanced, 0 = refused (another scheduler moved it
--          first, the job was paused, removed or redefined, or the new time is not later).
--
-- State text: 'fired missed skipped dropped last through' (integers, last = -1 when never).

local now = clock(ARGV[1])
local out = {now}

for i = 2, #ARGV, 9 do
  local job = ARGV[i]
  local expected = tonumber(ARGV[i + 1])
  local new_next = tonumber(ARGV[i + 2])
  local current = tonumber(redis.call('ZSCORE', KEYS[1], job))
  local ok = current ~= nil and current == expected
    and redis.call('HEXISTS', KEYS[2], job) == 1
    and (new_next == nil or new_next > expected)
  if ok then
    if new_next then
      redis.call('ZADD', KEYS[1], new_next, job)
    else
      redis.call('ZREM', KEYS[1], job)
    end
    local s = {0, 0, 0, 0, -1, -1}
    local text = redis.call('HGET', KEYS[3], job)
    if text then
      local n = 0
      for field in string.gmatch(text, '%S+') do
        n = n + 1
        s[n] = tonumber(field)
      end
    end
    for f = 1, 4 do s[f] = s[f] + tonumber(ARGV[i + 2 + f]) end
    if ARGV[i + 7] ~= '' then s[5] = tonumber(ARGV[i + 7]) end
    s[6] = math.max(s[6], tonumber(ARGV[i + 8]))
    redis.call('HSET', KEYS[3], job, string.format('%d %d %d %d %d %d',
      s[1], s[2], s[3], s[4], s[5], s[6]))
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
