-- lib/priority.lua: priority levels and the prio zset's scores.
--
-- uses: core
--
-- Provides:
--   PRIORITY_MAX, PRIORITY_SPAN
--   priority_of(v) -> level 0..PRIORITY_MAX; prio_score(level, due) -> score as text

-- Priorities: 0 (the default) to PRIORITY_MAX. A run above 0 is also in the partition's prio
-- zset (jq:{q#p}:prio), scored by level then due time, so that claim reads the due runs of
-- each level, highest first, without scanning the due set (PRIORITY_SPAN = 2^43 ms, past the
-- year 2248, keeps every score an exact integer below 2^53).
local PRIORITY_MAX, PRIORITY_SPAN = 9, 8796093022208

-- A priority field or argument as a level: anything but a whole 0..PRIORITY_MAX counts as 0.
local function priority_of(v)
  if whole(v, 0) and tonumber(v) <= PRIORITY_MAX then return tonumber(v) end
  return 0
end

-- A run's score in the prio zset (level >= 1), as text: exact where a float's %g is not.
local function prio_score(level, due)
  return int((PRIORITY_MAX - level) * PRIORITY_SPAN + due)
end
