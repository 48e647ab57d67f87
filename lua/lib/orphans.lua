-- lib/orphans.lua: index entries whose record is missing (claim.lua). They move to the
-- orphans index, never dropped: on a Redis Cluster node importing a slot, a record may not
-- have arrived yet. Each claim looks at a few orphans (ORPHANS_PER_CALL) and puts back those
-- whose record has appeared; `jobqueue repair` does the same for all. Orphans older than the
-- dead retention are forgotten.
--
-- uses: core, records, claimable
--
-- Provides (`call`: claim.lua's context; `p`/`plan`: its plan, p.orphans the entries read):
--   ORPHANS_PER_CALL
--   orphans_plan(p, call) (phase 1): which to put back (p.restore), which to forget
--   orphans_write(plan, call) (phase 2): stray due entries told in their history; lost and
--     orphaned entries added to the orphans index; those whose record appeared put back
--   orphans_settle(plan, call) (phase 2, with the removals): put back or forgotten ones go

local ORPHANS_PER_CALL = 10

local function orphans_plan(p, call)
  local now, prefix, dead_retention = call.now, call.prefix, call.dead_retention
  for i = 1, #p.orphans, 2 do
    local run_id, since = p.orphans[i], tonumber(p.orphans[i + 1])
    local run = claim_record(prefix, run_id)
    if run and run.state == 'pending' then
      p.restore[#p.restore + 1] = {call.due, whole_or(run.due, 0, now), run_id}
    elseif run and run.state == 'running' then
      p.restore[#p.restore + 1] = {call.leases, whole_or(run.lease_until, 0, now), run_id}
    elseif run and run.state then
      p.forget[#p.forget + 1] = run_id -- finished meanwhile: nothing to index here
    elseif dead_retention and dead_retention > 0 and since < now - dead_retention then
      p.forget[#p.forget + 1] = run_id
    end
  end
end

local function orphans_write(plan, call)
  local now, prefix = call.now, call.prefix
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
  if #orphans > 0 then bulk('ZADD', call.orphans, orphans, 2000) end
end

local function orphans_settle(plan, call)
  local settled = {}
  for _, r in ipairs(plan.restore) do settled[#settled + 1] = r[3] end
  for _, run_id in ipairs(plan.forget) do settled[#settled + 1] = run_id end
  if #settled > 0 then bulk('ZREM', call.orphans, settled, 1000) end
end
