-- permit_take.lua: lease up to N permits of a queue's exact limits, the ones that hold across
-- all its partitions and masters (a permit lives in the limit's own slot, not a partition's).
--
-- uses: core, records
--
-- KEYS[1]  permits   zset    jq:{q#exact}:permits  permit -> expiry (ms): one per run a
--                                                  worker may claim or is running
-- KEYS[2]  limits    hash    jq:{q#exact}:limits   concurrency = C: at most C live permits;
--                                                  rate = 'N W': at most N permits granted in
--                                                  any W ms (global_limit.lua sets them)
-- KEYS[3]  grants    zset    jq:{q#exact}:grants   permit -> grant time (ms): the grants of
--                                                  the last W ms (kept only under a rate)
-- ARGV[1]  now                now ms, or '' for the server clock (this slot's own)
-- ARGV[2]  want               the most permits to take
-- ARGV[3]  hold_ms            how long the new permits live unless settled sooner
--                             (permit_settle.lua binds each to a claimed run or drops it)
-- ARGV[4]  token              unique per call: the permits are '<token>:1' .. '<token>:n'
-- Returns  {now, n, next_ms, limited}: n permits taken, named as above; next_ms is when a
--          permit may free or the rate window have room (the earliest live expiry or grant
--          leaving the window, ms), or -1 when none is known; limited is 1 when the queue has
--          an exact limit. With none set, n = want, limited = 0 and nothing is written (no
--          permit is needed). Refused whole (an error reply, nothing changed)
--          when a key holds another type or want is not a whole number.
--
-- A permit whose expiry has passed counts for nothing (its worker died or stalled: its runs'
-- leases have expired too, since permits outlive them by the caller's margin) and is deleted
-- here. Granting writes each new permit to KEYS[1] and, under a rate, to KEYS[3].

local now = clock(ARGV[1])
local want, hold, token = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]

local ok, plan = reading(function()
  if not whole(ARGV[2], 0) or not whole(ARGV[3], 1) then
    refuse('ERR jobqueue: permit_take: want and hold_ms must be whole numbers')
  end
  local limits = read('HMGET', KEYS[2], 'concurrency', 'rate')
  local p = {room = want, next_ms = -1}
  local capped = count(limits[1], 0)
  local rate_n, rate_w = string.match(limits[2] or '', '^(%d+) (%d+)$')
  local rated = count(rate_n, 0) and count(rate_w, 1)
  p.capped, p.rated = capped, rated
  if not capped and not rated then return p end
  expect(KEYS[1], 'zset')
  if capped then
    local live = read('ZCOUNT', KEYS[1], '(' .. int(now), '+inf')
    p.room = math.min(p.room, math.max(tonumber(limits[1]) - live, 0))
    if p.room < want then
      local first = read('ZRANGE', KEYS[1], '(' .. int(now), '+inf', 'BYSCORE', 'LIMIT', 0, 1,
                         'WITHSCORES')
      p.next_ms = whole_or(first[2], 0, -1)
    end
  end
  if rated then
    expect(KEYS[3], 'zset')
    p.rate_w = tonumber(rate_w)
    local since = '(' .. int(now - p.rate_w)
    local granted = read('ZCOUNT', KEYS[3], since, '+inf')
    local room = math.max(tonumber(rate_n) - granted, 0)
    if room < p.room then
      p.room = room
      local first = read('ZRANGE', KEYS[3], since, '+inf', 'BYSCORE', 'LIMIT', 0, 1,
                         'WITHSCORES')
      local oldest = whole_or(first[2], 0, nil)
      if oldest then
        local free_at = oldest + p.rate_w
        if p.next_ms < 0 or free_at < p.next_ms then p.next_ms = free_at end
      end
    end
  end
  return p
end)
if not ok then return plan end
if not plan.capped and not plan.rated then return {now, want, -1, 0} end

if plan.room > 0 then
  local permits, grants = {}, {}
  for i = 1, plan.room do
    permits[#permits + 1] = int(now + hold); permits[#permits + 1] = token .. ':' .. i
    grants[#grants + 1] = now; grants[#grants + 1] = token .. ':' .. i
  end
  bulk('ZADD', KEYS[1], permits, 2000)
  if plan.rated then bulk('ZADD', KEYS[3], grants, 2000) end
end
-- Expired permits go (after the adds: the key is never emptied and then written in one
-- call); one expiring at now itself counts for nothing already and goes next time.
trim_index(KEYS[1], now, 1)
if plan.rated then
  trim_index(KEYS[3], now, plan.rate_w)
  if ARGV[1] == '' then redis.call('PEXPIRE', KEYS[3], plan.rate_w) end
end
return {now, plan.room, plan.next_ms, 1}
