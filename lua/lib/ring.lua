-- lib/ring.lua: claim.lua's step 1b, the fair-shares ring (lib/groups.lua: a run's group
-- queue). In a partition with fair shares on, runs are taken one at a time from the group of
-- lowest pass (a claim adds GROUP_STEP / weight to it), priority first within the group.
-- Groups whose time to look again has come (gwait) join at their saved pass (gpass), never
-- below the ring's virtual time (gvt); gready holds the groups whose first run was due when
-- last looked at; gserved counts the runs served per group. A paused group waits until
-- resumed (group_set.lua). A full key group is set aside whole until a slot frees.
--
-- uses: core, priority, groups, claimable
--
-- Provides (`call`: claim.lua's context; `p`/`plan`: its plan):
--   ring_take(p, call, taking) -> taking (phase 1; p.ring: what phase 2 writes)
--   ring_write(plan, call, entered) (phase 2): group queues, then the groups' places, then the
--     runs adopted into their group (entered: run_id -> the group it entered in this call)
--   ring_tidy(plan, call, entered) (phase 2, after the unparking): the removals, sparing what
--     this call put in, and the virtual time
--   ring_wake(plan, earlier, now) (phase 2): the ring's part of the next wake-up

local RING_LOOK = 64 -- groups looked at per call beyond the claim's limit
local RING_STALE_LOOK = 256 -- group-queue entries per call that are not a due run to take

local function ring_take(p, call, taking)
  local now, prefix, limit = call.now, call.prefix, call.limit
  local default_lease = call.default_lease
  local admit, hinted = p.admit, p.hinted
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
  -- (more ready groups behind: those looked at now may all be set aside, and leave)
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
        local at = tonumber(read('ZSCORE', call.due, id))
        local run = at and claim_record(prefix, id)
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
        dedupe_ends(p, prefix, run)
        if g.pass > ring.vt then ring.vt = g.pass end
        g.pass = g.pass + math.floor(GROUP_STEP / g.weight)
        g.served = g.served + 1
      elseif why == 'full' then -- its key's slots are all taken: until one frees (free_slots)
        g.out = true
        later(g, now + default_lease)
      elseif why == 'parked' then -- parked by its task's cap: unparked into its group
        -- (it counts against the entries a call may look at: else one claim would park a
        -- whole group queue parked by a full task cap, however long)
        ring.stale = ring.stale + 1
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
  return taking
end

local function ring_write(plan, call, entered)
  local prefix = call.prefix
  local ring = plan.ring
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

local function ring_tidy(plan, call, entered)
  local prefix = call.prefix
  local ring = plan.ring
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

local function ring_wake(plan, earlier, now)
  local ring = plan.ring
  earlier(ring.next_wait)
  if ring.more or (plan.adopt and #plan.adopt > 0) then earlier(now) end
  for _, g in ipairs(ring.list) do
    if g.out and not g.empty and not g.paused then earlier(g.next_at)
    elseif not g.out and not g.paused then earlier(now) end -- (due work left: the limit)
  end
end
