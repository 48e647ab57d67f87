-- advance.lua: move recurring jobs' next fire times forward, compare-and-set, never backwards,
-- and add what the tick did to each job's counters (only when the move is accepted, so two
-- schedulers that fired the same tick count it once). Jobs that share a plan (a herd: same
-- next fire, same outcome) come as one group, so the per-job arguments are just the ids, and
-- each group is read and written with a few multi-key commands, not a few per job.
--
-- KEYS[1]  next zset     jq:{sched#k}:next
-- KEYS[2]  def hash      jq:{sched#k}:def    (unused: sched_define removes next with def)
-- KEYS[3]  state hash    jq:{sched#k}:state
-- KEYS[4]  held hash     jq:{sched#k}:held   (buffer-one: the run waiting for its predecessor)
-- ARGV[1]  now ms, or '' for the server clock (unused but for the reply: one clock)
-- ARGV[2..] groups of 10 header fields followed by that many job ids (at most 2,000):
--          count, expected next (ms), new next (ms, or '' when the schedule has ended),
--          fired, missed, skipped (overlap), dropped (fire-all cap),
--          last fired instant (ms, or '' to keep; optionally followed by ' <queue>', the
--          queue of that fire's run), through (ms: fire times <= it are handled),
--          held text ('' = none; else 'fire pred_fire due queue [pred_queue]', recorded in
--          the held hash)
-- Returns  {now, r1, r2, ...}: per job 1 = advanced, 0 = refused (another scheduler moved it
--          first, the job was paused, removed or redefined, or the new time is not later).
--
-- State text: 'fired missed skipped dropped last through [queue]' (integers, last = -1 when
-- never; queue: of the last fire's run, absent when not given = the definition's queue). A new
-- last replaces the queue too, so a queue never outlives the fire it belongs to.

local now = clock(ARGV[1])
local out = {now}
local HEADER = 10

local i = 2
while i <= #ARGV do
  local count = tonumber(ARGV[i])
  local expected = tonumber(ARGV[i + 1])
  local new_next = tonumber(ARGV[i + 2])
  local d1, d2 = tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4])
  local d3, d4 = tonumber(ARGV[i + 5]), tonumber(ARGV[i + 6])
  local last_s, last_q = string.match(ARGV[i + 7], '^(%-?%d+) ?(%S*)$')
  local last = tonumber(last_s)
  local through = tonumber(ARGV[i + 8])
  local held = ARGV[i + 9]
  local jobs = {}
  for j = 1, count do jobs[j] = ARGV[i + HEADER + j - 1] end
  i = i + HEADER + count
  local accepted = {}
  if count > 0 and (new_next == nil or new_next > expected) then
    local scores = redis.call('ZMSCORE', KEYS[1], unpack(jobs))
    for j = 1, count do
      if tonumber(scores[j]) == expected then accepted[#accepted + 1] = jobs[j] end
    end
  end
  local ok = {}
  if #accepted > 0 then
    if new_next then
      local pairs_ = {}
      for j, job in ipairs(accepted) do
        pairs_[2 * j - 1] = new_next
        pairs_[2 * j] = job
      end
      redis.call('ZADD', KEYS[1], unpack(pairs_))
    else
      redis.call('ZREM', KEYS[1], unpack(accepted))
    end
    -- A herd's jobs mostly share their old state text: compute each new text once.
    local texts = redis.call('HMGET', KEYS[3], unpack(accepted))
    local memo, writes = {}, {}
    for j, job in ipairs(accepted) do
      local text = texts[j] or ''
      local new_text = memo[text]
      if not new_text then
        local a, b, c, d, e, f, g = string.match(text,
          '^(%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) ?(%S*)')
        local s5, s6, s7 = tonumber(e) or -1, tonumber(f) or -1, g or ''
        if last then s5, s7 = last, last_q end
        if through > s6 then s6 = through end
        new_text = string.format('%d %d %d %d %d %d', (tonumber(a) or 0) + d1,
          (tonumber(b) or 0) + d2, (tonumber(c) or 0) + d3, (tonumber(d) or 0) + d4, s5, s6)
        if s7 ~= '' then new_text = new_text .. ' ' .. s7 end
        memo[text] = new_text
      end
      writes[2 * j - 1] = job
      writes[2 * j] = new_text
      ok[job] = true
    end
    redis.call('HSET', KEYS[3], unpack(writes))
    if held ~= '' then
      for _, job in ipairs(accepted) do redis.call('HSET', KEYS[4], job, held) end
    end
  end
  for _, job in ipairs(jobs) do out[#out + 1] = ok[job] and 1 or 0 end
end
return out
