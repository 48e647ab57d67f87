-- lib/claimable.lua: claim.lua's view of a run: its record, what makes it unfit to run, the
-- deduplication key its first claim releases, and the lease a claim grants it.
--
-- uses: core, fences, records, events
--
-- Provides (`call`: claim.lua's context: now, prefix, owner, default_lease and its KEYS by
-- name; `p`/`plan`: its plan, built in phase 1):
--   claim_record(prefix, run_id) -> the fields claim reads (CLAIM_FIELDS), or nil for a key
--     of another type; a missing record reads as a table without a state
--   corrupt(run) -> why a pending or running record cannot be run, or nil
--   dedupe_ends(p, prefix, run) (phase 1): a run enqueued under a deduplication key without a
--     ttl (dedupe.lua) releases the key at its first claim: the key (jq:{q#p}:dedupe:<key>)
--     is deleted (p.undedupe) if it still names the run and has no expiry
--   lease_runs(plan, call) -> out, fences, new_leases, next_lease (phase 2): each taken run
--     gets a new fence (issue_fence: the previous holder's heartbeat and commit are refused
--     from now on), an attempt, the owner and a lease; a lease taken back (run.expired) says
--     so in the history; 'claimed' and 'expired' events. `out`: 12 reply fields per run.
--     A claim writes no history entry: the record holds the current attempt (owner, fence,
--     attempt, started). The history keeps what the record cannot: how earlier attempts
--     ended.

local CLAIM_FIELDS = {'state', 'task', 'payload', 'attempt', 'max_attempts', 'fence', 'lease_ms',
                'timeout_ms', 'job', 'scheduled_for', 'due', 'owner', 'hist', 'lease_until',
                'meta', 'priority', 'dedupe', 'limit_key', 'held', 'parked', 'parents'}
local CLAIM_STATES = {pending = true, running = true, done = true, dead = true, cancelled = true,
                waiting = true}

local function claim_record(prefix, run_id)
  local v, foreign = checked(redis.pcall('HMGET', prefix .. 'run:' .. run_id, unpack(CLAIM_FIELDS)),
                             prefix .. 'run:' .. run_id, true)
  if foreign then return nil end
  -- One constructor, no loop: this runs for every claimed run. HMGET gives false for a
  -- missing field; 'or nil' makes it nil like an absent table entry.
  return {state = v[1] or nil, task = v[2] or nil, payload = v[3] or nil,
          attempt = v[4] or nil, max_attempts = v[5] or nil, fence = v[6] or nil,
          lease_ms = v[7] or nil, timeout_ms = v[8] or nil, job = v[9] or nil,
          scheduled_for = v[10] or nil, due = v[11] or nil, owner = v[12] or nil,
          hist = v[13] or nil, lease_until = v[14] or nil, meta = v[15] or nil,
          priority = v[16] or nil, dedupe = v[17] or nil, limit_key = v[18] or nil,
          held = v[19] or nil, parked = v[20] or nil, parents = v[21] or nil}
end

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

local function dedupe_ends(p, prefix, run)
  if not run.dedupe or (tonumber(run.attempt) or 0) > 0 then return end
  local dkey = prefix .. 'dedupe:' .. run.dedupe
  local holder, foreign = checked(redis.pcall('GET', dkey), dkey, true)
  if not foreign and holder == run.id and read('PTTL', dkey) == -1 then
    p.undedupe[#p.undedupe + 1] = dkey
  end
end

local function lease_runs(plan, call)
  local now, prefix, owner, default_lease = call.now, call.prefix, call.owner, call.default_lease
  local out = {}
  local new_leases = {} -- score, member pairs: one ZADD for the call
  local next_lease_added = nil
  local taken_fences = {} -- the rate limit's log keeps each claim by its fence
  for _, run in ipairs(plan.take) do
    local key = prefix .. 'run:' .. run.id
    local fence = issue_fence(plan.fences, run.fence)
    taken_fences[#taken_fences + 1] = fence
    local attempt = (tonumber(run.attempt) or 0) + 1
    local until_ = lease_until(now, run.lease_ms, default_lease)
    if run.expired then
      if run.hist_ok then
        history(prefix, run.id, now .. ' lease expired fence=' .. (run.fence or '?') ..
                ' attempt=' .. (run.attempt or '?') .. ' owner=' .. (run.owner or '?'))
      end
      -- its holder may have had the task: a later hand-back starts a new window (bounce.lua)
      redis.call('HDEL', key, 'unknown_since', 'bounces')
      emit(plan.log, 'expired', run.id, (run.attempt or '0') .. '|' .. (run.owner or ''))
    end
    redis.call('HSET', key, 'state', 'running', 'fence', int(fence), 'attempt', attempt,
               'owner', owner, 'lease_until', until_, 'started', now)
    if run.slots_taken then redis.call('HSET', key, 'held', run.slots_taken) end
    if run.window then
      local w = run.window
      for i = 1, #w.fences do
        if not w.fences[i] then w.fences[i] = int(fence); break end
      end
    end
    new_leases[#new_leases + 1] = until_
    new_leases[#new_leases + 1] = run.id
    if not next_lease_added or until_ < next_lease_added then next_lease_added = until_ end
    local n = #out
    out[n + 1] = run.id; out[n + 2] = fence; out[n + 3] = attempt
    out[n + 4] = tonumber(run.max_attempts) or 1; out[n + 5] = run.task
    out[n + 6] = run.payload; out[n + 7] = until_; out[n + 8] = whole_or(run.timeout_ms, 0, 0)
    out[n + 9] = run.job or ''; out[n + 10] = run.scheduled_for or ''
    out[n + 11] = whole_or(run.due, 0, 0); out[n + 12] = run.meta or ''
    emit(plan.log, 'claimed', run.id, attempt .. '|' .. owner)
  end
  save_fences(plan.fences)
  return out, taken_fences, new_leases, next_lease_added
end
