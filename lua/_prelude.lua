-- _prelude.lua: helpers prepended to every jobqueue script at load time (not a script itself).
--
-- KEYS: none
-- ARGV: none
-- Returns: nothing; defines local functions used by the scripts.
--
-- Every script takes ARGV[1] = now in ms, or '' to read the Redis server clock: one clock
-- decides (invariant 4 of docs/design.md); the explicit form lets tests drive a fake clock through the
-- very same code.

local function clock(arg)
  local explicit = tonumber(arg)
  if explicit then return explicit end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local unpack = unpack or table.unpack -- Lua 5.1 in Redis, 5.4 in some emulators

local HISTORY_LEN = 32

-- One command for many members (ZADD score member ..., ZREM member ...): one call instead of
-- one per run; in chunks, since unpack is bounded by Lua's stack.
local function bulk(command, key, args, step)
  for lo = 1, #args, step do
    redis.call(command, key, unpack(args, lo, math.min(#args, lo + step - 1)))
  end
end

-- The record's 'hist' field says a history list exists, so a run that never had a notable
-- event costs no list and no second expiry when it finishes.
local function history(prefix, run_id, text)
  local key = prefix .. 'hist:' .. run_id
  local length = redis.call('RPUSH', key, text)
  if length == 1 then redis.call('HSET', prefix .. 'run:' .. run_id, 'hist', 1) end
  -- Trim only when over the cap: one call instead of two on nearly every event.
  if length > HISTORY_LEN then
    redis.call('LTRIM', key, -HISTORY_LEN, -1)
  end
end

-- Finished records expire after their retention; the history goes with them. has_history
-- false (the record's 'hist' field was absent) skips the list; nil means unknown.
local function expire_record(prefix, run_id, retention_ms, has_history)
  if retention_ms and retention_ms > 0 then
    redis.call('PEXPIRE', prefix .. 'run:' .. run_id, retention_ms)
    if has_history ~= false then
      redis.call('PEXPIRE', prefix .. 'hist:' .. run_id, retention_ms)
    end
  end
end

-- Why a fenced operation is refused, or nil when the caller holds the current lease.
local function refusal(run, fence)
  if not run.state then return 'unknown' end
  if run.state == 'cancelled' then return 'cancelled' end
  if (tonumber(run.fence) or 0) ~= fence then return 'fenced' end -- 0 until first claim
  if run.state == 'done' or run.state == 'dead' then return 'finished' end
  if run.state ~= 'running' then return 'not-running' end
  return nil
end

-- The named fields of a run record; a key that is not a hash reads as no record (refused as
-- 'unknown') rather than an error that would abort a batched script half-way.
local function load_run(key, ...)
  local values = redis.pcall('HMGET', key, ...)
  local run = {}
  if values.err then return run end
  for i, name in ipairs({...}) do run[name] = values[i] or nil end -- HMGET gives false for nil
  return run
end
