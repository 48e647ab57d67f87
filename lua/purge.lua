-- purge.lua: delete dead runs for good (record, history and dead-set entry).
--
-- KEYS[1]  dead zset     jq:{q#p}:dead
-- ARGV[1]  now ms, or '' for the server clock (unused; every script takes it)
-- ARGV[2]  key prefix    jq:{q#p}:
-- ARGV[3..] run ids
-- Returns  {purged_count, refused_count}: a run that is not dead (requeued meanwhile,
--          or gone) is left alone and counted as refused. A listed key that is not a run
--          record (see claim.lua) loses its listing, never the key, and counts as purged.

local prefix = ARGV[2]
local purged, refused = 0, 0
for i = 3, #ARGV do
  local run_id = ARGV[i]
  local key = prefix .. 'run:' .. run_id
  local state = redis.pcall('HGET', key, 'state')
  if type(state) == 'table' and state.err then
    -- Not a hash: a foreign key claim listed as dead. Its listing goes; the key is left alone.
    if redis.call('ZREM', KEYS[1], run_id) == 1 then purged = purged + 1
    else refused = refused + 1 end
  elseif state == 'dead' then
    redis.call('DEL', key, prefix .. 'hist:' .. run_id)
    redis.call('ZREM', KEYS[1], run_id)
    purged = purged + 1
  else
    if redis.call('EXISTS', key) == 0 then redis.call('ZREM', KEYS[1], run_id) end
    refused = refused + 1
  end
end
return {purged, refused}
