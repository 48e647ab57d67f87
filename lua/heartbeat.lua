-- heartbeat.lua: extend the leases a worker holds in one partition, fence by fence.
--
-- uses: core, fences
--
-- KEYS[1]  leases    zset    jq:{q#p}:leases   run_id -> lease expiry (ms)
-- ARGV[1]  now                now ms, or '' for the server clock
-- ARGV[2]  prefix             key prefix jq:{q#p}:
-- ARGV[3]  lease_ms           default lease (used when the run has no lease of its own)
-- ARGV[4..] leases            pairs: run_id, fence
-- Returns  {now, r1, r2, ...}: per run the new lease expiry (ms), or a refusal string:
--          'fenced' (another claim took the run), 'cancelled', 'finished', 'not-running'
--          (released or back to pending) or 'unknown' (no such run). A refused worker must
--          stop the work: its commit will be refused too. Refused whole (an error reply,
--          nothing changed) when a key is not on this node or the leases key holds another
--          type.

local now = clock(ARGV[1])
local prefix, default_lease = ARGV[2], tonumber(ARGV[3])

local ok, plan = reading(function()
  expect(KEYS[1], 'zset')
  local runs = {}
  for i = 4, #ARGV, 2 do
    local run_id, fence = ARGV[i], tonumber(ARGV[i + 1])
    local run = load_run(prefix .. 'run:' .. run_id, 'state', 'fence', 'lease_ms')
    runs[#runs + 1] = {id = run_id, why = refusal(run, fence), lease = run and run.lease_ms}
  end
  return runs
end)
if not ok then return plan end

local out = {now}
local leases = {}
for _, r in ipairs(plan) do
  if r.why then
    out[#out + 1] = r.why
  else
    local expiry = lease_until(now, r.lease, default_lease)
    redis.call('HSET', prefix .. 'run:' .. r.id, 'lease_until', expiry)
    leases[#leases + 1] = expiry
    leases[#leases + 1] = r.id
    out[#out + 1] = expiry
  end
end
if #leases > 0 then bulk('ZADD', KEYS[1], leases, 2000) end
return out
