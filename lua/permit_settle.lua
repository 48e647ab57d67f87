-- permit_settle.lua: what became of a worker's permits of a queue's exact limits: bind the
-- permits its claims used to the runs they claimed, drop the ones they did not use, extend
-- the permits of the runs it still holds (with their heartbeats) and give back the permits
-- of the runs it finished.
--
-- uses: core
--
-- KEYS[1]  permits   zset    jq:{q#exact}:permits  permit -> expiry (ms) (permit_take.lua)
-- KEYS[2]  grants    zset    jq:{q#exact}:grants   permit -> grant time (ms), under a rate
-- ARGV[1]  now                now ms, or '' for the server clock (this slot's own)
-- ARGV[2]  live_ms            a bound or extended permit expires at now + live_ms (the
--                             caller's lease plus a margin for clocks and round trips)
-- ARGV[3..] lists             four lists, each a count then its items: binds (pairs: a
--                             taken permit, the run permit it becomes,
--                             '<partition>|<run_id>|<fence>'), unused (taken permits no
--                             claim used), extends (run permits), returns (run permits)
-- Returns  {bound, extended, returned, refused...}: counts, then the binds refused (their
--          taken permit had expired or was gone: the run they claimed has no permit and must
--          not run; the caller releases it) as the run permits they named.
--          Refused whole (an error reply, nothing changed) when a key holds another type or
--          a count is not a whole number.
--
-- A bound permit is renamed (the taken one goes, the run's comes, both in KEYS[1]); an
-- unused one leaves KEYS[1] and KEYS[2] (under a rate, a permit not used is not a claim).
-- An extend of a permit that has expired or is gone is ignored (ZADD XX, and only a live
-- one): a worker that stalled past its permit cannot revive it; the run was, or will be,
-- claimed again under a new permit. Returning a permit that is gone changes nothing.

local now = clock(ARGV[1])

local ok, plan = reading(function()
  if not whole(ARGV[2], 1) then refuse('ERR jobqueue: permit_settle: bad live_ms') end
  local lists, i = {}, 3
  for n = 1, 4 do
    local count_ = ARGV[i]
    if not whole(count_, 0) or i + tonumber(count_) * (n == 1 and 2 or 1) > #ARGV + 1 then
      refuse('ERR jobqueue: permit_settle: malformed lists')
    end
    local items = {}
    local len = tonumber(count_) * (n == 1 and 2 or 1)
    for j = 1, len do items[j] = ARGV[i + j] end
    lists[n] = items
    i = i + len + 1
  end
  expect(KEYS[1], 'zset')
  expect(KEYS[2], 'zset')
  local p = {binds = {}, refused = {}, unused = lists[2], extend = {}, returns = lists[4]}
  for j = 1, #lists[1], 2 do
    local at = tonumber(read('ZSCORE', KEYS[1], lists[1][j]))
    if at and at > now then
      p.binds[#p.binds + 1] = {lists[1][j], lists[1][j + 1]}
    else
      p.refused[#p.refused + 1] = lists[1][j + 1]
    end
  end
  for _, member in ipairs(lists[3]) do
    local at = tonumber(read('ZSCORE', KEYS[1], member))
    if at and at > now then p.extend[#p.extend + 1] = member end
  end
  return p
end)
if not ok then return plan end

local live_until = int(now + tonumber(ARGV[2]))
-- Adds before removals: the key is never emptied and then written in one call.
local adds = {}
for _, b in ipairs(plan.binds) do adds[#adds + 1] = live_until; adds[#adds + 1] = b[2] end
for _, member in ipairs(plan.extend) do
  adds[#adds + 1] = live_until; adds[#adds + 1] = member
end
if #adds > 0 then bulk('ZADD', KEYS[1], adds, 2000) end
local gone = {}
for _, b in ipairs(plan.binds) do gone[#gone + 1] = b[1] end
for _, member in ipairs(plan.unused) do gone[#gone + 1] = member end
for _, member in ipairs(plan.returns) do gone[#gone + 1] = member end
if #gone > 0 then bulk('ZREM', KEYS[1], gone, 1000) end
if #plan.unused > 0 then bulk('ZREM', KEYS[2], plan.unused, 1000) end
local out = {#plan.binds, #plan.extend, #plan.returns}
for _, member in ipairs(plan.refused) do out[#out + 1] = member end
return out
