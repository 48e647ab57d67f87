-- lib/bury.lua: dead-lettering a run (claim, fail, bounce, deliver).
--
-- uses: core, records, events, workflows
--
-- Provides:
--   bury(dead_key, prefix, run_id, now, err, note, retention_ms, has_history, out, log,
--        attempt) (phase 2)

-- Dead-lettering (claim, fail): the run will not run again. Its record says dead, with the
-- error, and loses its lease; its history (when has_history: history_ok() was true) ends with
-- '<now> dead<note>'; it expires after the dead retention and is listed in the dead index at
-- now; its 'dead' event goes to `log` (event_log; '<attempt>|<error head>'). The caller removes
-- its other index entry, and trims the dead index (trim_index) after its last bury.
local function bury(dead_key, prefix, run_id, now, err, note, retention_ms, has_history,
                    out, log, attempt)
  local key = prefix .. 'run:' .. run_id
  redis.call('HSET', key, 'state', 'dead', 'error', err, 'finished', now)
  redis.call('HDEL', key, 'lease_until')
  if has_history then history(prefix, run_id, now .. ' dead' .. note) end
  emit(log, 'dead', run_id, (attempt or '0') .. '|' .. utf8_head(err, EVENT_TEXT))
  finish_record(prefix, run_id, retention_ms, has_history, out)
  redis.call('ZADD', dead_key, now, run_id)
end
