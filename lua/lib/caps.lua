-- lib/caps.lua: claim.lua under per-key and per-task caps and a per-key rate (lib/slots.lua
-- has the slots every script shares).
--
-- uses: core, priority, records, slots
--
-- Caps per key and per task: a run belongs to group 'task:<task>' when its task has a cap
-- (limits field task:<task>; the field task_caps counts them, so a queue without one reads
-- nothing more) and to 'key:<limit_key>' when it has a limit_key and the queue a
-- key_concurrency (at most 10,000). Claiming it adds it to the group's occupants,
-- jq:{q#p}:held:<group> (record field 'held': t, k or tk; both names historical); a re-taken
-- expired lease keeps its slot, a buried one frees it and
-- unparks the oldest parked run of the group (back at its original due time, its priority
-- hint too). A group counts SCARD of its occupant set; only when that reaches the cap are the
-- members checked, and one that is not running with a lease entry is pruned (a slot some
-- path failed to free). A due run of a full group is parked: due score now + lease_ms (a
-- fallback recheck), record field 'parked' = the group, jq:{q#p}:parked:<group> and the
-- parked zset run_id -> its original due time. Neither a parked run nor one moved later by
-- its key's rate uses up the call's limit.
-- A per-key rate (key_rate 'N W') keeps the claims of each key in jq:{q#p}:krate:<key>
-- (fence -> claim time, like the claims key); a run whose key's window is full moves its due
-- score to the window that can admit it: the i-th run of the key so moved in the call (i
-- from 1) to the instant the window has room plus floor((i - 1) / N) windows, plus i - 1 ms
-- (their order kept). These keys holding another type refuse the call whole.
--
-- Provides (`call`: claim.lua's context; `p`/`plan`: its plan; `lim`: claim_limits'):
--   cap_admitter(p, call, lim) -> admit(run, at, ring) or nil without caps or key rate
--     (phase 1): true when the run may be taken now; else false, why ('parked', 'later' with
--     when, or from the ring 'full': a full key group holds its whole group back)
--   freer_of(p, call) -> the call's slot_freer (lib/slots.lua), made when first needed
--   caps_settle(p, call) (phase 1, after the steps): slots pruned and not filled go to the
--     group's oldest parked runs; a taken parked run's keys are checked
--   set_aside(plan, call, recheck) (phase 2): parks, moves later, takes slots, logs key rates
--   unpark_freed(plan, call, entered) -> how many runs were unparked (phase 2)
--   caps_tidy(plan, call) (phase 2): pruned slots and a taken run's parked entries go

local function freer_of(p, call)
  -- Slots freed by burials (and pruned): the freer, made when first needed.
  p.freer = p.freer or slot_freer(call.prefix, call.due, call.parked)
  return p.freer
end

local function cap_admitter(p, call, lim)
  local now, prefix = call.now, call.prefix
  local kcap, krate_n, krate_w, task_capped = lim.kcap, lim.krate_n, lim.krate_w, lim.task_capped
  -- The groups of a run and their room (see the header). Cached per call. (Defined only
  -- under per-key or per-task limits: a queue without them pays for none of this.)
  local admit = nil
  if lim.flow then
    expect(call.parked, 'zset')
    p.flow, p.park, p.later, p.groups, p.windows, p.group_order = true, {}, {}, {}, {}, {}
    p.krate_w = krate_w
    local task_caps = {}
    local function task_cap(task)
      if task_caps[task] == nil then
        local v = read('HGET', call.limits, 'task:' .. task)
        task_caps[task] = count(v, 0) and tonumber(v) <= SLOT_CAP_MAX and tonumber(v) or false
      end
      return task_caps[task]
    end
    local function group(name, limit_)
      local g = p.groups[name]
      if not g then
        local key = prefix .. 'held:' .. name
        g = {name = name, key = key, cap = limit_, occupied = read('SCARD', key), taken = 0,
             prune = {}, add = {}}
        p.groups[name] = g
        p.group_order[#p.group_order + 1] = name
      end
      return g
    end
    local function has_room(g)
      if g.occupied + g.taken < g.cap then return true end
      if not g.checked then
        g.checked = true
        for _, member in ipairs(read('SMEMBERS', g.key)) do
          local r = load_run(prefix .. 'run:' .. member, 'state')
          if not (r and r.state == 'running' and read('ZSCORE', call.leases, member)) then
            g.prune[#g.prune + 1] = member
            g.occupied = g.occupied - 1
          end
        end
      end
      return g.occupied + g.taken < g.cap
    end
    local function window(key)
      local w = p.windows[key]
      if not w then
        local wkey = prefix .. 'krate:' .. key
        local since = '(' .. int(now - krate_w)
        local first = read('ZRANGE', wkey, since, '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
        w = {key = wkey, count = read('ZCOUNT', wkey, since, '+inf'),
             oldest = whole_or(first[2], 0, nil), fences = {}, delayed = 0}
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
          if ring and run.limit_key and g.name == 'key:' .. run.limit_key then
            return false, 'full'
          end
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
          -- The i-th run of the key delayed in this call waits for the window that can admit
          -- it: N go per window, so floor((i - 1) / N) windows after the first has room
          -- (rechecked every ms, a backlog would wake a worker for nothing again and again);
          -- i - 1 ms more keeps their order.
          w.delayed = w.delayed + 1
          local free_at = (w.oldest or now) + krate_w +
                          math.floor((w.delayed - 1) / math.max(krate_n, 1)) * krate_w +
                          w.delayed - 1
          if free_at <= now then free_at = now + w.delayed end
          p.later[#p.later + 1] = {id = run.id, due = free_at, level = priority_of(run.priority)}
          return false, 'later', free_at
        end
        run.window = w
        w.fences[#w.fences + 1] = false -- its fence, once issued
      end
      local took = '' -- the record's 'held' field: the initials of the groups it takes a slot of
      for _, g in ipairs(gs) do
        g.taken = g.taken + 1
        g.add[#g.add + 1] = run.id
        took = took .. string.sub(g.name, 1, 1)
      end
      if took ~= '' then run.slots_taken = took end
      return true
    end
  end
  return admit
end

local function caps_settle(p, call)
  local prefix = call.prefix
  -- Slots pruned from a group (taken by no running run) that this call did not fill go to
  -- the group's oldest parked runs.
  for _, name in ipairs(p.group_order or {}) do
    local g = p.groups[name]
    local spare = math.min(#g.prune, g.cap - g.occupied - g.taken)
    for _ = 1, spare do
      local fg = freer_of(p, call).groups[name]
      local before = fg and #fg.unpark or 0
      if #p.freer.pick(name).unpark == before then break end
    end
  end
  -- A taken run that was parked leaves its parked entries (phase 2).
  for _, run in ipairs(p.take) do
    if run.parked then
      expect(call.parked, 'zset')
      expect(prefix .. 'parked:' .. run.parked, 'zset')
    end
  end
end

local function set_aside(plan, call, recheck)
  local now, prefix = call.now, call.prefix
  for _, r in ipairs(plan.park) do
    redis.call('ZADD', call.due, recheck, r.id)
    if r.level > 0 and not r.ring then
      redis.call('ZADD', call.prio, prio_score(r.level, recheck), r.id)
    end
    redis.call('HSET', prefix .. 'run:' .. r.id, 'parked', r.group)
    redis.call('ZADD', prefix .. 'parked:' .. r.group, r.due, r.id)
    redis.call('ZADD', call.parked, r.due, r.id)
  end
  -- Delayed by its key's rate: due when the window has room.
  for _, r in ipairs(plan.later) do
    redis.call('ZADD', call.due, r.due, r.id)
    if r.level > 0 and not r.ring then
      redis.call('ZADD', call.prio, prio_score(r.level, r.due), r.id)
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
      if call.server_clock then redis.call('PEXPIRE', w.key, plan.krate_w) end
    end
  end
end

local function unpark_freed(plan, call, entered)
  local prefix = call.prefix
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
  return free_slots(plan.freer, prefix, call.due, call.parked)
end

local function caps_tidy(plan, call)
  local prefix = call.prefix
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
      redis.call('ZREM', call.parked, run.id)
    end
  end
end
