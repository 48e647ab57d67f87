-- read_records.lua: the records and histories of runs of one partition, in one reply (read
-- only). A client waiting on runs reads those whose finishing events it read together: one
-- reply to parse instead of two a run, which halves the waiting process's CPU per wait in a
-- burst (bench/events.py).
--
-- Flags: no-writes (it runs on a replica and under OOM)
--
-- uses: core, records
--
-- KEYS[1]  run       hash    jq:{q#p}:run:<run_id>   the record of the first run named
-- ARGV[1]  now                now ms, or '' for the server clock (not used: by convention)
-- ARGV[2]  prefix             key prefix jq:{q#p}:
-- ARGV[3..] run_ids           the runs, the first the one KEYS[1] names
-- Returns  {fields_1, history_1, ..., fields_n, history_n}: each run's record as HGETALL
--          gives it (empty when there is none) and its history as LRANGE 0 -1 gives it;
--          both false for a run whose record or history holds another type (the caller
--          reads that run itself, which reports it). Refused whole (an error reply) when a
--          key is not on this node.

local _ = clock(ARGV[1])
local prefix = ARGV[2]

local ok, out = reading(function()
  local replies = {}
  for i = 3, #ARGV do
    local key = i == 3 and KEYS[1] or prefix .. 'run:' .. ARGV[i]
    local fields, foreign = checked(redis.pcall('HGETALL', key), key, true)
    local hist_key = prefix .. 'hist:' .. ARGV[i]
    local history, foreign_history = checked(redis.pcall('LRANGE', hist_key, 0, -1),
                                             hist_key, true)
    if foreign or foreign_history then
      fields, history = false, false
    end
    replies[#replies + 1] = fields
    replies[#replies + 1] = history
  end
  return replies
end)
return out
