-- group_set.lua: fair shares' settings in one partition of a queue (the client calls it on
-- every partition): fair shares on or off, and one group's weight, max_size and pause.
--
-- uses: core, wake, groups
--
-- KEYS[1]  gconf     hash    jq:{q#p}:gconf    fair = '1' while fair shares are on; per group
--                                              w:<group> (weight), max:<group> (max_size),
--                                              p:<group> (present while paused)
-- KEYS[2]  gwait     zset    jq:{q#p}:gwait    the ring's waiting groups (claim.lua)
-- KEYS[3]  wake      list    jq:{q#p}:wake     wake tokens for idle workers
-- ARGV[1]  now                now ms, or '' for the server clock
-- ARGV[2]  prefix             key prefix jq:{q#p}: (unused: the keys are given)
-- ARGV[3]  fair               '1' on, '0' off, '' unchanged
-- ARGV[4]  group              the group (a limit_key; '' is the runs without one)
-- ARGV[5]  weight             1..1000, or '' unchanged
-- ARGV[6]  max_size           the most runs waiting in the group, '0' for no limit, or ''
--                             unchanged
-- ARGV[7]  paused             '1' pause the group, '0' resume it, '' unchanged
-- Returns  1 when this call changed a setting, 0 when each already was so. Refused whole (an
--          error reply, nothing changed) when a key holds another type or an argument is
--          out of range.
--
-- A paused group's runs stay in line; claim passes the group over until it is resumed.
-- Resuming (and turning fair shares on) wakes idle workers. Turning fair shares off leaves
-- the ring's keys: claim then takes every due run in due order, as without groups.

local now = clock(ARGV[1])
local fair, group, weight, max_size, paused = ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]

local ok, plan = reading(function()
  if fair ~= '' and fair ~= '0' and fair ~= '1' then
    refuse('ERR jobqueue: fair must be 1, 0 or empty, not ' .. utf8_head(fair, 20))
  end
  if weight ~= '' and not (count(weight, 1) and tonumber(weight) <= GROUP_WEIGHT_MAX) then
    refuse('ERR jobqueue: a group weight must be from 1 to ' .. GROUP_WEIGHT_MAX)
  end
  if max_size ~= '' and not count(max_size, 0) then
    refuse('ERR jobqueue: a group max_size must be a whole number')
  end
  if paused ~= '' and paused ~= '0' and paused ~= '1' then
    refuse('ERR jobqueue: paused must be 1, 0 or empty')
  end
  local v = read('HMGET', KEYS[1], 'fair', 'w:' .. group, 'max:' .. group, 'p:' .. group)
  expect(KEYS[2], 'zset')
  return {fair = v[1], weight = v[2], max = v[3], paused = v[4], waker = waker(KEYS[3])}
end)
if not ok then return plan end

local changed = 0
local function set(field, want, have)
  if want == have then return end
  if want then redis.call('HSET', KEYS[1], field, want) else redis.call('HDEL', KEYS[1], field) end
  changed = 1
end
if fair ~= '' then set('fair', fair == '1' and '1' or false, plan.fair) end
if weight ~= '' then set('w:' .. group, weight ~= '1' and weight or false, plan.weight) end
if max_size ~= '' then set('max:' .. group, max_size ~= '0' and max_size or false, plan.max) end
if paused ~= '' then set('p:' .. group, paused == '1' and '1' or false, plan.paused) end
if (paused == '0' and plan.paused) or (fair == '1' and not plan.fair) then
  -- A resumed group waits at +inf: looked at by the next claim (XX: only if it waits there).
  if paused == '0' then redis.call('ZADD', KEYS[2], 'XX', 0, group) end
  wake(plan.waker, WAKE_TOKENS)
end
return changed
