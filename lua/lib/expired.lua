-- lib/expired.lua: claim.lua's step 1, leases that expired (their worker died or stalled):
-- each is taken again first, counting an attempt; a run past max_attempts, or whose record
-- is corrupt, goes to the dead set instead (its slots freed, a parked run takes one). An
-- entry without a record here is an orphan (lib/orphans.lua); one of a run not running
-- just goes.
--
-- uses: core, slots, caps, claimable
--
-- Provides (`call`: claim.lua's context; `p`/`plan`: its plan):
--   take_expired(p, call, leases, taking) -> taking (phase 1; `leases`: the first entries of
--     the leases zset, with scores; `taking`: runs taken so far)
--   drop_leases(plan, call) (phase 2, with the removals): the lease entries of runs buried,
--     foreign, lost or stray go, never one a run taken in this call holds now

local function take_expired(p, call, leases, taking)
  local now, prefix, limit = call.now, call.prefix, call.limit
  -- 1. Expired leases. (Every entry read handled and more may follow: wake again at once.)
  p.next_lease = #leases == 2 * (limit + 1) and now or nil
  for i = 1, #leases, 2 do
    local run_id, until_ = leases[i], tonumber(leases[i + 1])
    if until_ > now or taking >= limit then p.next_lease = until_; break end
    local run = claim_record(prefix, run_id)
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
        if run.held then freer_of(p, call).free(run_id, slot_groups(run)) end
      elseif (tonumber(run.attempt) or 0) >= tonumber(run.max_attempts) then
        run.reason = 'lease expired on attempt ' .. (run.attempt or '?') .. ' of ' ..
                     run.max_attempts .. ' (worker died or stalled)'
        p.bury[#p.bury + 1] = run
        -- Its slots go, a parked run takes one.
        if run.held then freer_of(p, call).free(run_id, slot_groups(run)) end
      else
        taking = taking + 1
        p.take[#p.take + 1] = run
      end
    end
  end
  return taking
end

local function drop_leases(plan, call)
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
  if #gone > 0 then bulk('ZREM', call.leases, gone, 1000) end
end
