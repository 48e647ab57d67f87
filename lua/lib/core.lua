-- lib/core.lua: reading and checking (phase 1), numbers, text cuts, the clock, and the two
-- writes every script may use (bulk, bump). Every script and lib uses it.
--
-- uses: (none)
--
-- Provides:
--   clock(arg) -> now ms (ARGV[1], or the server clock); sets now_us (fences)
--   int(n) -> text; whole(v, lo), count(v, lo) -> bool; whole_or(v, lo, default) -> number
--   utf8_head(text, n), utf8_tail(text, n) -> text cut at a character boundary
--   reading(fn) -> ok, result-or-error-reply; refuse(text) inside it abandons the call
--   checked(reply, key, wrongtype_ok) -> reply, foreign; read(command, key, ...) -> reply
--   expect(key, kind) (refuses a key of another type); load_run(key, fields...) -> run or nil
--   history_ok(prefix, run_id) -> bool; counters(key, fields...) -> c, for bump(c, field, n)
--   bulk(command, key, args, step): one command for many members, in chunks
--
-- Conventions every script follows:
-- * ARGV[1] is now in ms, or '' to read the Redis server clock, and the script's first
--   statement reads it (clock), whether or not it decides anything with it: one clock decides
--   (invariant 4 of docs/design.md); the explicit form lets tests drive a fake clock through
--   the very same code.
-- * KEYS are only the keys the script uses, in the order its header lists them (the Python
--   contract in jobqueue/store builds them by name); run records and histories, named by the
--   call, are reached through the partition's prefix (ARGV[2]).
-- * The shared steps have one spelling, here: reading and checking (read, expect, load_run,
--   counters, waker, fence_counter; numbers: whole, whole_or, and count for limits; text
--   cut: utf8_head, utf8_tail), waking idle workers (wake: the one wake policy), issuing
--   fences (issue_fence, save_fences), a lease's length (lease_until), writing a new pending
--   record (write_pending), dead-lettering (bury), history, expiry and index trims
--   (history, expire_record, trim_index), a fire's run id (fire_run_id), a run's priority
--   and its place in the prio index (priority_of, prio_score).
-- * Two phases, because Redis does not roll back a script that fails half-way. The script
--   first reads every key it will touch, its declared keys and the records it names, checking
--   their types and values (reading()); anything wrong refuses the whole call with an error
--   reply before the first write. Then it writes, with commands that cannot fail on what was
--   read: a counter holding garbage is reset rather than incremented (bump), a key is never
--   emptied and then written again in one call, and nothing is read after a write.
-- * Refusals: 'TRYLATER jobqueue: ...' when a key is not on this node (a Redis Cluster slot
--   migrating: the caller retries later; not TRYAGAIN, which redis-py's cluster client
--   re-sends in a tight loop), 'ERR jobqueue: ...' for foreign data in a key the
--   script needs whole (a wrong type). A run record of a wrong type is one run's problem: the
--   script answers for that run alone ('unknown', or dead-letters it) and goes on.

local unpack = unpack or table.unpack -- Lua 5.1 in Redis, 5.4 in some emulators

-- The clock: ms for every decision, and us for fences (see next_fence). An explicit now (tests)
-- stands for both.
local now_us = 0
local function clock(arg)
  local explicit = tonumber(arg)
  if explicit then
    now_us = explicit * 1000
    return explicit
  end
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  now_us = s * 1000000 + us
  return s * 1000 + math.floor(us / 1000)
end

-- An integer as Redis text: Lua 5.1 prints large numbers in exponent form.
local function int(n) return string.format('%.0f', n) end

-- A whole number in [lo, 2^53] (tonumber also reads 'nan', 'inf', ' 12' and fractions).
local function whole(v, lo)
  if type(v) ~= 'string' and type(v) ~= 'number' then return false end
  local n = tonumber(v)
  return n ~= nil and n == n and n >= lo and n <= 9007199254740992 and n == math.floor(n)
end

-- A count as jobqueue writes it: decimal digits, no sign, no leading zero, no space, no
-- exponent (whole() would also read ' 5', '1e3', '0x10', '5.0', which the Python side reads as
-- no number: both sides must agree on what a limit is).
local function count(v, lo)
  return type(v) == 'string' and (v == '0' or string.match(v, '^[1-9]%d*$') ~= nil)
         and whole(v, lo)
end

-- The first (head) or last (tail) n bytes of text, cut at a UTF-8 character boundary (a cut
-- inside a character leaves bytes no client can decode).
local function utf8_head(text, n)
  if #text <= n then return text end
  while n > 0 do
    local b = string.byte(text, n + 1)
    if b < 0x80 or b >= 0xC0 then break end -- n + 1 starts a character
    n = n - 1
  end
  return string.sub(text, 1, n)
end

