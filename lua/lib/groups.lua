-- lib/groups.lua: fair shares between groups: a run's group queue (the ring itself is
-- lib/ring.lua, claim's).
--
-- uses: core
--
-- Provides:
--   GROUP_STEP, GROUP_WEIGHT_MAX
--   fair_partition(prefix) -> bool (phase 1: the queue has fair shares on)
--   group_of(prefix, limit_key, fair) -> group or nil (phase 1, its keys' types checked)
--   group_enter(prefix, group, run_id, score, due) (phase 2: the run waits in its group)
--   group_waited(prefix, run_id) -> the group whose queue the run waits in, or nil (phase 1,
--   its queue's type checked); group_leave(prefix, group, run_id) (phase 2: it waits no more)

-- Fair shares between groups (claim.lua's ring), a queue's setting (jq:{q#p}:gconf field
-- 'fair', group_set.lua). A run's group is its limit_key, '' for none. In a partition with
-- fair shares on, every pending run
-- waits in its group's queue too: jq:{q#p}:gq:<group> (zset run_id -> prio_score(level, due):
-- priority first within a group, then due time), and jq:{q#p}:gof (hash run_id -> group)
-- marks the due entries the ring serves. The due set stays the index of every pending run: a
-- group-queue entry is a hint, like prio's, checked against it when read. The ring:
-- jq:{q#p}:gready (zset group -> pass) holds the groups whose first run was due when last
-- looked at, jq:{q#p}:gwait (zset group -> when to look again) the others. A script that puts
-- a run back in the due set without these (older code, a workflow's release) leaves it to
-- claim, which adopts it into its group when it meets it near the head of the due set.
local GROUP_STEP, GROUP_WEIGHT_MAX = 1000000, 1000 -- a claim adds GROUP_STEP / weight to a pass
local function fair_partition(prefix)
  return read('HGET', prefix .. 'gconf', 'fair') ~= false
end

-- Phase 1: the group a pending run with this limit_key waits in (nil when fair shares are
-- off), its keys' types checked.
local group_keys_checked = {}
local function group_of(prefix, limit_key, fair)
  if not fair then return nil end
  local group = limit_key or ''
  if not group_keys_checked[group] then
    expect(prefix .. 'gq:' .. group, 'zset')
    if not group_keys_checked[true] then
      expect(prefix .. 'gof', 'hash')
      expect(prefix .. 'gwait', 'zset')
      group_keys_checked[true] = true
    end
    group_keys_checked[group] = true
  end
  return group
end

-- Phase 2: the run waits in its group's queue; the ring looks at the group by its due time
-- at the latest (ZADD LT: a member's score only moves earlier; claim promotes it once due).
-- (score: prio_score(level, due), or prio_slot_score for runs created in one ms.)
local function group_enter(prefix, group, run_id, score, due)
  redis.call('ZADD', prefix .. 'gq:' .. group, score, run_id)
  redis.call('HSET', prefix .. 'gof', run_id, group)
  redis.call('ZADD', prefix .. 'gwait', 'LT', int(math.floor(due)), group)
end

-- Phase 1: the group whose queue a pending run waits in (its gof entry), or nil.
local function group_waited(prefix, run_id)
  local group = read('HGET', prefix .. 'gof', run_id) or nil
  if group then expect(prefix .. 'gq:' .. group, 'zset') end
  return group
end

-- Phase 2: the run leaves its group's queue (cancel.lua: a group's max_size counts it no more).
local function group_leave(prefix, group, run_id)
  redis.call('ZREM', prefix .. 'gq:' .. group, run_id)
  redis.call('HDEL', prefix .. 'gof', run_id)
end
