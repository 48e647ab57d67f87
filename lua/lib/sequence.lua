-- lib/sequence.lua: FIFO within a millisecond: a partition's sequence and the scores it
-- gives (due and prio zsets).
--
-- uses: core, priority
--
-- Provides:
--   SEQ_SLOTS, PRIO_SLOTS, MAX_DUE_MS
--   sequencer(key, now) -> s or nil (phase 1); next_slot(s) -> slot; save_sequence(s)
--   due_score(due, slot), prio_slot_score(level, due, slot) -> scores

-- its due time plus i / SEQ_SLOTS in the due zset, and plus min(i, PRIO_SLOTS - 1) /
-- PRIO_SLOTS in the prio zset, so runs due in the same ms are claimed in creation order
-- (sorted-set members of equal score sort by id, not by age); the first of each ms keeps a
-- whole score. Exact for SEQ_SLOTS runs per ms and partition at the default priority and
-- PRIO_SLOTS above it (a prio score is up to 2^46 plus the due time: a double keeps 6 bits
-- of fraction there), and while due times are before 2^42 ms (the year 2109). Claims treat a
-- run as due once the whole ms of its score has come (claim.lua).
local SEQ_SLOTS = 2048
-- The latest due time a run may have (9000-01-01, as jobqueue.client.base.MAX_DUE_MS); the
-- buffered runs of buffer-one jobs wait at a far later hold time.
local MAX_DUE_MS = 221845392000000
local PRIO_SLOTS = 64

-- Phase 1: the partition's sequence (its hash {ms, n}); nil when the key holds another
-- type (no ordering then).
local function sequencer(key, now)
  local v, foreign = checked(redis.pcall('HMGET', key, 'ms', 'n'), key, true)
  if foreign then return nil end
  local n = 0
  if whole_or(v[1], 0, -1) == now then n = whole_or(v[2], 0, 0) end
  return {key = key, now = now, n = n, start = n}
end

-- Phase 2: the next run's place in its ms (0 without a sequencer).
local function next_slot(s)
  if not s then return 0 end
  s.n = s.n + 1
  return s.n - 1
end

-- Its scores in the due zset and, at `level`, in the prio zset.
local function due_score(due, slot) return due + math.min(slot, SEQ_SLOTS - 1) / SEQ_SLOTS end
local function prio_slot_score(level, due, slot)
  return prio_score(level, due) + math.min(slot, PRIO_SLOTS - 1) / PRIO_SLOTS
end

local function save_sequence(s)
  if s and s.n ~= s.start then redis.call('HSET', s.key, 'ms', int(s.now), 'n', int(s.n)) end
end