local function utf8_tail(text, n)
  if #text <= n then return text end
  local start = #text - n + 1
  while start <= #text do
    local b = string.byte(text, start)
    if b < 0x80 or b >= 0xC0 then break end
    start = start + 1
  end
  return string.sub(text, start)
end

-- A record's field as a whole number in [lo, 2^53], or `default` when it holds anything else:
-- NaN is no score ZADD takes, and NaN or inf is no integer a reply can carry.
local function whole_or(v, lo, default)
  if whole(v, lo) then return tonumber(v) end
  return default
end

-- -- phase 1: reading -------------------------------------------------------------------

-- reading(fn): run the read phase; returns (true, its result) or (false, the error reply to
-- return before any write). Inside, refuse(text) abandons the call.
local function refuse(text) error({jq_refusal = text}, 0) end

local function reading(fn)
  local ok, result = pcall(fn)
  if ok then return true, result end
  if type(result) == 'table' and result.jq_refusal then
    return false, redis.error_reply(result.jq_refusal)
  end
  if type(result) == 'table' and result.err then return false, result end
  return false, redis.error_reply('ERR jobqueue script failed before writing: ' ..
                                  tostring(result))
end

-- An error reply met while reading key: WRONGTYPE is returned to the caller when it may
-- handle it (a foreign run record); anything else refuses the call.
local function checked(reply, key, wrongtype_ok)
  if type(reply) ~= 'table' or not reply.err then return reply, false end
  local e = tostring(reply.err)
  if string.find(e, 'WRONGTYPE', 1, true) then
    if wrongtype_ok then return nil, true end
    refuse('ERR jobqueue: ' .. key .. ' holds foreign data of another type; nothing was ' ..
           'changed (see jobqueue check)')
  end
  if string.find(e, 'non local key', 1, true) or string.find(e, 'TRYAGAIN', 1, true) or
     string.find(e, 'ASK', 1, true) == 1 or string.find(e, 'MOVED', 1, true) == 1 or
     string.find(e, 'cluster is down', 1, true) then
    refuse('TRYLATER jobqueue: ' .. key .. ' is not on this node (a slot migration?); ' ..
           'nothing was changed')
  end
  refuse('ERR jobqueue: reading ' .. key .. ' failed, nothing was changed: ' .. e)
end

-- Any read command on one key, refusing on an error of any kind.
local function read(command, key, ...)
  return (checked(redis.pcall(command, key, ...), key, false))
end

-- A key the script will write but not otherwise read: it must be of this type or absent.
local function expect(key, kind)
  local t = read('TYPE', key)
  t = type(t) == 'table' and t.ok or t
  if t ~= 'none' and t ~= kind then
    refuse('ERR jobqueue: ' .. key .. ' holds a ' .. t .. ', not a ' .. kind ..
           '; nothing was changed (see jobqueue check)')
  end
end

-- The named fields of a run record, or nil when its key holds another type (a foreign key:
-- that run's problem alone). A missing record reads as an empty table.
local function load_run(key, ...)
  local values, foreign = checked(redis.pcall('HMGET', key, ...), key, true)
  if foreign then return nil end
  local run = {}
  for i, name in ipairs({...}) do run[name] = values[i] or nil end -- HMGET gives false
  return run
end

-- May this run's history be written? (Its list is absent or a list; touched now, so that a
-- key on another node refuses the call before any write.)
local function history_ok(prefix, run_id)
  local key = prefix .. 'hist:' .. run_id
  local _, foreign = checked(redis.pcall('LLEN', key), key, true)
  return not foreign
end

-- Counters of a stats hash: the fields' values now. A field holding garbage is noted and
-- bump() overwrites it; a stats key of another type is left alone (counting stops there).
-- An integer to HINCRBY is '0' or has no leading zero ('007' and '-0' are refused, after the
-- script's other writes), and has at most 15 characters (no overflow).
local function counters(key, ...)
  local values, foreign = checked(redis.pcall('HMGET', key, ...), key, true)
  local c = {key = key, bad = {}, foreign = foreign}
  if not foreign then
    for i, name in ipairs({...}) do
      local v = values[i]
      if v and not ((v == '0' or string.match(v, '^%-?[1-9]%d*$')) and #v <= 15) then
        c.bad[name] = true
      end
    end
  end
  return c
end

-- -- phase 2: writing -------------------------------------------------------------------

-- One command for many members (ZADD score member ..., ZREM member ...), in chunks: unpack
-- is bounded by Lua's stack.
local function bulk(command, key, args, step)
  for lo = 1, #args, step do
    redis.call(command, key, unpack(args, lo, math.min(#args, lo + step - 1)))
  end
end

local function bump(c, field, n)
  if c.foreign or n == 0 then return end
  if c.bad[field] then
    redis.call('HSET', c.key, field, n)
    c.bad[field] = nil
  else
    redis.call('HINCRBY', c.key, field, n)
  end
end
