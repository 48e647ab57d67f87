-- sched_unhold.lua: forget buffer-one's buffered entries whose run was released (or is gone),
-- compare-and-set, so a slow scheduler never drops a newer entry recorded meanwhile.
--
-- uses: core
--
-- KEYS[1]  buffered  hash    jq:{sched#k}:held  job_id -> 'fire pred_fire due queue
--                                               [pred_queue]' (the key's name is historical)
-- ARGV[1]  now                now ms, or '' for the server clock (unused but for the reply:
--                             one clock)
-- ARGV[2..] entries           2 fields per entry: job_id, the buffered entry the caller read
-- Returns  {now, removed}. Refused whole (an error reply, nothing changed) when a key is not
--          on this node or the buffered key holds another type.

local now = clock(ARGV[1])

local ok, plan = reading(function()
  local gone = {}
  for i = 2, #ARGV, 2 do
    if read('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then gone[#gone + 1] = ARGV[i] end
  end
  return gone
end)
if not ok then return plan end
if #plan > 0 then bulk('HDEL', KEYS[1], plan, 1000) end
return {now, #plan}
