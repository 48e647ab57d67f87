-- sched_due.lua: the recurring jobs of one scheduler partition that fall due, in one round
-- trip (read only). A herd shares its definition text, so each distinct text is sent once and
-- the jobs refer to it by index: 1,000,000 hourly jobs cost one definition, not a million.
--
-- Flags: no-writes (it runs under OOM and could run on a replica)
--
-- uses: core
--
-- KEYS[1]  next      zset    jq:{sched#k}:next   job_id -> next fire time (ms)
-- KEYS[2]  defs      hash    jq:{sched#k}:def    job_id -> definition (JSON)
-- KEYS[3]  state     hash    jq:{sched#k}:state  job_id -> counters and cursors (text)
-- KEYS[4]  buffered  hash    jq:{sched#k}:held   job_id -> 'fire pred_fire due queue
--                                                [pred_queue]'
-- ARGV[1]  now                now ms, or '' for the server clock
-- ARGV[2]  lookahead_ms       jobs whose next fire <= now + lookahead are due
-- ARGV[3]  limit              at most this many jobs (earliest next fire first)
-- ARGV[4]  cursor_next        cursor score ('' = none): with ARGV[5], the last job of the
--                             caller's previous batch
-- ARGV[5]  cursor_job         when it still has that next fire (its advance has not run yet),
--                             the read starts after it, so a caller may read the next batch
--                             while the previous batch's writes are in flight; otherwise
--                             (advanced) it starts from the earliest.
-- Returns  {now, D, def_1 .. def_D, then segments: next, def index (0 = the definition
--          vanished), extra, count, job_1 .. job_count}. Consecutive jobs with the same next
--          fire and definition share a segment (a herd is a few segments, not 4 fields a job).
--          extra is '' for jobs without an overlap policy; for the others (one job per
--          segment) it is '<state text>|<buffered entry>' (either part '' when absent).
--          An error reply when a key holds another type or is not on this node. A job whose
--          next fire is -inf or +inf (no scheduler writes either) is never due.

local now = clock(ARGV[1])

-- Read only: the whole script is its read phase.
local _, reply = reading(function()
  local horizon = now + tonumber(ARGV[2])
  local limit = tonumber(ARGV[3])
  local found
  local cursor = tonumber(ARGV[4])
  if cursor and tonumber(read('ZSCORE', KEYS[1], ARGV[5])) == cursor then
    local rank = read('ZRANK', KEYS[1], ARGV[5])
    found = read('ZRANGE', KEYS[1], rank + 1, rank + limit, 'WITHSCORES')
  else
    -- '(-inf': a job at -inf (garbage: no scheduler writes it) is never due, like one at +inf.
    found = read('ZRANGEBYSCORE', KEYS[1], '(-inf', horizon, 'WITHSCORES', 'LIMIT', 0, limit)
  end

  -- The cursor read is by rank: keep only the jobs within the horizon.
  local ids, nexts = {}, {}
  for i = 1, #found, 2 do
    if tonumber(found[i + 1]) > horizon then break end
    ids[#ids + 1] = found[i]
    nexts[#nexts + 1] = found[i + 1]
  end

  local defs, index_of, policed = {}, {}, {}
  local segs = {} -- flat: next, idx, extra, count, jobs...
  local open_count = nil -- index in segs of the open segment's count, if it can grow
  local open_next, open_idx = nil, nil
  -- HMGET by the thousand: a redis.call per job costs more than the work it does (and unpack
  -- has a stack limit).
  local texts = {}
  for lo = 1, #ids, 1000 do
    local part = read('HMGET', KEYS[2], unpack(ids, lo, math.min(#ids, lo + 999)))
    for k = 1, #part do texts[lo + k - 1] = part[k] end
  end
  for k, job in ipairs(ids) do
    local text = texts[k]
    local idx, extra = 0, ''
    if text then
      idx = index_of[text]
      if not idx then
        defs[#defs + 1] = text
        idx = #defs
        index_of[text] = idx
        -- Compact JSON omits the default overlap ("allow"): only policed jobs carry the key.
        policed[idx] = string.find(text, '"overlap":', 1, true) ~= nil
      end
      if policed[idx] then
        extra = (read('HGET', KEYS[3], job) or '') .. '|' ..
          (read('HGET', KEYS[4], job) or '')
      end
    end
    if open_count and extra == '' and nexts[k] == open_next and idx == open_idx then
      segs[open_count] = segs[open_count] + 1
    else
      local n = #segs
      segs[n + 1] = nexts[k]; segs[n + 2] = idx; segs[n + 3] = extra; segs[n + 4] = 1
      if extra == '' then
        open_count, open_next, open_idx = n + 4, nexts[k], idx
      else
        open_count = nil
      end
    end
    segs[#segs + 1] = job
  end

  local out = {now, #defs}
  for _, text in ipairs(defs) do out[#out + 1] = text end
  for _, v in ipairs(segs) do out[#out + 1] = v end
  return out
end)
return reply
