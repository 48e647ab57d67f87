-- advance.lua: move recurring jobs' next fire times forward, compare-and-set, never backwards,
-- and add what the tick did to each job's counters (only when the move is accepted, so two
-- schedulers that fired the same tick count it once). Jobs that share a plan (a herd: same
-- next fire, same outcome) come as one group, so the per-job arguments are just the ids, and
-- each group is read and written with a few multi-key commands, not a few per job.
--
-- uses: core
--
-- KEYS[1]  next      zset    jq:{sched#k}:next   job_id -> next fire time (ms)
-- KEYS[2]  state     hash    jq:{sched#k}:state  job_id -> counters and cursors (text)
-- KEYS[3]  buffered  hash    jq:{sched#k}:held   buffer-one: the buffered run waiting for
--                                                its predecessor (the key's name is
--                                                historical)
-- KEYS[4]  owner     hash    jq:{sched#k}:owner  the partition's lease (sched_lease.lua):
--                                                the current token
-- ARGV[1]  now                now ms, or '' for the server clock (unused but for the reply:
--                             one clock)
-- ARGV[2]  token              the caller's lease token on the partition: nothing moves
--                             unless it is the current one (the caller still owns it)
-- ARGV[3..] groups            10 header fields followed by that many job ids (at most 2,000):
--                             count, expected next (ms), new next (ms, or '' when the
--                             schedule has ended), fired, missed, skipped (overlap), dropped
--                             (fire-all cap), last fired instant (ms, or '' to keep;
--                             optionally followed by ' <queue>', the queue of that fire's
--                             run), through (ms: fire times <= it are handled), buffered
--                             entry ('' = none; else 'fire pred_fire due queue
--                             [pred_queue]', recorded in the buffered hash)
-- Returns  {now, r1, r2, ...}: per job 1 = advanced, 0 = refused (another scheduler moved it
--          first, the job was paused, removed or redefined, the new time is not later, or the
--          job came twice in this call), 2 = fenced: the token is not the partition's current
--          one (another scheduler took it over), and nothing of the call was applied. Refused
--          whole (an error reply, nothing changed) when a key holds another type or is not on
--          this node.
--
-- State text: 'fired missed skipped dropped last through [queue]' (integers, last = -1 when
-- never; queue: of the last fire's run, absent when not given = the definition's queue). A new
-- last replaces the queue too, so a queue never outlives the fire it belongs to.

local now = clock(ARGV[1])
local HEADER = 10

local ok, plan = reading(function()
  expect(KEYS[3], 'hash')
  local holder = read('HGET', KEYS[4], 'token')
  local fenced = not (whole(holder, 0) and tonumber(holder) == tonumber(ARGV[2]))
  local groups, taken = {fenced = fenced}, {}
  local i = 3
  while i <= #ARGV do
    local g = {count = tonumber(ARGV[i]), expected = tonumber(ARGV[i + 1]),
               new_next = tonumber(ARGV[i + 2]),
               d = {tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5]),
                    tonumber(ARGV[i + 6])},
               through = tonumber(ARGV[i + 8]), buffered = ARGV[i + 9], jobs = {}, accepted = {}}
    local last_s, last_q = string.match(ARGV[i + 7], '^(%-?%d+) ?(%S*)$')
    g.last, g.last_q = tonumber(last_s), last_q
    for j = 1, g.count do g.jobs[j] = ARGV[i + HEADER + j - 1] end
    i = i + HEADER + g.count
    if not fenced and g.count > 0 and (g.new_next == nil or g.new_next > g.expected) then
      local scores = read('ZMSCORE', KEYS[1], unpack(g.jobs))
      for j = 1, g.count do
        local job = g.jobs[j]
        if tonumber(scores[j]) == g.expected and not taken[job] then
          taken[job] = true
          g.accepted[#g.accepted + 1] = job
        end
      end
    end
    if #g.accepted > 0 then g.texts = read('HMGET', KEYS[2], unpack(g.accepted)) end
    groups[#groups + 1] = g
  end
  return groups
end)
if not ok then return plan end

local out = {now}
if plan.fenced then
  for _, g in ipairs(plan) do
    for _ = 1, g.count do out[#out + 1] = 2 end
  end
  return out
end
local ended = {} -- removed last: the next key is never emptied and then written in one call
for _, g in ipairs(plan) do
  local ok_ = {}
  if #g.accepted > 0 then
    if g.new_next then
      local pairs_ = {}
      for j, job in ipairs(g.accepted) do
        pairs_[2 * j - 1] = g.new_next
        pairs_[2 * j] = job
      end
      bulk('ZADD', KEYS[1], pairs_, 2000)
    else
      for _, job in ipairs(g.accepted) do ended[#ended + 1] = job end
    end
    -- A herd's jobs mostly share their old state text: compute each new text once.
    local memo, writes = {}, {}
    for j, job in ipairs(g.accepted) do
      local text = g.texts[j] or ''
      local new_text = memo[text]
      if not new_text then
        local a, b, c, d, e, f, q = string.match(text,
          '^(%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) ?(%S*)')
        local s5, s6, s7 = tonumber(e) or -1, tonumber(f) or -1, q or ''
        if g.last then s5, s7 = g.last, g.last_q end
        if g.through > s6 then s6 = g.through end
        new_text = string.format('%d %d %d %d %d %d', (tonumber(a) or 0) + g.d[1],
          (tonumber(b) or 0) + g.d[2], (tonumber(c) or 0) + g.d[3],
          (tonumber(d) or 0) + g.d[4], s5, s6)
        if s7 ~= '' then new_text = new_text .. ' ' .. s7 end
        memo[text] = new_text
      end
      writes[2 * j - 1] = job
      writes[2 * j] = new_text
      ok_[job] = true
    end
    bulk('HSET', KEYS[2], writes, 2000)
    if g.buffered ~= '' then
      for _, job in ipairs(g.accepted) do redis.call('HSET', KEYS[3], job, g.buffered) end
    end
  end
  for _, job in ipairs(g.jobs) do out[#out + 1] = ok_[job] and 1 or 0 end
end
if #ended > 0 then bulk('ZREM', KEYS[1], ended, 1000) end
return out
