-- lib/due.lua: claim.lua's step 3, the due set in due order: every entry handled here leaves
-- it. A sound pending run is taken (or parked by a cap, lib/caps.lua); in a fair
-- partition it is adopted into its group's queue instead (lib/ring.lua serves it), and the
-- ring's runs are skipped. A record that cannot be run (no task, garbage counters, no or an
-- unknown state) is dead-lettered with the reason, never handed to a worker; one that was
-- parked leaves its parked entries. A run id whose key is not a hash is listed as dead (its key is
-- someone else's data, left alone). An entry without a record is an orphan
-- (lib/orphans.lua); a record in another state has no business in the due set: its entry
-- goes, and its history says so.
--
-- uses: core, priority, groups, claimable
--
-- Provides (`call`: claim.lua's context; `p`: its plan):
--   take_due(p, call, due, due_read, taking) -> taking (phase 1; `due`: the first due_read + 1
--     entries of the due zset, with scores)

local function take_due(p, call, due, due_read, taking)
  local now, prefix, limit = call.now, call.prefix, call.limit
  local admit, hinted, fair = p.admit, p.hinted, p.fair
  -- 3. Due runs: every entry handled here leaves the due set. (With groups, the ring's runs
  -- are skipped, and a sound pending run is adopted into its group instead of taken.)
  -- (In a fair partition, a page of due entries all served by the ring (in a group's queue)
  -- says nothing more: the ring tells its own next look. Only an entry step 3 handled or
  -- adopted means more may follow behind the page.)
  local page_full = #due == 2 * (due_read + 1)
  p.next_due = page_full and not fair and now or nil
  local met = false
  local served = {}
  if fair and #due > 0 then
    local ids = {}
    for i = 1, #due, 2 do ids[#ids + 1] = due[i] end
    local groups = read('HMGET', prefix .. 'gof', unpack(ids))
    for i, id in ipairs(ids) do if groups[i] then served[id] = true end end
    p.adopt = {}
  end
  for i = 1, #due, 2 do
    local run_id, at = due[i], tonumber(due[i + 1])
    if not hinted[run_id] and not served[run_id] then -- (done with in steps 1b and 2)
      if math.floor(at) > now or (taking >= limit and not fair) then p.next_due = at; break end
      met = true
      local run = claim_record(prefix, run_id)
      if not run then
        p.handled[#p.handled + 1] = run_id
        p.foreign[#p.foreign + 1] = run_id
      elseif run.state == 'pending' then
        run.id = run_id
        local bad = corrupt(run)
        if bad then
          p.handled[#p.handled + 1] = run_id
          run.reason, run.hist_ok = bad, history_ok(prefix, run_id)
          p.bury[#p.bury + 1] = run
          if run.parked then -- parked no more: its parked entries go (phase 2)
            expect(call.parked, 'zset')
            expect(prefix .. 'parked:' .. run.parked, 'zset')
            run.unpark = true
          end
        elseif fair then
          local level = priority_of(run.priority)
          p.adopt[#p.adopt + 1] = {group = group_of(prefix, run.limit_key, true), id = run_id,
                                   score = prio_score(level, at), due = at}
        elseif not admit or admit(run, at) then
          p.handled[#p.handled + 1] = run_id
          taking = taking + 1
          p.take[#p.take + 1] = run
          if run.priority then p.unhint[#p.unhint + 1] = run_id end
          dedupe_ends(p, prefix, run)
        end
      else
        p.handled[#p.handled + 1] = run_id
      end
      if not run or run.state == 'pending' then -- (handled above)
      elseif run.state == nil then
        -- No state: no record here (an orphan), or a record without a state (corrupt).
        if read('EXISTS', prefix .. 'run:' .. run_id) == 1 then
          run.id, run.reason = run_id, 'corrupt record: no state'
          run.hist_ok = history_ok(prefix, run_id)
          p.bury[#p.bury + 1] = run
        else
          p.orphan[#p.orphan + 1] = run_id
        end
      elseif not CLAIM_STATES[run.state] then
        run.id, run.hist_ok = run_id, history_ok(prefix, run_id)
        run.reason = 'corrupt record: unknown state ' .. utf8_head(run.state, 40)
        p.bury[#p.bury + 1] = run
      else
        -- A record in another state has no business in the due set: its entry goes, and its
        -- history says so (expiring with the record).
        if history_ok(prefix, run_id) then
          p.stray_due[#p.stray_due + 1] = {id = run_id, state = run.state,
                                           ttl = read('PTTL', prefix .. 'run:' .. run_id)}
        end
      end
    end
  end
  if fair and page_full and met and not p.next_due then p.next_due = now end
  return taking
end
