-- progress.lua: record a running task's progress on its run record, only from the holder of
-- the current fence (ctx.progress).
--
-- uses: core, fences, events
--
-- KEYS[1]  run       hash    jq:{q#p}:run:<run_id>   the run
-- ARGV[1]  now                now ms, or '' for the server clock
-- ARGV[2]  fence              fence of the writer (the run's current claim)
-- ARGV[3]  progress           0 to 100 (the caller checks it)
-- ARGV[4]  message            a short text, or '' for none
-- ARGV[5]  prefix             key prefix jq:{q#p}: (optional: without it, no event)
-- ARGV[6]  run_id             the run (with the prefix)
-- Returns  {1, 'written'} when written (fields progress, progress_message, progress_at and
--          progress_attempt of the record; an empty message removes the field);
--          {0, reason, current_fence} when refused (reason as in heartbeat.lua; a record of
--          another type is 'unknown'). Refused whole (an error reply, nothing changed) when
--          the key is not on this node.
-- Events (see event_log in lib/events.lua): 'progress' ('<progress>|<message head>') when
-- written.

local now = clock(ARGV[1])
local fence, progress, message = tonumber(ARGV[2]), ARGV[3], ARGV[4]

local ok, plan = reading(function()
  local p = {run = load_run(KEYS[1], 'state', 'fence', 'attempt')}
  if ARGV[5] and ARGV[6] and not refusal(p.run, fence) then p.log = event_log(ARGV[5]) end
  return p
end)
if not ok then return plan end

local why = refusal(plan.run, fence)
if why then return {0, why, plan.run and whole_or(plan.run.fence, 0, 0) or 0} end
redis.call('HSET', KEYS[1], 'progress', progress, 'progress_at', now,
           'progress_attempt', whole_or(plan.run.attempt, 0, 0))
if message ~= '' then
  redis.call('HSET', KEYS[1], 'progress_message', message)
else
  redis.call('HDEL', KEYS[1], 'progress_message')
end
emit(plan.log, 'progress', ARGV[6], progress .. '|' .. utf8_head(message, EVENT_TEXT))
trim_events(plan.log)
return {1, 'written'}
