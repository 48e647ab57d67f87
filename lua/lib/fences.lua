-- lib/fences.lua: fences and leases: what a claim grants and a fenced operation checks.
--
-- uses: core
--
-- Provides:
--   fence_counter(key) -> c (phase 1); issue_fence(c, run_fence) -> fence; save_fences(c)
--   next_fence(last, run_fence) -> fence (above both, at least now_us)
--   lease_until(now, run_lease_ms, default_ms) -> expiry ms
--   refusal(run, fence) -> why a fenced operation is refused, or nil

-- A partition's fence counter, for issue_fence(): `last` is the last fence it issued; garbage
-- or another type counts as 0 (save_fences overwrites the counter with a SET, which takes any
-- type).
local function fence_counter(key)
  local v = checked(redis.pcall('GET', key), key, true)
  return {key = key, last = whole(v, 0) and tonumber(v) or 0, issued = false}
end

-- The next fence of a partition: above every fence it issued (`last`, its counter) and the
-- run's own, and at least the server clock in microseconds. The clock is what keeps fences
-- from ever repeating when a node lost part of its history (a replica promoted while it
-- lagged, a restart from an older snapshot): its clock has moved on since it issued the fences
-- it lost.
local function next_fence(last, run_fence)
  local f = math.max(last, tonumber(run_fence) or 0) + 1
  if now_us > f then f = now_us end
  return f
end

-- Issue a fence for a run (claim, cancel) from the counter `c` (fence_counter); save_fences()
-- then stores the last one issued, once per call.
local function issue_fence(c, run_fence)
  c.last = next_fence(c.last, run_fence)
  c.issued = true
  return c.last
end

local function save_fences(c)
  if c.issued then redis.call('SET', c.key, int(c.last)) end
end

-- A lease granted now (claim, heartbeat): the run's own lease_ms when it holds a usable one,
-- else the worker's default.
local function lease_until(now, run_lease_ms, default_ms)
  return now + whole_or(run_lease_ms, 1, default_ms)
end

-- Why a fenced operation is refused, or nil when the caller holds the current lease.
local function refusal(run, fence)
  if not run or not run.state then return 'unknown' end
  if run.state == 'cancelled' then return 'cancelled' end
  if (tonumber(run.fence) or 0) ~= fence then return 'fenced' end -- 0 until first claim
  if run.state == 'done' or run.state == 'dead' then return 'finished' end
  if run.state ~= 'running' then return 'not-running' end
  return nil
end
