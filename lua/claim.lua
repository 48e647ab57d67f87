-- claim.lua: lease up to N claimable runs of one partition to one worker.
--
-- KEYS[1]  due zset      jq:{q#p}:due
-- KEYS[2]  leases zset   jq:{q#p}:leases
-- KEYS[3]  dead zset     jq:{q#p}:dead
-- KEYS[4]  stats hash    jq:{q#p}:stats
-- KEYS[5]  fence counter jq:{q#p}:fences (the last fence issued in the partition)
-- ARGV[1]  now ms, or '' for the server clock
-- ARGV[2]  key prefix    jq:{q#p}:
-- ARGV[3]  N, the most runs to claim
-- ARGV[4]  owner (worker id)
-- ARGV[5]  default lease ms (used when the run has no lease of its own)
-- ARGV[6]  dead retention ms
-- Returns  {now, next_wake, count, then 11 fields per claimed run:
--           run_id, fence, attempt, max_attempts, task, payload, lease_until, timeout_ms,
--           job_id, scheduled_for, due}
--          next_wake = earliest due time or lease expiry still pending in this partition
--          (ms), or -1 when there is none: the worker sleeps on the wake list until then.
--
-- Runs whose lease expired are taken first (their worker died or stalled); each expiry counts
-- an attempt and a run past max_attempts goes to the dead set instead. Every claim issues a
-- new fence, greater than the run's and than any issued before in the partition, so the
-- previous holder's heartbeat and commit are refused from now on, even by a new life of the
-- same run id (created again after its record expired).
--
-- Dead index entries older than the dead retention (their records have expired) are trimmed.
--
-- A claim writes no history entry: the record holds the current attempt (owner, fence,
-- attempt, started). The history keeps what the record cannot: how earlier attempts ended
-- (lease expired, with the owner that lost it; failed; released).

local now = clock(ARGV[1])
local prefix, limit, owner = ARGV[2], tonumber(ARGV[3]), ARGV[4]
local default_lease, dead_retention = tonumber(ARGV[5]), tonumber(ARGV[6])
local out = {}
local leases = {} -- score, member pairs: one ZADD for the call
local claimed, expired, died = 0, 0, 0
local last_fence = nil -- the partition's fence counter, read at the first claim

local FIELDS = {'state', 'task', 'payload', 'attempt', 'max_attempts', 'fence', 'lease_ms',
                'timeout_ms', 'job', 'scheduled_for', 'due', 'owner'}
local STATES = {pending = true, running = true, done = true, dead = true, cancelled = true}

-- The record, or nil and the error when the key is not a hash: pcall, because one foreign
-- key must not fail every claim of its partition (a poison pill for all workers).
local function read(key)
  local v = redis.pcall('HMGET', key, unpack(FIELDS))
  if v.err then return nil, v.err end
  -- One constructor, no loop: this runs for every claimed run. HMGET gives false for a
  -- missing field; 'or nil' makes it nil like an absent table entry.
  return {state = v[1] or nil, task = v[2] or nil, payload = v[3] or nil,
          attempt = v[4] or nil, max_attempts = v[5] or nil, fence = v[6] or nil,
          lease_ms = v[7] or nil, timeout_ms = v[8] or nil, job = v[9] or nil,
          scheduled_for = v[10] or nil, due = v[11] or nil, owner = v[12] or nil}
end

local function bury(run_id, key, reason)
  redis.call('HSET', key, 'state', 'dead', 'error', reason, 'finished', now)
  redis.call('HDEL', key, 'lease_until')
  redis.call('ZREM', KEYS[2], run_id)
  redis.call('ZADD', KEYS[3], now, run_id)
  history(prefix, run_id, now .. ' dead ' .. reason)
  expire_record(prefix, run_id, dead_retention)
  died = died + 1
end

-- A run id whose key is not a hash: listed as dead so an operator sees it; the key itself is
-- someone else's data and is left alone.
local function bury_foreign(run_id)
  redis.call('ZREM', KEYS[2], run_id)
  redis.call('ZADD', KEYS[3], now, run_id)
  died = died + 1
end

local function take(run_id, key, run)
  if not last_fence then last_fence = tonumber(redis.call('GET', KEYS[5])) or 0 end
  local fence = math.max(last_fence, tonumber(run.fence) or 0) + 1
  last_fence = fence
  local attempt = (tonumber(run.attempt) or 0) + 1
  local lease = tonumber(run.lease_ms) or 0
  if lease <= 0 then lease = default_lease end
  local lease_until = now + lease
  redis.call('HSET', key, 'state', 'running', 'fence', fence, 'attempt', attempt,
             'owner', owner, 'lease_until', lease_until, 'started', now)
  leases[#leases + 1] = lease_until
  leases[#leases + 1] = run_id
  local n = #out
  out[n + 1] = run_id; out[n + 2] = fence; out[n + 3] = attempt
  out[n + 4] = tonumber(run.max_attempts) or 1; out[n + 5] = run.task
  out[n + 6] = run.payload; out[n + 7] = lease_until; out[n + 8] = tonumber(run.timeout_ms) or 0
  out[n + 9] = run.job or ''; out[n + 10] = run.scheduled_for or ''
  out[n + 11] = tonumber(run.due) or 0
  claimed = claimed + 1
end

-- A whole number in [lo, 2^53]: tonumber also reads 'nan', 'inf' and fractions, which would
-- make a run never reach its max_attempts or a fence never equal itself.
local function whole(v, lo)
  local n = tonumber(v)
  return n ~= nil and n == n and n >= lo and n <= 9007199254740992 and n == math.floor(n)
end

-- A record that cannot be run is dead-lettered with the reason, never handed to a worker.
-- Fields at their default are absent (create_run stores only what differs), so only a
-- present, non-numeric fence or attempt is corrupt.
local function corrupt(run)
  if not run.task or run.task == '' then return 'corrupt record: no task' end
  if not run.payload then return 'corrupt record: no payload' end
  if not whole(run.max_attempts, 1) then return 'corrupt record: bad max_attempts' end
  if run.fence and not whole(run.fence, 0) then return 'corrupt record: bad fence' end
  if run.attempt and not whole(run.attempt, 0) then return 'corrupt record: bad attempt' end
  return nil
end

-- 1. Expired leases.
local stale = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, limit)
for _, run_id in ipairs(stale) do
  if claimed >= limit then break end
  local key = prefix .. 'run:' .. run_id
  local run, err = read(key)
  if err then
    bury_foreign(run_id)
  elseif run.state ~= 'running' then
    redis.call('ZREM', KEYS[2], run_id) -- index entry without a running record: drop it
  else
    expired = expired + 1
    history(prefix, run_id, now .. ' lease expired fence=' .. (run.fence or '?') ..
            ' attempt=' .. (run.attempt or '?') .. ' owner=' .. (run.owner or '?'))
    local bad = corrupt(run)
    if bad then
      bury(run_id, key, bad)
    elseif (tonumber(run.attempt) or 0) >= tonumber(run.max_attempts) then
      bury(run_id, key, 'lease expired on attempt ' .. (run.attempt or '?') ..
           ' of ' .. run.max_attempts .. ' (worker died or stalled)')
    else
      take(run_id, key, run)
    end
  end
end

-- 2. Due runs.
if claimed < limit then
  local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, limit - claimed)
  -- They are the lowest-ranked members: one removal by rank instead of one ZREM each.
  if #due > 0 then redis.call('ZREMRANGEBYRANK', KEYS[1], 0, #due - 1) end
  for _, run_id in ipairs(due) do
    local key = prefix .. 'run:' .. run_id
    local run, err = read(key)
    if err then
      bury_foreign(run_id)
    elseif run.state == 'pending' then
      local bad = corrupt(run)
      if bad then bury(run_id, key, bad) else take(run_id, key, run) end
    elseif run.state == nil then
      -- No record (expired or purged): a stray entry, dropped. A record without a state is
      -- corrupt: dead-lettered so that it is seen.
      if redis.call('EXISTS', key) == 1 then bury(run_id, key, 'corrupt record: no state') end
    elseif not STATES[run.state] then
      bury(run_id, key, 'corrupt record: unknown state ' .. string.sub(run.state, 1, 40))
    else
      -- A record in another state has no business in the due set: drop the stray entry.
      history(prefix, run_id, now .. ' stray due entry dropped (state ' .. run.state .. ')')
      local ttl = redis.call('PTTL', key)  -- a finished record's history expires with it
      if ttl > 0 then redis.call('PEXPIRE', prefix .. 'hist:' .. run_id, ttl) end
    end
  end
end

if claimed > 0 then
  bulk('ZADD', KEYS[2], leases, 2000)
  redis.call('HINCRBY', KEYS[4], 'claimed', claimed)
  redis.call('SET', KEYS[5], last_fence)
end
if dead_retention and dead_retention > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - dead_retention)
end
if expired > 0 then redis.call('HINCRBY', KEYS[4], 'lease_expired', expired) end
if died > 0 then redis.call('HINCRBY', KEYS[4], 'dead', died) end

local next_wake = -1
local first_due = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first_due[2] then next_wake = tonumber(first_due[2]) end
local first_lease = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if first_lease[2] and (next_wake < 0 or tonumber(first_lease[2]) < next_wake) then
  next_wake = tonumber(first_lease[2])
end

local result = {now, next_wake, claimed}
for i = 1, #out do result[#result + 1] = out[i] end
return result
