-- purge.lua: delete dead runs for good (record, history and dead-set entry).
--
-- uses: core, events
--
-- KEYS[1]  dead      zset    jq:{q#p}:dead     run_id -> time it died
-- KEYS[2]  outbox    zset    jq:{q#p}:outbox   finished runs whose parents must hear
-- ARGV[1]  now                now ms, or '' for the server clock (read first, as every
--                             script does; nothing here depends on it)
-- ARGV[2]  prefix             key prefix jq:{q#p}:
-- ARGV[3..] run_ids           the runs to purge
-- Returns  {purged_count, refused_count}: a run that is not dead (requeued meanwhile, or
--          gone), or whose death the runs waiting on it have not heard of yet (its outbox
--          entry is still there: the relay needs its record), or whose order to cancel its
--          own dependencies is not carried out yet ('!<run_id>': the relay reads its flow
--          from the record), is left alone and counted as refused. A listed key that is not a run record
--          (see claim.lua) loses its listing, never the key, and counts as purged. Refused
--          whole (an error reply, nothing changed) when a key is not on this node or the dead
--          index holds another type.
-- Events (see event_log in lib/events.lua): 'purged' per run record deleted.

local _ = clock(ARGV[1])
local prefix = ARGV[2]

local log
local ok, plan = reading(function()
  expect(KEYS[1], 'zset')
  expect(KEYS[2], 'zset')
  log = event_log(prefix)
  local runs = {}
  for i = 3, #ARGV do
    local run_id = ARGV[i]
    local key = prefix .. 'run:' .. run_id
    local run = load_run(key, 'state')
    local r = {id = run_id, key = key, listed = read('ZSCORE', KEYS[1], run_id) ~= false}
    if not run then
      r.action = 'unlist' -- a foreign key: its listing goes, the key stays
    elseif run.state == 'dead' and (read('ZSCORE', KEYS[2], run_id) or
                                    read('ZSCORE', KEYS[2], '!' .. run_id)) then
      r.action = 'refuse' -- its waiting runs, or its own dependencies, have not heard yet
    elseif run.state == 'dead' then
      r.action = 'delete'
      r.hist = history_ok(prefix, run_id)
    elseif not run.state then
      r.action = read('EXISTS', key) == 0 and 'forget' or 'refuse'
    else
      r.action = 'refuse'
    end
    runs[#runs + 1] = r
  end
  return runs
end)
if not ok then return plan end

local purged, refused = 0, 0
for _, r in ipairs(plan) do
  if r.action == 'delete' then
    redis.call('DEL', r.key)
    if r.hist then redis.call('DEL', prefix .. 'hist:' .. r.id) end
    redis.call('ZREM', KEYS[1], r.id)
    emit(log, 'purged', r.id, '')
    purged = purged + 1
  elseif r.action == 'unlist' and r.listed then
    redis.call('ZREM', KEYS[1], r.id)
    purged = purged + 1
  else
    if r.action == 'forget' then redis.call('ZREM', KEYS[1], r.id) end -- nothing left of it
    refused = refused + 1
  end
end
trim_events(log)
return {purged, refused}
