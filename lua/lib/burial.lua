-- lib/burial.lua: claim.lua's dead-lettering (lib/bury.lua does the burial itself): a lease
-- taken back past max_attempts, a corrupt record. A buried run gives up the slot it took and
-- its parked entries; one others wait on goes to the outbox (finish_record). A run id whose
-- key is not a hash is listed as dead so an operator sees it; the key itself is someone
-- else's data and is left alone.
--
-- uses: core, records, events, bury
--
-- Provides (`call`: claim.lua's context; `plan`: its plan):
--   bury_runs(plan, call) -> how many runs died (phase 2)

local function bury_runs(plan, call)
  local now, prefix, dead_retention = call.now, call.prefix, call.dead_retention
  local died = 0
  for _, run in ipairs(plan.bury) do
    if run.expired and run.hist_ok then
      history(prefix, run.id, now .. ' lease expired fence=' .. (run.fence or '?') ..
              ' attempt=' .. (run.attempt or '?') .. ' owner=' .. (run.owner or '?'))
    end
    if run.expired then
      emit(plan.log, 'expired', run.id, (run.attempt or '0') .. '|' .. (run.owner or ''))
    end
    bury(call.dead, prefix, run.id, now, run.reason, ' ' .. run.reason, dead_retention, run.hist_ok,
         run.outbox, plan.log, run.attempt)
    if run.held then redis.call('HDEL', prefix .. 'run:' .. run.id, 'held') end
    if run.unpark then
      redis.call('HDEL', prefix .. 'run:' .. run.id, 'parked')
      redis.call('ZREM', prefix .. 'parked:' .. run.parked, run.id)
      redis.call('ZREM', call.parked, run.id)
    end
    died = died + 1
  end
  local dead_entries = {}
  for _, run_id in ipairs(plan.foreign) do
    dead_entries[#dead_entries + 1] = now
    dead_entries[#dead_entries + 1] = run_id
    died = died + 1
  end
  if #dead_entries > 0 then bulk('ZADD', call.dead, dead_entries, 2000) end
  return died
end
