-- lib/slots.lua: per-key and per-task concurrency caps: slots and their occupants, parking,
-- unparking.
--
-- uses: core, priority, groups
--
-- Provides:
--   SLOT_CAP_MAX, UNPARK_LOOK
--   slot_groups(run) -> the groups a run takes a slot of
--   unpark(prefix, due_key, u) (phase 2)
--   slot_freer(prefix, due_key, parked_key) -> f, f.free(run_id, groups), f.pick(group)
--   free_slots(f, prefix, due_key, parked_key) -> how many runs were unparked (phase 2)

-- -- per-key and per-task concurrency caps (claim.lua, set_limit.lua) -------------------------
-- A running run that took a slot of a capped group is one of its occupants, in
-- jq:{q#p}:held:<group> (a set of run ids), and its record's 'held' field says which (both
-- names are historical: old and new scripts share them): 't' = group 'task:<task>', 'k' = group
-- 'key:<limit_key>'. A due run of a full group is parked: its due score moves later (a
-- fallback recheck), its record's 'parked' field names the group, and it waits in
-- jq:{q#p}:parked:<group> (run_id -> its original due time, FIFO) and in the partition-wide
-- parked zset (KEYS; counting and visibility). An occupant leaving its group (complete, fail,
-- cancel, release, claim's burial) frees its slot and unparks the oldest parked run of the
-- group: its due score goes back to its original due time.
local SLOT_CAP_MAX = 10000 -- a cap above it counts as none (validating a full set is bounded)
local UNPARK_LOOK = 32     -- parked entries looked at per group and call (stale ones dropped)

-- The groups a run takes a slot of, from its record's task, limit_key and held fields.
local function slot_groups(run)
  local groups = {}
  local took = run and run.held
  if type(took) ~= 'string' then return groups end
  if string.find(took, 't', 1, true) and run.task then groups[#groups + 1] = 'task:' .. run.task end
  if string.find(took, 'k', 1, true) and run.limit_key then
    groups[#groups + 1] = 'key:' .. run.limit_key
  end
  return groups
end

-- Phase 2: put a parked run u = {id, due, level} back in line at its original due time, its
-- priority hint too (claim moved it to the recheck time; left there, the run would wait
-- behind the default level until then). The prio key (jq:{q#p}:prio, the prefix's hash tag)
-- is built from the prefix; its type is checked in phase 1 when level > 0.
local function unpark(prefix, due_key, u)
  redis.call('ZADD', due_key, u.due, u.id)
  if u.group then -- (a partition with groups: back in its group's queue)
    group_enter(prefix, u.group, u.id, prio_score(u.level, u.due), u.due)
  elseif u.level > 0 then
    redis.call('ZADD', prefix .. 'prio', prio_score(u.level, u.due), u.id)
  end
  redis.call('HDEL', prefix .. 'run:' .. u.id, 'parked')
end

-- Phase 1: a planner of slots freed in one call (parked_key: the partition-wide parked
-- zset). free(run_id, groups) checks each group's
-- occupant set and picks the oldest parked run of the group still waiting (pending, parked there,
-- in the due index); stale entries are noted for removal. Each group's entries are read once
-- per call, so that two occupants freed in one call unpark two runs.
local function slot_freer(prefix, due_key, parked_key)
  local f = {frees = {}, groups = {}, order = {}}
  local function pick(group)
    local g = f.groups[group]
    if not g then
      if #f.order == 0 then
        expect(parked_key, 'zset')
        f.fair = fair_partition(prefix)
      end
      local pkey = prefix .. 'parked:' .. group
      g = {occupants = prefix .. 'held:' .. group, parked = pkey, entries = read('ZRANGE', pkey, 0,
           UNPARK_LOOK - 1), pos = 0, unpark = {}, drop = {}, gone = {}}
      expect(g.occupants, 'set')
      if f.fair and string.sub(group, 1, 4) == 'key:' then
        g.ring_group = string.sub(group, 5) -- set aside whole while full: looked at again now
        expect(prefix .. 'gwait', 'zset')
      end
      f.groups[group] = g
      f.order[#f.order + 1] = group
    end
    while g.pos < #g.entries do
      g.pos = g.pos + 1
      local id = g.entries[g.pos]
      local r = load_run(prefix .. 'run:' .. id, 'state', 'parked', 'due', 'priority',
                         'limit_key')
      if r and r.state == 'pending' and r.parked == group and read('ZSCORE', due_key, id) then
        local level = priority_of(r.priority)
        local in_group = group_of(prefix, r.limit_key, f.fair)
        if level > 0 and not in_group then expect(prefix .. 'prio', 'zset') end
        g.unpark[#g.unpark + 1] = {id = id, due = whole_or(r.due, 0, 0), level = level,
                                   group = in_group}
        return g
      end
      g.drop[#g.drop + 1] = id
      -- Not waiting anywhere any more: its partition-wide entry goes too.
      if not (r and r.state == 'pending' and r.parked) then g.gone[#g.gone + 1] = id end
    end
    return g
  end
  f.pick = pick
  function f.free(run_id, groups)
    for _, group in ipairs(groups) do
      local g = pick(group)
      f.frees[#f.frees + 1] = {key = g.occupants, id = run_id}
    end
  end
  return f
end

-- Phase 2: SREM the freed slots, put the picked parked runs back at their original due time
-- (unpark) and drop stale entries. Returns how many runs were unparked.
local function free_slots(f, prefix, due_key, parked_key)
  for _, s in ipairs(f.frees) do redis.call('SREM', s.key, s.id) end
  local n = 0
  for _, group in ipairs(f.order) do
    local g = f.groups[group]
    if g.ring_group then redis.call('ZADD', prefix .. 'gwait', 'XX', 0, g.ring_group) end
    local ids, all = {}, {}
    for _, u in ipairs(g.unpark) do
      unpark(prefix, due_key, u)
      ids[#ids + 1] = u.id
      all[#all + 1] = u.id
      n = n + 1
    end
    for _, id in ipairs(g.drop) do ids[#ids + 1] = id end
    for _, id in ipairs(g.gone) do all[#all + 1] = id end
    if #ids > 0 then bulk('ZREM', g.parked, ids, 1000) end
    if #all > 0 then bulk('ZREM', parked_key, all, 1000) end
  end
  return n
end
