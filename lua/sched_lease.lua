-- sched_lease.lua: the lease by which one scheduler owns one scheduler partition. Only the
-- owner ticks the partition, so N schedulers share the K partitions instead of repeating each
-- other; the token, a fence that only grows, changes hands with the lease, and advance.lua
-- accepts moves only with the current token, so an owner that stalled past its lease cannot
-- move a job's next fire once another has taken over.
--
-- uses: core, fences
--
-- KEYS[1]  owner     hash    jq:{sched#k}:owner  owner (scheduler id, '' = none), token
--                                                (the current fence), until (ms)
-- ARGV[1]  now                now ms, or '' for the server clock
-- ARGV[2]  scheduler          the caller's scheduler id
-- ARGV[3]  action             'acquire': take the partition if it has no owner or its lease
--                             has expired (a new token), renew it if the caller holds it;
--                             'renew': extend the caller's lease, only with its token (also
--                             after it expired, as long as nobody took the partition since);
--                             'release': give the partition up, only with its token;
--                             'read': nothing changes (the lease as it is, from the node
--                             that serves it)
-- ARGV[4]  lease_ms           how long a lease lasts from now
-- ARGV[5]  token              the caller's token ('' for acquire)
-- Returns  {now, held, token, owner, until}: held 1 = the caller holds the partition (token
--          its token, until its lease's end), 0 = it does not (owner, token and until are the
--          current holder's; owner '' when none). Refused whole (an error reply, nothing
--          changed) when the key holds another type or is not on this node.
--
-- The token is at least the server clock in microseconds and above every token issued
-- before (issue_fence, lib/fences.lua): a server that lost part of its history never issues a
-- token again. A garbage token or until counts as 0 (overwritten by the next acquire).

local now = clock(ARGV[1])
local me, action, lease, token = ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]

local ok, cur = reading(function()
  if action ~= 'acquire' and action ~= 'renew' and action ~= 'release' and action ~= 'read' then
    refuse('ERR jobqueue: unknown lease action ' .. action .. '; nothing was changed')
  end
  local v = read('HMGET', KEYS[1], 'owner', 'token', 'until')
  return {owner = v[1] or '', token = whole_or(v[2], 0, 0), ['until'] = whole_or(v[3], 0, 0)}
end)
if not ok then return cur end

local mine = cur.owner == me and cur.owner ~= '' and int(cur.token) == token
local function reply(held, t, owner, u) return {now, held, int(t), owner, int(u)} end

if action == 'read' then
  local held = mine and cur['until'] >= now
  return reply(held and 1 or 0, cur.token, cur.owner, cur['until'])
end
if action == 'release' then
  if mine then redis.call('HSET', KEYS[1], 'owner', '', 'until', 0) end
  return reply(0, cur.token, '', 0)
end
if action == 'renew' or (action == 'acquire' and cur.owner == me and cur['until'] >= now) then
  if action == 'acquire' then mine = true end
  if not mine then return reply(0, cur.token, cur.owner, cur['until']) end
  redis.call('HSET', KEYS[1], 'until', int(now + lease))
  return reply(1, cur.token, me, now + lease)
end
if cur.owner ~= '' and cur['until'] >= now then
  return reply(0, cur.token, cur.owner, cur['until'])
end
local fresh = issue_fence({last = cur.token}, 0) -- the token is kept in the owner hash
redis.call('HSET', KEYS[1], 'owner', me, 'token', int(fresh), 'until', int(now + lease))
return reply(1, fresh, me, now + lease)
