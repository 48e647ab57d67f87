-- claim.lua: lease up to N claimable runs of one partition to one worker.
--
-- uses: core, fences, priority, groups, records, events, workflows, bury, slots
--
-- KEYS[1]  due       zset    jq:{q#p}:due      run_id -> due time (ms)
-- KEYS[2]  leases    zset    jq:{q#p}:leases   run_id -> lease expiry (ms)
-- KEYS[3]  dead      zset    jq:{q#p}:dead     run_id -> time it died
-- KEYS[4]  stats     hash    jq:{q#p}:stats    counters
-- KEYS[5]  fences    string  jq:{q#p}:fences   the last fence issued in the partition
-- KEYS[6]  orphans   zset    jq:{q#p}:orphans  run_id -> when its index entry was found
--                                              without a record (see below)
-- KEYS[7]  paused    string  jq:{q#p}:paused   present while the queue is paused (pause.lua)
-- KEYS[8]  limits    hash    jq:{q#p}:limits   the partition's flow limits (set_limit.lua):
--                                              concurrency = the most runs running at once,
--                                              rate = 'N W': at most N claims in any W ms
-- KEYS[9]  claims    zset    jq:{q#p}:claims   fence -> claim time (ms), the claims of the
--                                              last W ms (kept only under a rate limit)
-- KEYS[10] prio      zset    jq:{q#p}:prio     run_id -> (9 - priority) * 2^43 + due time,
--                                              the runs above the default priority
-- KEYS[11] parked    zset    jq:{q#p}:parked   run_id -> original due time: the runs held
--                                              back by a per-key or per-task cap
-- KEYS[12] outbox    zset    jq:{q#p}:outbox   finished runs whose parents must hear
-- ARGV[1]  now                now ms, or '' for the server clock
-- ARGV[2]  prefix             key prefix jq:{q#p}:
-- ARGV[3]  limit              the most runs to claim
-- ARGV[4]  owner              worker id
-- ARGV[5]  lease_ms           default lease (used when the run has no lease of its own)
-- ARGV[6]  dead_retention_ms  how long dead records live (the dead index is trimmed to it)
-- Returns  {now, next_wake, count, then 12 fields per claimed run:
--           run_id, fence, attempt, max_attempts, task, payload, lease_until, timeout_ms,
--           job_id, scheduled_for, due, meta}
--          next_wake = earliest due time or lease expiry still pending in this partition
--          (ms), or -1 when there is none: the worker sleeps on the wake list until then.
--          A paused partition replies {now, -1, 0} and changes nothing: no run is claimed, no
--          expired lease taken back (that waits for the resume).
--          A concurrency limit C counts the live leases (expiry after now): the call takes at
--          most C minus those, expired leases taken back included. With no room it changes
--          nothing and replies {now, next_wake, 0}, next_wake being the earliest live lease
--          expiry (a slot is free by then at the latest; a commit frees one sooner).
--          A rate limit 'N W' counts the claims of the last W ms (claims, expired leases taken
--          back included): the call takes at most N minus those, and with no room replies
--          next_wake = when the oldest of them leaves the window, changing nothing.
--          A limit field that is not a whole number (rate: two) counts as no limit.
--          Per-key and per-task caps (limits fields key_concurrency, task:<name>, at most
--          10,000) and a per-key rate (key_rate 'N W'): a due run whose group is full is
--          parked (see below) and one whose key's window is full has its due score moved to
--          when the window has room; neither uses up the call's limit, and next_wake is now
--          when more due entries may follow.
--          Refused whole (an error reply, nothing changed) when a key is not on this node
--          (TRYLATER: a slot migration), or an index key (prio too), the paused or the
--          limits key (or, under a rate limit, the claims key) holds another type.
--
-- Runs whose lease expired are taken first (their worker died or stalled); each expiry counts
-- an attempt and a run past max_attempts goes to the dead set instead. Then the due runs by
-- priority, highest level first, then by due time (FIFO within a level): the levels above 0
-- are read from the prio zset, a hint next to the due set, which stays the index of every
-- pending run. A prio entry whose run is no longer in the due set, or whose record says
-- another level, is dropped; one whose due time moved later is moved with it. Strict
-- priority: while due runs of a higher level remain, a lower level waits. (Under per-key or
-- per-task limits, a level whose page of hints was held back is read on, up to 64 more.)
--
-- Every claim issues a new fence (next_fence: above any issued before in the partition, and
-- at least the server clock in us), so the previous holder's heartbeat and commit are refused
-- from now on.
--
-- An index entry whose record is missing is moved to the orphans index, never dropped: on a
-- Redis Cluster node importing a slot, a record may not have arrived yet. Each call looks at
-- a few orphans and puts back those whose record has appeared; `jobqueue repair` does the
-- same for all. Orphans older than the dead retention are forgotten.
--
-- A record that cannot be run (no task, garbage counters, a key of another type) is
-- dead-lettered with the reason, never handed to a worker. A held-back run so dead-lettered
-- from the due set leaves its parked entries and field.
--
-- A run enqueued under a deduplication key without a ttl (dedupe.lua) releases the key at its
-- first claim: the key (jq:{q#p}:dedupe:<key>) is deleted if it still names the run.
--
-- Caps per key and per task (the prelude's slot helpers): a run belongs to group
-- 'task:<task>' when its task has a cap (limits field task:<task>; the field task_caps counts
-- them, so a queue without one reads nothing more) and to 'key:<limit_key>' when it has a
-- limit_key and the queue a key_concurrency. Claiming it adds it to jq:{q#p}:held:<group>
-- (record field 'held': t, k or tk); a re-taken expired lease keeps its slot, a buried one
-- frees it and unparks the oldest parked run of the group (back at its original due time,
-- its priority hint too: KEYS[10], which the prelude reaches by the prefix). A group counts
-- SCARD of its held set; only when that reaches the cap are the members checked, and one
-- that is not running with a lease entry is pruned (a slot some path failed to free). A due
-- run of a full group is parked: due score now + lease_ms (ARGV[5], a fallback recheck),
-- record field 'parked' = the group, jq:{q#p}:parked:<group> and KEYS[11] run_id -> its
-- original due time.
-- A per-key rate keeps the claims of each key in jq:{q#p}:krate:<key> (fence -> claim time,
-- like KEYS[9]); a run whose key's window is full moves its due score to the window that can
-- admit it: the i-th run of the key so moved in the call (i from 1) to the instant the window
-- has room plus floor((i - 1) / N) windows, plus i - 1 ms (their order kept).
-- These keys hold another type: the call is refused whole.
--
-- Events (see event_log in _prelude.lua): 'claimed' ('<attempt>|<worker>') per run taken,
-- 'expired' ('<attempt>|<worker>' of the lapsed attempt) per lease taken back, 'dead' per run
-- dead-lettered with a record.
--
-- A claim writes no history entry: the record holds the current attempt (owner, fence,
-- attempt, started). The history keeps what the record cannot: how earlier attempts ended.

local now = clock(ARGV[1])
local prefix, limit, owner = ARGV[2], tonumber(ARGV[3]), ARGV[4]
local default_lease, dead_retention = tonumber(ARGV[5]), tonumber(ARGV[6])
local ORPHANS_PER_CALL = 10
local RING_LOOK = 64 -- groups looked at per call beyond the claim's limit
local RING_STALE_LOOK = 256 -- group-queue entries per call that are not a due run to take

local FIELDS = {'state', 'task', 'payload', 'attempt', 'max_attempts', 'fence', 'lease_ms',
                'timeout_ms', 'job', 'scheduled_for', 'due', 'owner', 'hist', 'lease_until',
                'meta', 'priority', 'dedupe', 'limit_key', 'held', 'parked', 'parents'}
local STATES = {pending = true, running = true, done = true, dead = true, cancelled = true,
                waiting = true}

local function record(run_id)
  local v, foreign = checked(redis.pcall('HMGET', prefix .. 'run:' .. run_id, unpack(FIELDS)),
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

-- A run enqueued under a deduplication key without a ttl holds the key only until its first
-- claim (dedupe.lua): the key goes then, if it still names the run and has no expiry.
local function dedupe_ends(p, run)
  if not run.dedupe or (tonumber(run.attempt) or 0) > 0 then return end
  local dkey = prefix .. 'dedupe:' .. run.dedupe
  local holder, foreign = checked(redis.pcall('GET', dkey), dkey, true)
  if not foreign and holder == run.id and read('PTTL', dkey) == -1 then
    p.undedupe[#p.undedupe + 1] = dkey
  end
end

-- -- phase 1: read everything, decide everything -------------------------------------------

local ok, plan = reading(function()
  if read('GET', KEYS[7]) ~= false then return {paused = true} end
  local limits = read('HMGET', KEYS[8], 'concurrency', 'rate', 'key_concurrency', 'key_rate',
                      'task_caps')
  local cap = limits[1]
  local rate_n, rate_w = string.match(limits[2] or '', '^(%d+) (%d+)$')
  local rated = count(rate_n, 0) and count(rate_w, 1)
  local kcap = count(limits[3], 0) and tonumber(limits[3]) <= SLOT_CAP_MAX and
               tonumber(limits[3]) or nil
  local krate_n, krate_w = string.match(limits[4] or '', '^(%d+) (%d+)$')
  if count(krate_n, 0) and count(krate_w, 1) then
    krate_n, krate_w = tonumber(krate_n), tonumber(krate_w)
  else
    krate_n, krate_w = nil, nil
  end
  local task_capped = count(limits[5], 1)
  local flow = kcap or krate_n or task_capped
  local fair = fair_partition(prefix)
  if count(cap, 0) then
    -- Live leases hold a slot each; expired ones free theirs (taken back below, they count
    -- as new claims against the room).
    local live = read('ZCOUNT', KEYS[2], '(' .. int(now), '+inf')
    local room = tonumber(cap) - live
    if room <= 0 then
      local first = read('ZRANGE', KEYS[2], '(' .. int(now), '+inf', 'BYSCORE', 'LIMIT', 0, 1,
                         'WITHSCORES')
      return {full = true, next_wake = whole_or(first[2], 0, -1)} -- no score 'inf' in a reply
    end
    if room < limit then limit = room end
  end
  if rated then
    local since = '(' .. int(now - tonumber(rate_w))
    local room = tonumber(rate_n) - read('ZCOUNT', KEYS[9], since, '+inf')
    if room <= 0 then
      local first = read('ZRANGE', KEYS[9], since, '+inf', 'BYSCORE', 'LIMIT', 0, 1,
                         'WITHSCORES')
      local oldest = whole_or(first[2], 0, nil)
      return {full = true, next_wake = oldest and oldest + tonumber(rate_w) or -1}
    end
    if room < limit then limit = room end
  end
  local p = {take = {}, bury = {}, foreign = {}, lost = {}, orphan = {}, stray = {},
             stray_due = {}, restore = {}, forget = {}, undedupe = {}, expired = 0,
             rate_w = rated and tonumber(rate_w) or nil}
  -- One entry past the limit of each index: after this call's removals, the first entry left
  -- tells the next wake-up without reading after a write. Under per-key or per-task limits a
  -- few more due entries: held-back runs do not use up the limit.
  local due_read = (flow or fair) and limit + 64 or limit
  local leases = read('ZRANGE', KEYS[2], 0, limit, 'WITHSCORES')
  local due = read('ZRANGE', KEYS[1], 0, due_read, 'WITHSCORES')
  -- Slots freed by burials (and pruned): the freer, made when first needed.
  local function freer()
    p.freer = p.freer or slot_freer(prefix, KEYS[1], KEYS[11])
    return p.freer
  end

  -- The groups of a run and their room (see the header). Cached per call. (Defined only
  -- under per-key or per-task limits: a queue without them pays for none of this.)
  local admit = nil
  if flow then
    expect(KEYS[11], 'zset')
    p.flow, p.park, p.later, p.groups, p.windows, p.group_order = true, {}, {}, {}, {}, {}
    p.krate_w = krate_w
    local task_caps = {}
    local function task_cap(task)
      if task_caps[task] == nil then
        local v = read('HGET', KEYS[8], 'task:' .. task)
        task_caps[task] = count(v, 0) and tonumber(v) <= SLOT_CAP_MAX and tonumber(v) or false
      end
      return task_caps[task]
    end
    local function group(name, limit_)
      local g = p.groups[name]
      if not g then
        local key = prefix .. 'held:' .. name
        g = {name = name, key = key, cap = limit_, held = read('SCARD', key), taken = 0,
             prune = {}, add = {}}
        p.groups[name] = g
        p.group_order[#p.group_order + 1] = name
      end
      return g
    end
    local function has_room(g)
      if g.held + g.taken < g.cap then return true end
      if not g.checked then
        g.checked = true
        for _, member in ipairs(read('SMEMBERS', g.key)) do
          local r = load_run(prefix .. 'run:' .. member, 'state')
          if not (r and r.state == 'running' and read('ZSCORE', KEYS[2], member)) then
            g.prune[#g.prune + 1] = member
            g.held = g.held - 1
          end
        end
      end
      return g.held + g.taken < g.cap
    end
    local function window(key)
      local w = p.windows[key]
      if not w then
        local wkey = prefix .. 'krate:' .. key
        local since = '(' .. int(now - krate_w)
        local first = read('ZRANGE', wkey, since, '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
        w = {key = wkey, count = read('ZCOUNT', wkey, since, '+inf'),
             oldest = whole_or(first[2], 0, nil), fences = {}, held = 0}
        p.windows[key] = w
      end
      return w
    end
    -- May this sound pending run be taken now? If not, it is parked or moved later (p.park,
    -- p.later) and stays in the due set. `at` is its due score.
    -- (From the ring, `ring` true: a full key group holds its whole group back, 'full',
    -- instead of parking the run; otherwise false, 'parked' or 'later'.)
    admit = function(run, at, ring)
      local gs = {}
      if task_capped then
        local c = task_cap(run.task)
        if c then gs[#gs + 1] = group('task:' .. run.task, c) end
      end
      if kcap and run.limit_key then gs[#gs + 1] = group('key:' .. run.limit_key, kcap) end
      for _, g in ipairs(gs) do
        if not has_room(g) then
          if ring and g.name == 'key:' .. run.limit_key then return false, 'full' end
          expect(prefix .. 'parked:' .. g.name, 'zset')
          if run.parked and run.parked ~= g.name then
            expect(prefix .. 'parked:' .. run.parked, 'zset')
          end
          p.park[#p.park + 1] = {id = run.id, group = g.name, due = whole_or(run.due, 0, at),
                                 level = priority_of(run.priority), was = run.parked}
          return false, 'parked'
        end
      end
      if krate_n and run.limit_key then
        local w = window(run.limit_key)
        if w.count + #w.fences >= krate_n then
          -- The i-th run of the key held in this call waits for the window that can admit
          -- it: N go per window, so floor((i - 1) / N) windows after the first has room
          -- (rechecked every ms, a backlog would wake a worker for nothing again and again);
          -- i - 1 ms more keeps their order.
          w.held = w.held + 1
          local free_at = (w.oldest or now) + krate_w +
                          math.floor((w.held - 1) / math.max(krate_n, 1)) * krate_w +
                          w.held - 1
          if free_at <= now then free_at = now + w.held end
          p.later[#p.later + 1] = {id = run.id, due = free_at, level = priority_of(run.priority)}
          return false, 'later', free_at
        end
        run.window = w
        w.fences[#w.fences + 1] = false -- its fence, once issued
      end
      local held = ''
      for _, g in ipairs(gs) do
        g.taken = g.taken + 1
        g.add[#g.add + 1] = run.id
        held = held .. string.sub(g.name, 1, 1)
      end
      if held ~= '' then run.held_now = held end
      return true
    end
  end
  expect(KEYS[3], 'zset')
  p.orphans = read('ZRANGE', KEYS[6], 0, ORPHANS_PER_CALL - 1, 'WITHSCORES')
  p.stats = counters(KEYS[4], 'claimed', 'lease_expired', 'dead')
  p.fences = fence_counter(KEYS[5])
  p.log = event_log(prefix)

  local taking = 0
  -- 1. Expired leases. (Every entry read handled and more may follow: wake again at once.)
  p.next_lease = #leases == 2 * (limit + 1) and now or nil
  for i = 1, #leases, 2 do
    local run_id, until_ = leases[i], tonumber(leases[i + 1])
    if until_ > now or taking >= limit then p.next_lease = until_; break end
    local run = record(run_id)
    if not run then
      p.foreign[#p.foreign + 1] = run_id
    elseif not run.state and read('EXISTS', prefix .. 'run:' .. run_id) == 0 then
      p.lost[#p.lost + 1] = run_id -- no record here: an orphan
    elseif run.state ~= 'running' then
      -- Not running (or a record without a state): the index entry just goes. A corrupt
      -- record is dead-lettered when claimed from the due set, not from here.
      p.stray[#p.stray + 1] = run_id
    else
      p.expired = p.expired + 1
      run.id, run.hist_ok = run_id, history_ok(prefix, run_id)
      run.expired = true
      local bad = corrupt(run)
      if bad then
        run.reason = bad
        p.bury[#p.bury + 1] = run
        if run.held then freer().free(run_id, held_groups(run)) end
      elseif (tonumber(run.attempt) or 0) >= tonumber(run.max_attempts) then
        run.reason = 'lease expired on attempt ' .. (run.attempt or '?') .. ' of ' ..
                     run.max_attempts .. ' (worker died or stalled)'
        p.bury[#p.bury + 1] = run
        -- Its slots go, a parked run takes one.
        if run.held then freer().free(run_id, held_groups(run)) end
      else
        taking = taking + 1
        p.take[#p.take + 1] = run
      end
    end
  end
  -- 2. Due runs above the default priority, highest level first (the prio hint). A hinted
  -- run that is not a sound pending record is left to step 3, which knows what to do with it.
  p.handled, p.unhint, p.rehint = {}, {}, {}
  local hinted = {}
  local hints_held = read('ZCARD', KEYS[10]) -- read whatever happens: step 3 may write it
  -- 1b. The ring (a partition with groups, see the header): one run at a time from the group
  -- of lowest pass, priority first within the group.
  if fair then
    local ring = {vt = whole_or(read('GET', prefix .. 'gvt'), 0, 0), list = {}, by = {},
                  gq_add = {}, gq_rem = {}, gof_drop = {}, stale = 0}
    p.ring = ring
    expect(prefix .. 'gready', 'zset')
    expect(prefix .. 'gpass', 'hash')
    expect(prefix .. 'gserved', 'hash')
    group_of(prefix, '', true) -- (gof, gwait)
    local function candidate(name, pass)
      local g = ring.by[name]
      if g then return g end
      local conf = read('HMGET', prefix .. 'gconf', 'w:' .. name, 'p:' .. name)
      g = {name = name, key = prefix .. 'gq:' .. name, pass = pass, served = 0,
           weight = count(conf[1], 1) and math.min(tonumber(conf[1]), GROUP_WEIGHT_MAX) or 1,
           paused = conf[2] ~= false and conf[2] ~= nil}
      expect(g.key, 'zset')
      ring.by[name] = g
      ring.list[#ring.list + 1] = g
      return g
    end
    -- Groups whose time to look again has come join at their saved pass, but never below the
    -- ring's virtual time (the pass of the latest claim): no credit for time spent idle.
    local due_groups = read('ZRANGE', prefix .. 'gwait', '-inf', int(now), 'BYSCORE', 'LIMIT',
                            0, RING_LOOK)
    ring.more = #due_groups == RING_LOOK
    for _, name in ipairs(due_groups) do
      local saved = whole_or(read('HGET', prefix .. 'gpass', name), 0, 0)
      candidate(name, math.max(saved, ring.vt)).waited = true
    end
    local ready = read('ZRANGE', prefix .. 'gready', 0, limit + RING_LOOK - 1, 'WITHSCORES')
    -- (more ready groups behind: those looked at now may all be held back, and leave)
    if #ready == 2 * (limit + RING_LOOK) then ring.more = true end
    for i = 1, #ready, 2 do
      -- (a pass is a whole number: a foreign one, -inf say, joins at the virtual time)
      local pass = whole_or(ready[i + 1], 0, ring.vt)
      local g = candidate(ready[i], pass)
      g.pass, g.ready = pass, true
    end
    local first = read('ZRANGE', prefix .. 'gwait', '(' .. int(now), '+inf', 'BYSCORE', 'LIMIT',
                       0, 1, 'WITHSCORES')
    ring.next_wait = whole_or(first[2], 0, nil)
    local function drop(g, id, gone)
      ring.gq_rem[#ring.gq_rem + 1] = {g.key, id}
      if gone then ring.gof_drop[#ring.gof_drop + 1] = id end
    end
    local function later(g, at)
      if not g.next_at or at < g.next_at then g.next_at = at end
    end
    -- The group's next due, sound, pending run (and its due score), walking its queue level
    -- by level; stale entries are dropped or moved. nil when none is due: g.next_at says when
    -- one will be, g.empty that none is left.
    local function next_run(g)
      if g.level == nil then
        local head = read('ZRANGE', g.key, 0, 0, 'WITHSCORES')
        if #head == 0 then g.empty = true; return nil end
        local top = PRIORITY_MAX - math.floor(tonumber(head[2]) / PRIORITY_SPAN)
        g.level, g.off = math.max(math.min(top, PRIORITY_MAX), 0), 0
      end
      while g.level >= 0 do
        if ring.stale >= RING_STALE_LOOK then -- (bounded: the next claim goes on from here)
          later(g, now)
          return nil
        end
        local base = (PRIORITY_MAX - g.level) * PRIORITY_SPAN
        -- (level 0 has no upper end: a run due past 2^43 ms, the year 2248, scores above it)
        local upper = g.level == 0 and '+inf' or '(' .. int(base + PRIORITY_SPAN)
        local e = read('ZRANGE', g.key, int(base), upper, 'BYSCORE', 'LIMIT', g.off, 1,
                       'WITHSCORES')
        local hint_at = e[2] and tonumber(e[2]) - base
        if not hint_at or math.floor(hint_at) > now then
          if hint_at then later(g, hint_at) end
          g.level, g.off = g.level - 1, 0
        else
          g.off = g.off + 1
          ring.stale = ring.stale + 1 -- (undone below for the run it returns)
          local id = e[1]
          local at = tonumber(read('ZSCORE', KEYS[1], id))
          local run = at and record(id)
          if not run or run.state ~= 'pending' or (run.limit_key or '') ~= g.name then
            -- (a pending run of another group, its id reused: its gof entry goes too unless
            -- it names that group, so that step 3 adopts it there)
            drop(g, id, not (run and run.state == 'pending') or
                        read('HGET', prefix .. 'gof', id) ~= (run.limit_key or ''))
          elseif math.floor(at) > now then -- its due time moved later
            ring.gq_add[#ring.gq_add + 1] = {g.key, prio_score(priority_of(run.priority), at), id}
            later(g, at)
          elseif priority_of(run.priority) ~= g.level then
            ring.gq_add[#ring.gq_add + 1] = {g.key, prio_score(priority_of(run.priority), at), id}
            later(g, now)
          elseif corrupt(run) then
            drop(g, id, true) -- step 3 dead-letters it
          else
            ring.stale = ring.stale - 1
            run.id = id
            return run, at
          end
        end
      end
      if not g.next_at then g.empty = true end
      return nil
    end
    while taking < limit do
      local g = nil
      for _, c in ipairs(ring.list) do
        if not c.out and not c.paused and
           (not g or c.pass < g.pass or (c.pass == g.pass and c.name < g.name)) then g = c end
      end
      if not g then break end
      local run, at = next_run(g)
      if not run then
        g.out = true
      else
        local ok, why, when = true, nil, nil
        if admit then ok, why, when = admit(run, at, true) end
        if ok then
          taking = taking + 1
          p.take[#p.take + 1] = run
          p.handled[#p.handled + 1] = run.id
          hinted[run.id] = true
          drop(g, run.id, true)
          if run.priority then p.unhint[#p.unhint + 1] = run.id end
          dedupe_ends(p, run)
          if g.pass > ring.vt then ring.vt = g.pass end
          g.pass = g.pass + math.floor(GROUP_STEP / g.weight)
          g.served = g.served + 1
        elseif why == 'full' then -- its key's slots are all held: until one frees (free_slots)
          g.out = true
          later(g, now + default_lease)
        elseif why == 'parked' then -- held back by its task's cap: unparked into its group
          hinted[run.id] = true
          p.park[#p.park].ring = true
          drop(g, run.id, true)
        else -- 'later': its key's rate moves it, and its group, to when the window has room
          hinted[run.id] = true
          p.later[#p.later].ring = true
          ring.gq_add[#ring.gq_add + 1] = {g.key, prio_score(priority_of(run.priority), when),
                                           run.id}
          g.out = true
          later(g, when)
        end
      end
    end
    -- The served counts (a field holding garbage is reset, as bump() does).
    local served_names = {}
    for _, g in ipairs(ring.list) do
      if g.served > 0 then served_names[#served_names + 1] = g.name end
    end
    if #served_names > 0 then
      ring.served = counters(prefix .. 'gserved', unpack(served_names))
    end
  end
  -- One hint: true when its run is taken or held back by a cap or key rate.
  local function hint(level, run_id)
    local at = tonumber(read('ZSCORE', KEYS[1], run_id))
    local run = at and record(run_id)
    if not run or priority_of(run.priority) ~= level then
      -- Not pending here any more, or a new record of the id at another level.
      p.unhint[#p.unhint + 1] = run_id
    elseif math.floor(at) > now then -- (a score's fraction orders its ms: _prelude.lua)
      p.rehint[#p.rehint + 1] = prio_score(level, at) -- its due time moved later
      p.rehint[#p.rehint + 1] = run_id
    elseif run.state == 'pending' and not corrupt(run) then
      run.id = run_id
      hinted[run_id] = true
      if not admit or admit(run, at) then
        taking = taking + 1
        p.take[#p.take + 1] = run
        p.handled[#p.handled + 1] = run_id
        dedupe_ends(p, run)
        p.unhint[#p.unhint + 1] = run_id
        return false
      end
      return true -- held back: its hint moves with its due score (phase 2)
    else
      p.unhint[#p.unhint + 1] = run_id
    end
    return false
  end
  -- Held-back runs do not use up the room, so a page of them may hide runs of their level
  -- behind: then the level's next page is read, up to 64 more entries in all (as step 3 reads
  -- 64 more due entries).
  local extra_hints = flow and 64 or 0
  if taking < limit and hints_held > 0 and not fair then
    for level = PRIORITY_MAX, 1, -1 do
      if taking >= limit then break end
      local base = (PRIORITY_MAX - level) * PRIORITY_SPAN
      -- A few more than the room: stale entries (cancelled runs) do not use it up.
      local offset, page = 0, 2 * (limit - taking) + 8
      while page > 0 and taking < limit do
        local hints = read('ZRANGE', KEYS[10], int(base), '(' .. int(base + now + 1), 'BYSCORE',
                           'LIMIT', offset, page)
        local held_back = false
        for _, run_id in ipairs(hints) do
          if taking >= limit then break end
          if hint(level, run_id) then held_back = true end
        end
        offset = offset + #hints
        local full = #hints == page
        page = 0
        if held_back and full and taking < limit then
          page = math.min(2 * (limit - taking) + 8, extra_hints)
          extra_hints = extra_hints - page
        end
      end
    end
  end
  -- 3. Due runs: every entry handled here leaves the due set. (With groups, the ring's runs
  -- are skipped, and a sound pending run is adopted into its group instead of taken.)
  -- (In a fair partition, a page of due entries all served by the ring (in a group's queue)
  -- says nothing more: the ring tells its own next look. Only an entry step 3 handled or
  -- adopted means more may follow behind the page.)
  local page_full = #due == 2 * (due_read + 1)
  p.next_due = page_full and not fair and now or nil
  local met = false
  local served = {}
  if fair and #due > 0 then
    local ids = {}
    for i = 1, #due, 2 do ids[#ids + 1] = due[i] end
    local groups = read('HMGET', prefix .. 'gof', unpack(ids))
    for i, id in ipairs(ids) do if groups[i] then served[id] = true end end
    p.adopt = {}
  end
  for i = 1, #due, 2 do
    local run_id, at = due[i], tonumber(due[i + 1])
    if not hinted[run_id] and not served[run_id] then -- (done with in steps 1b and 2)
      if math.floor(at) > now or (taking >= limit and not fair) then p.next_due = at; break end
      met = true
      local run = record(run_id)
      if not run then
        p.handled[#p.handled + 1] = run_id
        p.foreign[#p.foreign + 1] = run_id
      elseif run.state == 'pending' then
        run.id = run_id
        local bad = corrupt(run)
        if bad then
          p.handled[#p.handled + 1] = run_id
          run.reason, run.hist_ok = bad, history_ok(prefix, run_id)
          p.bury[#p.bury + 1] = run
          if run.parked then -- held back no more: its parked entries go (phase 2)
            expect(KEYS[11], 'zset')
            expect(prefix .. 'parked:' .. run.parked, 'zset')
            run.unpark = true
          end
        elseif fair then
          local level = priority_of(run.priority)
          p.adopt[#p.adopt + 1] = {group = group_of(prefix, run.limit_key, true), id = run_id,
                                   score = prio_score(level, at), due = at}
        elseif not admit or admit(run, at) then
          p.handled[#p.handled + 1] = run_id
          taking = taking + 1
          p.take[#p.take + 1] = run
          if run.priority then p.unhint[#p.unhint + 1] = run_id end
          dedupe_ends(p, run)
        end
      else
        p.handled[#p.handled + 1] = run_id
      end
      if not run or run.state == 'pending' then -- (handled above)
      elseif run.state == nil then
        -- No state: no record here (an orphan), or a record without a state (corrupt).
        if read('EXISTS', prefix .. 'run:' .. run_id) == 1 then
          run.id, run.reason = run_id, 'corrupt record: no state'
          run.hist_ok = history_ok(prefix, run_id)
          p.bury[#p.bury + 1] = run
        else
          p.orphan[#p.orphan + 1] = run_id
        end
      elseif not STATES[run.state] then
        run.id, run.hist_ok = run_id, history_ok(prefix, run_id)
        run.reason = 'corrupt record: unknown state ' .. utf8_head(run.state, 40)
        p.bury[#p.bury + 1] = run
      else
        -- A record in another state has no business in the due set: its entry goes, and its
        -- history says so (expiring with the record).
        if history_ok(prefix, run_id) then
          p.stray_due[#p.stray_due + 1] = {id = run_id, state = run.state,
                                           ttl = read('PTTL', prefix .. 'run:' .. run_id)}
        end
      end
    end
  end
  if fair and page_full and met and not p.next_due then p.next_due = now end
  -- Slots pruned from a group (held by no running run) that this call did not fill go to
  -- the group's oldest parked runs.
  for _, name in ipairs(p.group_order or {}) do
    local g = p.groups[name]
    local spare = math.min(#g.prune, g.cap - g.held - g.taken)
    for _ = 1, spare do
      local fg = freer().groups[name]
      local before = fg and #fg.unpark or 0
      if #p.freer.pick(name).unpark == before then break end
    end
  end
  -- A taken run that was parked leaves its parked entries (phase 2).
  for _, run in ipairs(p.take) do
    if run.parked then
      expect(KEYS[11], 'zset')
      expect(prefix .. 'parked:' .. run.parked, 'zset')
    end
  end
  -- 4. Orphans whose record has appeared go back to their index; old ones are forgotten.
  for i = 1, #p.orphans, 2 do
    local run_id, since = p.orphans[i], tonumber(p.orphans[i + 1])
    local run = record(run_id)
    if run and run.state == 'pending' then
      p.restore[#p.restore + 1] = {KEYS[1], whole_or(run.due, 0, now), run_id}
    elseif run and run.state == 'running' then
      p.restore[#p.restore + 1] = {KEYS[2], whole_or(run.lease_until, 0, now), run_id}
    elseif run and run.state then
      p.forget[#p.forget + 1] = run_id -- finished meanwhile: nothing to index here
    elseif dead_retention and dead_retention > 0 and since < now - dead_retention then
      p.forget[#p.forget + 1] = run_id
    end
  end
  -- A buried run others wait on goes to the outbox (finish_record in _prelude.lua).
  for _, run in ipairs(p.bury) do
    run.outbox = outbox_entry(KEYS[12], run, run.id, now)
  end
  return p
end)
if not ok then return plan end
if plan.paused then return {now, -1, 0} end
if plan.full then return {now, plan.next_wake, 0} end

-- -- phase 2: write ---------------------------------------------------------------------------

local out = {}
local new_leases = {} -- score, member pairs: one ZADD for the call
local died = 0
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
  if run.held_now then redis.call('HSET', key, 'held', run.held_now) end
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
if plan.rate_w and #plan.take > 0 then
  -- The rate limit's log: one entry per claim, by its fence (unique in the partition).
  local entries = {}
  for _, fence in ipairs(taken_fences) do
    entries[#entries + 1] = now
    entries[#entries + 1] = int(fence)
  end
  bulk('ZADD', KEYS[9], entries, 2000)
  trim_index(KEYS[9], now, plan.rate_w)
  -- The key's expiry runs on the server's clock: set only when the window does too (a caller's
  -- clock, ARGV[1], would let the log vanish before its window ends); the trim bounds it.
  if ARGV[1] == '' then redis.call('PEXPIRE', KEYS[9], plan.rate_w) end
end
-- Leases are added before any is removed: the leases key is never emptied and then written
-- in one call (on a node migrating the slot, a write to a missing key is refused).
if #new_leases > 0 then bulk('ZADD', KEYS[2], new_leases, 2000) end
if #plan.rehint > 0 then bulk('ZADD', KEYS[10], plan.rehint, 2000) end
-- Held back by a full group: parked, its due score a fallback recheck later.
local recheck = now + default_lease
local unparked = 0
if plan.flow then
  for _, r in ipairs(plan.park) do
    redis.call('ZADD', KEYS[1], recheck, r.id)
    if r.level > 0 and not r.ring then
      redis.call('ZADD', KEYS[10], prio_score(r.level, recheck), r.id)
    end
    redis.call('HSET', prefix .. 'run:' .. r.id, 'parked', r.group)
    redis.call('ZADD', prefix .. 'parked:' .. r.group, r.due, r.id)
    redis.call('ZADD', KEYS[11], r.due, r.id)
  end
  -- Held back by its key's rate: due when the window has room.
  for _, r in ipairs(plan.later) do
    redis.call('ZADD', KEYS[1], r.due, r.id)
    if r.level > 0 and not r.ring then
      redis.call('ZADD', KEYS[10], prio_score(r.level, r.due), r.id)
    end
  end
  for _, name in ipairs(plan.group_order) do
    local g = plan.groups[name]
    if #g.add > 0 then bulk('SADD', g.key, g.add, 1000) end
  end
  for _, w in pairs(plan.windows) do
    if #w.fences > 0 then
      local entries = {}
      for _, fence in ipairs(w.fences) do
        entries[#entries + 1] = now
        entries[#entries + 1] = fence
      end
      bulk('ZADD', w.key, entries, 2000)
      trim_index(w.key, now, plan.krate_w)
      if ARGV[1] == '' then redis.call('PEXPIRE', w.key, plan.krate_w) end
    end
  end
end
-- The ring: group queues, then the groups' places, then the runs adopted into their group and
-- those unparked (free_slots): ZADD LT brings a group's next look earlier than its place says.
-- Removals come after all of these (a key emptied here is not written again), and spare what
-- they put in: a group found empty that got a run in this call stays in gwait.
local ring = plan.ring
local entered = {} -- run_id -> the group it entered in this call
if ring then
  for _, e in ipairs(ring.gq_add) do redis.call('ZADD', e[1], e[2], e[3]) end
  local gready, gwait, gpass = prefix .. 'gready', prefix .. 'gwait', prefix .. 'gpass'
  for _, g in ipairs(ring.list) do
    if g.served > 0 then bump(ring.served, g.name, g.served) end
    if g.paused then
      redis.call('ZADD', gwait, '+inf', g.name) -- until resumed (group_set.lua)
      redis.call('HSET', gpass, g.name, int(g.pass))
    elseif g.empty then
    elseif g.out then -- nothing due now: looked at again when its next run is
      redis.call('ZADD', gwait, int(math.floor(g.next_at)), g.name)
      redis.call('HSET', gpass, g.name, int(g.pass))
    elseif g.waited or g.served > 0 then
      redis.call('ZADD', gready, int(g.pass), g.name)
    end
  end
  for _, a in ipairs(plan.adopt or {}) do
    group_enter(prefix, a.group, a.id, a.score, a.due)
    entered[a.id] = a.group
  end
end
if plan.freer then
  -- A parked run taken in this call used the slot it would have been unparked into.
  local taken_now = {}
  for _, run in ipairs(plan.take) do taken_now[run.id] = true end
  for _, name in ipairs(plan.freer.order) do
    local g, keep = plan.freer.groups[name], {}
    for _, u in ipairs(g.unpark) do
      if not taken_now[u.id] then
        keep[#keep + 1] = u
        if u.group then entered[u.id] = u.group end
      end
    end
    g.unpark = keep
  end
  unparked = free_slots(plan.freer, prefix, KEYS[1], KEYS[11])
end
if ring then
  local gready, gwait, gpass = prefix .. 'gready', prefix .. 'gwait', prefix .. 'gpass'
  local into, gof_drop = {}, {}
  for _, group in pairs(entered) do into[group] = true end
  for _, e in ipairs(ring.gq_rem) do
    if not (entered[e[2]] and prefix .. 'gq:' .. entered[e[2]] == e[1]) then
      redis.call('ZREM', e[1], e[2])
    end
  end
  for _, id in ipairs(ring.gof_drop) do
    if not entered[id] then gof_drop[#gof_drop + 1] = id end
  end
  if #gof_drop > 0 then bulk('HDEL', prefix .. 'gof', gof_drop, 1000) end
  for _, g in ipairs(ring.list) do
    if g.empty and not g.paused then
      redis.call('ZREM', gready, g.name)
      if not into[g.name] then
        redis.call('ZREM', gwait, g.name)
        redis.call('HDEL', gpass, g.name)
      end
    elseif (g.paused or g.out) and g.ready then
      redis.call('ZREM', gready, g.name)
    elseif not g.paused and not g.out and g.waited then
      redis.call('ZREM', gwait, g.name)
    end
  end
  redis.call('SET', prefix .. 'gvt', int(ring.vt))
end
if plan.flow then
  for _, name in ipairs(plan.group_order) do
    local g = plan.groups[name]
    local added, stale = {}, {}
    for _, id in ipairs(g.add) do added[id] = true end
    for _, id in ipairs(g.prune) do if not added[id] then stale[#stale + 1] = id end end
    if #stale > 0 then bulk('SREM', g.key, stale, 1000) end
  end
  for _, r in ipairs(plan.park) do
    if r.was and r.was ~= r.group then redis.call('ZREM', prefix .. 'parked:' .. r.was, r.id) end
  end
end
for _, run in ipairs(plan.take) do
  if run.parked then
    redis.call('HDEL', prefix .. 'run:' .. run.id, 'parked')
    redis.call('ZREM', prefix .. 'parked:' .. run.parked, run.id)
    redis.call('ZREM', KEYS[11], run.id)
  end
end

for _, run in ipairs(plan.bury) do
  if run.expired and run.hist_ok then
    history(prefix, run.id, now .. ' lease expired fence=' .. (run.fence or '?') ..
            ' attempt=' .. (run.attempt or '?') .. ' owner=' .. (run.owner or '?'))
  end
  if run.expired then
    emit(plan.log, 'expired', run.id, (run.attempt or '0') .. '|' .. (run.owner or ''))
  end
  bury(KEYS[3], prefix, run.id, now, run.reason, ' ' .. run.reason, dead_retention, run.hist_ok,
       run.outbox, plan.log, run.attempt)
  if run.held then redis.call('HDEL', prefix .. 'run:' .. run.id, 'held') end
  if run.unpark then
    redis.call('HDEL', prefix .. 'run:' .. run.id, 'parked')
    redis.call('ZREM', prefix .. 'parked:' .. run.parked, run.id)
    redis.call('ZREM', KEYS[11], run.id)
  end
  died = died + 1
end
-- A run id whose key is not a hash: listed as dead so an operator sees it; the key itself is
-- someone else's data and is left alone.
local dead_entries = {}
for _, run_id in ipairs(plan.foreign) do
  dead_entries[#dead_entries + 1] = now
  dead_entries[#dead_entries + 1] = run_id
  died = died + 1
end
if #dead_entries > 0 then bulk('ZADD', KEYS[3], dead_entries, 2000) end

for _, r in ipairs(plan.stray_due) do
  history(prefix, r.id, now .. ' stray due entry dropped (state ' .. r.state .. ')')
  if r.ttl > 0 then redis.call('PEXPIRE', prefix .. 'hist:' .. r.id, r.ttl) end
end

-- Index entries without a record here: orphans, put back once their record appears.
local orphans = {}
for _, run_id in ipairs(plan.lost) do
  orphans[#orphans + 1] = now; orphans[#orphans + 1] = run_id
end
for _, run_id in ipairs(plan.orphan) do
  orphans[#orphans + 1] = now; orphans[#orphans + 1] = run_id
end
for _, r in ipairs(plan.restore) do redis.call('ZADD', r[1], r[2], r[3]) end
if #orphans > 0 then bulk('ZADD', KEYS[6], orphans, 2000) end

-- Removals last (a key emptied here is not written again). Leases that expired and were
-- taken again were re-added above with their new expiry.
if #plan.handled > 0 then bulk('ZREM', KEYS[1], plan.handled, 1000) end
if #plan.unhint > 0 then bulk('ZREM', KEYS[10], plan.unhint, 1000) end
for _, dkey in ipairs(plan.undedupe) do redis.call('DEL', dkey) end
-- A run taken in this call keeps the lease just granted, even when its old entry was a stray
-- one (a pending run with a lease entry left behind): removing it would leave the run running
-- with no lease, never taken back and uncounted by a concurrency limit.
local taken = {}
for _, run in ipairs(plan.take) do taken[run.id] = true end
local gone = {}
local function drop(run_id) if not taken[run_id] then gone[#gone + 1] = run_id end end
for _, run in ipairs(plan.bury) do if run.expired then drop(run.id) end end
for _, run_id in ipairs(plan.foreign) do drop(run_id) end
for _, run_id in ipairs(plan.lost) do drop(run_id) end
for _, run_id in ipairs(plan.stray) do drop(run_id) end
if #gone > 0 then bulk('ZREM', KEYS[2], gone, 1000) end
local settled = {}
for _, r in ipairs(plan.restore) do settled[#settled + 1] = r[3] end
for _, run_id in ipairs(plan.forget) do settled[#settled + 1] = run_id end
if #settled > 0 then bulk('ZREM', KEYS[6], settled, 1000) end
trim_index(KEYS[3], now, dead_retention)

bump(plan.stats, 'claimed', #plan.take)
bump(plan.stats, 'lease_expired', plan.expired)
bump(plan.stats, 'dead', died)
trim_events(plan.log)

-- The next wake-up, from what phase 1 read: the first index entries not handled, the leases
-- just granted, the orphans put back.
local next_wake = -1
local function earlier(t) if t and (next_wake < 0 or t < next_wake) then next_wake = t end end
earlier(plan.next_due)
earlier(plan.next_lease)
earlier(next_lease_added)
for _, r in ipairs(plan.later or {}) do earlier(r.due) end
if plan.park and #plan.park > 0 then earlier(recheck) end
if unparked > 0 then earlier(now) end
if ring then
  earlier(ring.next_wait)
  if ring.more or (plan.adopt and #plan.adopt > 0) then earlier(now) end
  for _, g in ipairs(ring.list) do
    if g.out and not g.empty and not g.paused then earlier(g.next_at)
    elseif not g.out and not g.paused then earlier(now) end -- (due work left: the limit)
  end
end
for _, r in ipairs(plan.restore) do earlier(r[2]) end

local result = {now, next_wake, #plan.take}
for i = 1, #out do result[#result + 1] = out[i] end
return result
