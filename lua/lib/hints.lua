-- lib/hints.lua: claim.lua's step 2, the due runs above the default priority, highest level
-- first, then by due time (FIFO within a level), read from the prio zset: a hint next to the
-- due set, which stays the index of every pending run. A prio entry whose run is no longer
-- in the due set, or whose record says another level, is dropped; one whose due time moved
-- later is moved with it. Strict priority: while due runs of a higher level remain, a lower
-- level waits. (Under per-key or per-task limits, a level whose page of hints was all set
-- aside, parked or delayed, is read on, up to 64 more.) A hinted run that is not a sound
-- pending record is left to step 3 (lib/due.lua), which knows what to do with it.
--
-- uses: core, priority, claimable
--
-- Provides (`call`: claim.lua's context; `p`: its plan):
--   take_hinted(p, call, taking, hint_count) -> taking (phase 1; `hint_count`: ZCARD of the
--     prio zset; not in a fair partition, where the ring reads each group's queue by level)

local function take_hinted(p, call, taking, hint_count)
  local now, prefix, limit = call.now, call.prefix, call.limit
  local default_lease = call.default_lease
  local admit, hinted, fair, flow = p.admit, p.hinted, p.fair, p.flow
  -- One hint: true when its run is set aside (parked by a cap or delayed by a key rate).
  local function hint(level, run_id)
    local at = tonumber(read('ZSCORE', call.due, run_id))
    local run = at and claim_record(prefix, run_id)
    if not run or priority_of(run.priority) ~= level then
      -- Not pending here any more, or a new record of the id at another level.
      p.unhint[#p.unhint + 1] = run_id
    elseif math.floor(at) > now then -- (a score's fraction orders its ms: lib/sequence.lua)
      p.rehint[#p.rehint + 1] = prio_score(level, at) -- its due time moved later
      p.rehint[#p.rehint + 1] = run_id
    elseif run.state == 'pending' and not corrupt(run) then
      run.id = run_id
      hinted[run_id] = true
      if not admit or admit(run, at) then
        taking = taking + 1
        p.take[#p.take + 1] = run
        p.handled[#p.handled + 1] = run_id
        dedupe_ends(p, prefix, run)
        p.unhint[#p.unhint + 1] = run_id
        return false
      end
      return true -- set aside: its hint moves with its due score (phase 2)
    else
      p.unhint[#p.unhint + 1] = run_id
    end
    return false
  end
  -- Runs set aside do not use up the room, so a page of them may hide runs of their level
  -- behind: then the level's next page is read, up to 64 more entries in all (as step 3 reads
  -- 64 more due entries).
  local extra_hints = flow and 64 or 0
  if taking < limit and hint_count > 0 and not fair then
    for level = PRIORITY_MAX, 1, -1 do
      if taking >= limit then break end
      local base = (PRIORITY_MAX - level) * PRIORITY_SPAN
      -- A few more than the room: stale entries (cancelled runs) do not use it up.
      local offset, page = 0, 2 * (limit - taking) + 8
      while page > 0 and taking < limit do
        local hints = read('ZRANGE', call.prio, int(base), '(' .. int(base + now + 1), 'BYSCORE',
                           'LIMIT', offset, page)
        local aside = false
        for _, run_id in ipairs(hints) do
          if taking >= limit then break end
          if hint(level, run_id) then aside = true end
        end
        offset = offset + #hints
        local full = #hints == page
        page = 0
        if aside and full and taking < limit then
          page = math.min(2 * (limit - taking) + 8, extra_hints)
          extra_hints = extra_hints - page
        end
      end
    end
  end
  return taking
end
