-- lib/workflows.lua: a finished run's parents hear of it through the outbox; a released
-- waiting run's payload.
--
-- uses: core, records
--
-- Provides:
--   outbox_entry(key, run, member, now) -> entry or nil (phase 1); to_outbox(entry)
--   flow_payload(run, deps_key, got_key, heard) -> payload or nil (phase 1)
--   finish_record(prefix, run_id, retention_ms, has_history, out) (phase 2)

-- -- workflows: a finished run's parents hear of it through the outbox ---------------------
-- A run other runs wait on has a record field 'parents' (a JSON list of [queue, run_id]; see
-- flow_create.lua). The script that finishes it (complete, fail, claim's and bounce's
-- burials, cancel) also lists it in its partition's outbox (jq:{q#p}:outbox, one of the
-- script's KEYS: run_id -> a version), and its record does not expire yet: the relay
-- (jobqueue.workflows.relay) reads it, delivers its outcome to each parent (deliver.lua,
-- which counts a child once, by id) and then removes the entry and sets the expiry
-- (relayed.lua), only if the entry's version is the one it read. A crash in between leaves
-- the entry: any later relay delivers again, and the parent ignores what it already counted.

-- Phase 1: where and at which version to list `member` (a finishing run) in the outbox at
-- `key`: {key, at, member}, or nil when no run waits on it (no 'parents'). Above the entry's
-- current version, if any: an entry relayed meanwhile is then not removed by that relay.
local function outbox_entry(key, run, member, now)
  if not run or type(run.parents) ~= 'string' or run.parents == '' then return nil end
  expect(key, 'zset')
  local at = whole_or(read('ZSCORE', key, member), 0, nil)
  if at and at >= now then return {key = key, at = at + 1, member = member} end
  return {key = key, at = now, member = member}
end

local function to_outbox(entry) redis.call('ZADD', entry.key, entry.at, entry.member) end

-- Phase 1: the payload of a waiting run released now, when its record says 'receives': its
-- dependencies' results first in its arguments ('one': the first dependency's, 'all': a list
-- in the order given, null for a failed one, removed ones left out), then its own
-- ('args_tail'). `heard`: outcomes counted in this call, not yet in got_key. Returns the
-- payload, or nil for a run that receives nothing.
local function flow_payload(run, deps_key, got_key, heard)
  if run.receives ~= 'one' and run.receives ~= 'all' then return nil end
  local deps = read('HGETALL', deps_key)
  local got = read('HGETALL', got_key)
  local outcome = {}
  for j = 1, #got, 2 do outcome[got[j]] = got[j + 1] end
  for dep, o in pairs(heard or {}) do outcome[dep] = o end
  local ranked = {}
  for j = 1, #deps, 2 do
    ranked[#ranked + 1] = {tonumber(string.match(deps[j + 1], '^(%d+)|')) or 0, deps[j]}
  end
  table.sort(ranked, function(a, b) return a[1] < b[1] end)
  local results = {}
  for _, r in ipairs(ranked) do
    local o = outcome[r[2]]
    if o ~= 'r' then
      if o and string.sub(o, 1, 1) == 'd' then results[#results + 1] = string.sub(o, 2)
      else results[#results + 1] = 'null' end
    end
  end
  local value
  if run.receives == 'one' then value = results[1] or 'null'
  else value = '[' .. table.concat(results, ',') .. ']' end
  return '{"args":[' .. value .. (run.args_tail or '],"kwargs":{}}')
end

-- Phase 2: a finished record expires after its retention, unless runs wait on it (`out`
-- from outbox_entry): then it goes to the outbox and relayed.lua expires it.
local function finish_record(prefix, run_id, retention_ms, has_history, out)
  if out then
    to_outbox(out)
  else
    expire_record(prefix, run_id, retention_ms, has_history)
  end
end
