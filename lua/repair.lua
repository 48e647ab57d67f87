-- repair.lua: put runs of one partition back in the index their state belongs to (jobqueue
-- repair): after a slot migration, a restore or foreign writes, a record may lack its index
-- entry (a pending run no claim can see) and an index entry its record.
--
-- uses: core
--
-- KEYS[1]  due       zset    jq:{q#p}:due      run_id -> due time (ms)
-- KEYS[2]  leases    zset    jq:{q#p}:leases   run_id -> lease expiry (ms)
-- KEYS[3]  dead      zset    jq:{q#p}:dead     run_id -> time it died
-- KEYS[4]  done      zset    jq:{q#p}:done     run_id -> finish time (done and cancelled)
-- KEYS[5]  orphans   zset    jq:{q#p}:orphans  run_id -> when its entry was found recordless
-- ARGV[1]  now                now ms, or '' for the server clock
-- ARGV[2]  prefix             key prefix jq:{q#p}:
-- ARGV[3]  dry_run            '1' to report what would change and change nothing, else '0'
-- ARGV[4..] run_ids           the runs to look at (records, index entries, orphans)
-- Returns  {indexed, orphaned, unorphaned, unchanged}: records given their missing index
--          entry (and stray entries of another index removed); index entries without a
--          record moved to the orphans index; orphans whose record is back, put back in
--          place; runs already right. Refused whole (an error reply, nothing changed) when a
--          key is not on this node or an index key holds another type.
--
-- A run's place, by its record's state: pending in due (at its due time), running in leases
-- (at its lease_until, or now: expired, so a claim takes it), dead in dead, done and
-- cancelled in done (at their finish time). A key that is not a run record is left alone.

local now = clock(ARGV[1])
local prefix, dry = ARGV[2], ARGV[3] == '1'
local INDEX = {pending = 1, running = 2, dead = 3, done = 4, cancelled = 4}

local ok, plan = reading(function()
  for i = 1, 5 do expect(KEYS[i], 'zset') end
  local fixes = {}
  for i = 4, #ARGV do
    local run_id = ARGV[i]
    local run = load_run(prefix .. 'run:' .. run_id, 'state', 'due', 'lease_until', 'finished')
    local where = {}
    for k = 1, 5 do where[k] = read('ZSCORE', KEYS[k], run_id) end
    local fix = {id = run_id, add = nil, remove = {}, kind = 'unchanged'}
    local home = run and INDEX[run.state or '']
    if home then
      local score = now
      if home == 1 then score = whole_or(run.due, 0, now)
      elseif home == 2 then score = whole_or(run.lease_until, 0, now)
      else score = whole_or(run.finished, 0, now) end
      if not where[home] then fix.add, fix.score, fix.kind = home, score, 'indexed' end
      for k = 1, 5 do
        if k ~= home and where[k] then
          fix.remove[#fix.remove + 1] = k
          if fix.kind == 'unchanged' then fix.kind = k == 5 and 'unorphaned' or 'indexed' end
        end
      end
      if fix.kind == 'indexed' and where[5] then fix.kind = 'unorphaned' end
    elseif run and not run.state and read('EXISTS', prefix .. 'run:' .. run_id) == 0 then
      -- No record: its entries in due or leases become an orphan (kept until it comes back).
      for k = 1, 2 do
        if where[k] then fix.remove[#fix.remove + 1] = k; fix.kind = 'orphaned' end
      end
      if fix.kind == 'orphaned' and not where[5] then fix.add, fix.score = 5, now end
    end
    fixes[#fixes + 1] = fix
  end
  return fixes
end)
if not ok then return plan end

local counts = {indexed = 0, orphaned = 0, unorphaned = 0, unchanged = 0}
for _, fix in ipairs(plan) do
  counts[fix.kind] = counts[fix.kind] + 1
  if not dry and fix.kind ~= 'unchanged' then
    if fix.add then redis.call('ZADD', KEYS[fix.add], fix.score, fix.id) end
    for _, k in ipairs(fix.remove) do redis.call('ZREM', KEYS[k], fix.id) end
  end
end
return {counts.indexed, counts.orphaned, counts.unorphaned, counts.unchanged}
