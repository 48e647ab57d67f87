-- _prelude.lua: the vocabulary every jobqueue script shares, prepended at load time (not a
-- script itself).
--
-- KEYS: none
-- ARGV: none
-- Returns: nothing; defines the local functions below.
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

local HISTORY_LEN = 32 -- events kept per run
local WAKE_TOKENS = 8  -- a wake list never holds more: enough for several idle workers

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

-- A wake list and the room left in it, for wake(); nil when its key holds another type (no
-- wake-up then).
local function waker(key)
  local n, foreign = checked(redis.pcall('LLEN', key), key, true)
  if foreign then return nil end
  return {key = key, room = WAKE_TOKENS - n}
end

-- A partition's fence counter, for issue_fence(): `last` is the last fence it issued; garbage
-- or another type counts as 0 (save_fences overwrites the counter with a SET, which takes any
-- type).
local function fence_counter(key)
  local v = checked(redis.pcall('GET', key), key, true)
  return {key = key, last = whole(v, 0) and tonumber(v) or 0, issued = false}
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

-- The one wake policy: a script that makes runs pending (created, retried, released, requeued,
-- released from hold) pushes one token per run, so idle workers blocked on the list claim at
-- once, or re-plan their sleep for a due time still ahead; never more than WAKE_TOKENS in the
-- list (enough for several idle workers; a list found longer is cut back). `w` from waker().
local function wake(w, runs)
  if not w then return end
  if w.room < 0 then
    redis.call('LTRIM', w.key, 0, WAKE_TOKENS - 1)
    w.room = 0
  end
  local n = math.min(w.room, runs)
  if n <= 0 then return end
  local tokens = {}
  for i = 1, n do tokens[i] = '1' end
  redis.call('LPUSH', w.key, unpack(tokens))
  w.room = w.room - n
end

-- The next fence of a partition: above every fence it issued (`last`, its counter) and the
-- run's own, and at least the server clock in microseconds. The clock is what keeps fences
-- from ever repeating when a node lost part of its history (a replica promoted while it
-- lagged, a restart from an older snapshot): its clock has moved on since it issued the fences
-- it lost.
local function next_fence(last, run_fence)
  local f = math.max(last, tonumber(run_fence) or 0) + 1
  if now_us > f then f = now_us end
  return f
end

-- Issue a fence for a run (claim, cancel) from the counter `c` (fence_counter); save_fences()
-- then stores the last one issued, once per call.
local function issue_fence(c, run_fence)
  c.last = next_fence(c.last, run_fence)
  c.issued = true
  return c.last
end

local function save_fences(c)
  if c.issued then redis.call('SET', c.key, int(c.last)) end
end

-- A lease granted now (claim, heartbeat): the run's own lease_ms when it holds a usable one,
-- else the worker's default.
local function lease_until(now, run_lease_ms, default_ms)
  return now + whole_or(run_lease_ms, 1, default_ms)
end

-- Priorities: 0 (the default) to PRIORITY_MAX. A run above 0 is also in the partition's prio
-- zset (jq:{q#p}:prio), scored by level then due time, so that claim reads the due runs of
-- each level, highest first, without scanning the due set (PRIORITY_SPAN = 2^43 ms, past the
-- year 2248, keeps every score an exact integer below 2^53).
local PRIORITY_MAX, PRIORITY_SPAN = 9, 8796093022208

-- A priority field or argument as a level: anything but a whole 0..PRIORITY_MAX counts as 0.
local function priority_of(v)
  if whole(v, 0) and tonumber(v) <= PRIORITY_MAX then return tonumber(v) end
  return 0
end

-- A run's score in the prio zset (level >= 1), as text: exact where a float's %g is not.
local function prio_score(level, due)
  return int((PRIORITY_MAX - level) * PRIORITY_SPAN + due)
end

-- Fair shares between groups (claim.lua's ring), a queue's setting (jq:{q#p}:gconf field
-- 'fair', group_set.lua). A run's group is its limit_key, '' for none. In a partition with
-- fair shares on, every pending run
-- waits in its group's queue too: jq:{q#p}:gq:<group> (zset run_id -> prio_score(level, due):
-- priority first within a group, then due time), and jq:{q#p}:gof (hash run_id -> group)
-- marks the due entries the ring serves. The due set stays the index of every pending run: a
-- group-queue entry is a hint, like prio's, checked against it when read. The ring:
-- jq:{q#p}:gready (zset group -> pass) holds the groups whose first run was due when last
-- looked at, jq:{q#p}:gwait (zset group -> when to look again) the others. A script that puts
-- a run back in the due set without these (older code, a workflow's release) leaves it to
-- claim, which adopts it into its group when it meets it near the head of the due set.
local GROUP_STEP, GROUP_WEIGHT_MAX = 1000000, 1000 -- a claim adds GROUP_STEP / weight to a pass
local function fair_partition(prefix)
  return read('HGET', prefix .. 'gconf', 'fair') ~= false
end

-- Phase 1: the group a pending run with this limit_key waits in (nil when fair shares are
-- off), its keys' types checked.
local group_keys_checked = {}
local function group_of(prefix, limit_key, fair)
  if not fair then return nil end
  local group = limit_key or ''
  if not group_keys_checked[group] then
    expect(prefix .. 'gq:' .. group, 'zset')
    if not group_keys_checked[true] then
      expect(prefix .. 'gof', 'hash')
      expect(prefix .. 'gwait', 'zset')
      group_keys_checked[true] = true
    end
    group_keys_checked[group] = true
  end
  return group
end

-- Phase 2: the run waits in its group's queue; the ring looks at the group by its due time
-- at the latest (ZADD LT: a member's score only moves earlier; claim promotes it once due).
-- (score: prio_score(level, due), or prio_slot_score for runs created in one ms.)
local function group_enter(prefix, group, run_id, score, due)
  redis.call('ZADD', prefix .. 'gq:' .. group, score, run_id)
  redis.call('HSET', prefix .. 'gof', run_id, group)
  redis.call('ZADD', prefix .. 'gwait', 'LT', int(math.floor(due)), group)
end

-- A fire's run id, '<job_id>@<fire instant>': the same as jobqueue.store.keys.fire_run_id
-- (tests/test_script_prelude.py checks that the two agree).
local function fire_run_id(job, instant)
  return job .. '@' .. instant
end

-- A new run's record (create_run, sched_create): pending, due at `due`, holding only what
-- differs from the defaults (no attempt or fence: 0 until the first claim; lease_ms and
-- timeout_ms only when not '0'; job and scheduled_for only when not ''), and no history entry
-- (creation is the record's created and due fields).
-- One HSET for the usual shapes (an enqueued run; a scheduled one, with job and scheduled_for):
-- this runs for every created run, and a table built per run costs the server more.
local function write_pending(key, now, due, task, payload, attempts, lease, timeout, job,
                             scheduled_for)
  if job ~= '' and scheduled_for ~= '' then
    redis.call('HSET', key, 'state', 'pending', 'task', task, 'payload', payload, 'due', due,
               'max_attempts', attempts, 'created', now, 'job', job,
               'scheduled_for', scheduled_for)
  else
    redis.call('HSET', key, 'state', 'pending', 'task', task, 'payload', payload, 'due', due,
               'max_attempts', attempts, 'created', now)
    if job ~= '' then redis.call('HSET', key, 'job', job) end
    if scheduled_for ~= '' then redis.call('HSET', key, 'scheduled_for', scheduled_for) end
  end
  if lease ~= '0' then redis.call('HSET', key, 'lease_ms', lease) end
  if timeout ~= '0' then redis.call('HSET', key, 'timeout_ms', timeout) end
end

-- A history entry (the record's 'hist' field says a list exists, so a run without notable
-- events costs no list). Only for runs whose history_ok() was true.
-- FIFO within a millisecond: the i-th run (from 0) created in a partition in one ms is due at
-- its due time plus i / SEQ_SLOTS in the due zset, and plus min(i, PRIO_SLOTS - 1) /
-- PRIO_SLOTS in the prio zset, so runs due in the same ms are claimed in creation order
-- (sorted-set members of equal score sort by id, not by age); the first of each ms keeps a
-- whole score. Exact for SEQ_SLOTS runs per ms and partition at the default priority and
-- PRIO_SLOTS above it (a prio score is up to 2^46 plus the due time: a double keeps 6 bits
-- of fraction there), and while due times are before 2^42 ms (the year 2109). Claims treat a
-- run as due once the whole ms of its score has come (claim.lua).
local SEQ_SLOTS = 2048
-- The latest due time a run may have (9000-01-01, as jobqueue.client.base.MAX_DUE_MS); the
-- held runs of buffer-one jobs wait at a far later hold time.
local MAX_DUE_MS = 221845392000000
local PRIO_SLOTS = 64

-- Phase 1: the partition's sequence (its hash {ms, n}); nil when the key holds another
-- type (no ordering then).
local function sequencer(key, now)
  local v, foreign = checked(redis.pcall('HMGET', key, 'ms', 'n'), key, true)
  if foreign then return nil end
  local n = 0
  if whole_or(v[1], 0, -1) == now then n = whole_or(v[2], 0, 0) end
  return {key = key, now = now, n = n, start = n}
end

-- Phase 2: the next run's place in its ms (0 without a sequencer).
local function next_slot(s)
  if not s then return 0 end
  s.n = s.n + 1
  return s.n - 1
end

-- Its scores in the due zset and, at `level`, in the prio zset.
local function due_score(due, slot) return due + math.min(slot, SEQ_SLOTS - 1) / SEQ_SLOTS end
local function prio_slot_score(level, due, slot)
  return prio_score(level, due) + math.min(slot, PRIO_SLOTS - 1) / PRIO_SLOTS
end

local function save_sequence(s)
  if s and s.n ~= s.start then redis.call('HSET', s.key, 'ms', int(s.now), 'n', int(s.n)) end
end

local function history(prefix, run_id, text)
  local key = prefix .. 'hist:' .. run_id
  local length = redis.call('RPUSH', key, text)
  if length == 1 then redis.call('HSET', prefix .. 'run:' .. run_id, 'hist', 1) end
  if length > HISTORY_LEN then redis.call('LTRIM', key, -HISTORY_LEN, -1) end
end

-- Finished records expire after their retention; the history goes with them. has_history
-- false (the record's 'hist' field was absent) skips the list.
local function expire_record(prefix, run_id, retention_ms, has_history)
  if retention_ms and retention_ms > 0 then
    redis.call('PEXPIRE', prefix .. 'run:' .. run_id, retention_ms)
    if has_history then
      redis.call('PEXPIRE', prefix .. 'hist:' .. run_id, retention_ms)
    end
  end
end

-- -- the event log: what happened to runs, as the scripts that made it happen wrote it ------
-- jq:{q#p}:events is a stream: one entry per transition, written by the script that made the
-- transition, in the same call, so an entry exists if and only if its transition happened.
-- Every entry has the same three fields (a stream then stores their names once per node):
--   e  the event: created, waiting, ready (a waiting run released), replaced (debounced),
--      claimed, progress, retry, completed, dead, cancelled, expired (a lease taken back),
--      refused (a commit refused), released, bounced (handed back), requeued, purged
--   r  the run id
--   i  what the event adds, fields joined by '|' (the last one may hold '|'; jobqueue/store/
--      events.py parses it): '<due ms>|<task>' (created), '<task>' (waiting), '<due ms>'
--      (replaced), '<attempt>|<worker>' (claimed, expired, released), '<attempt>|<due ms>'
--      (retry), '<attempt>|<error head>' (dead), '<attempt>' (completed), '<hand-backs>|
--      <worker>' (bounced), '<progress>|<message head>' (progress), '<reason>' (refused,
--      cancelled), '<state it had>' (requeued), '' (ready, purged)
-- The stream is trimmed at every write to about maxlen entries (MAXLEN ~: whole nodes, so up
-- to one node of entries more) and, once per call, to the entries of the last age_ms (MINID ~,
-- from the new entry's own id: the stream's clock, whatever `now` the call was given).
-- jq:{q#p}:events:conf (hash, optional) configures it: off = '1' writes none, maxlen,
-- age_ms. Never a reason to refuse a transition: a conf key of another type means the
-- defaults; a stream key of another type, or an ACL without XADD and XTRIM, means no event
-- (jobqueue events and the dashboard report a log of another type; waits read the records).
local EVENTS_MAXLEN, EVENTS_AGE_MS = 10000, 86400000
local EVENT_TEXT = 200 -- bytes of an error or progress text kept in an event

-- Phase 1: the partition's event log for emit(), or nil when none is to be written.
local function event_log(prefix)
  local key, conf_key = prefix .. 'events', prefix .. 'events:conf'
  local conf, foreign = checked(redis.pcall('HMGET', conf_key, 'off', 'maxlen', 'age_ms'),
                                conf_key, true)
  if foreign then conf = {} end
  if conf[1] == '1' then return nil end
  local t = read('TYPE', key)
  t = type(t) == 'table' and t.ok or t
  if t ~= 'none' and t ~= 'stream' then return nil end
  if redis.acl_check_cmd and not (redis.acl_check_cmd('XADD', key, '*', 'e', '') and
                                  redis.acl_check_cmd('XTRIM', key, 'MINID', '0')) then
    return nil
  end
  local maxlen = EVENTS_MAXLEN
  if count(conf[2], 1) then maxlen = tonumber(conf[2]) end
  local age = EVENTS_AGE_MS
  if count(conf[3], 1) then age = tonumber(conf[3]) end
  return {key = key, maxlen = int(maxlen), age = age, last = nil}
end

-- Phase 2: one entry (`log` from event_log; nil writes nothing). By pcall, after the
-- transition's own writes: an XADD the log refuses (a foreign stream whose last id cannot
-- grow) costs the event, never the rest of the transition (waits find it by their sweep).
local function emit(log, event, run_id, info)
  if not log or log.refused then return end
  local id = redis.pcall('XADD', log.key, 'MAXLEN', '~', log.maxlen, '*', 'e', event,
                         'r', run_id, 'i', info or '')
  if type(id) == 'table' then log.refused = true else log.last = id end
end

-- Phase 2, once per call after its last emit: the age trim.
local function trim_events(log)
  if not log or not log.last then return end
  local ms = tonumber(string.match(log.last, '^(%d+)'))
  if ms and ms > log.age then redis.pcall('XTRIM', log.key, 'MINID', '~', int(ms - log.age)) end
end

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

-- Entries of a finished-run index older than the retention: their records have expired.
-- Once per call, after the call's last entry was added to the index.
local function trim_index(key, now, retention_ms)
  if retention_ms and retention_ms > 0 then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now - retention_ms)
  end
end

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

-- -- a waiting run hears of its dependencies ------------------------------------------------
-- What deliver.lua does for each waiting run it delivers to, and complete.lua for a waiting
-- run of its own partition whose dependency it completes (counted in the commit's own call).
-- `w` is the run's plan; `ctx` the call's: {prefix, now, log, outbox (key), due, waiting,
-- dead, done (index keys), seq (sequencer), max_bytes, retention, dead_retention}.

-- Phase 1: the plan of waiting run `id` (open: it waits; left: its dependencies not heard of).
local function waiting_plan(prefix, id)
  local w = {id = id, key = prefix .. 'run:' .. id, got = {}, new = {}}
  w.run = load_run(w.key, 'state', 'left', 'receives', 'args_tail', 'parents',
                   'cancel_running', 'on_death_only', 'hist', 'staged', 'ready')
  -- (a staged run a 'continue' released early waits only on its commit: as a released run,
  -- it hears of nothing more)
  w.open = w.run ~= nil and w.run.state == 'waiting' and
           not (w.run.staged and w.run.ready == '1')
  if w.open then
    w.deps_key, w.got_key = prefix .. 'deps:' .. id, prefix .. 'got:' .. id
    expect(w.deps_key, 'hash')
    expect(w.got_key, 'hash')
    if whole(w.run.left, 0) then
      w.left = tonumber(w.run.left)
    else -- garbage: what the keys say is left (a dependency not yet in got)
      local deps, got = read('HKEYS', w.deps_key), {}
      for _, d in ipairs(read('HKEYS', w.got_key)) do got[d] = true end
      w.left = 0
      for _, d in ipairs(deps) do if not got[d] then w.left = w.left + 1 end end
    end
  end
  return w
end

-- Phase 1: dependency `dep` finished with `outcome` ('d' .. result, 'x' .. error, 'c' ..
-- reason): counted toward `w` once, by membership (1), or not (0: heard of before, not one of
-- its dependencies, or it waits no more). A death is handled by the edge's policy (see
-- deliver.lua).
local function waiting_hear(w, dep, outcome)
  if not w.open or w.die or w.skip or w.release then return 0 end
  local spec = read('HGET', w.deps_key, dep)
  if not spec or w.got[dep] or read('HGET', w.got_key, dep) then return 0 end
  local kind = string.sub(outcome, 1, 1)
  local policy = string.match(spec, '^%d+|(%a+)|') or 'fail'
  if kind == 'd' then
    w.got[dep] = outcome
  elseif policy == 'remove' then
    w.got[dep] = 'r'
  else
    w.got[dep] = outcome
    local why = 'dependency ' .. dep .. (kind == 'c' and ' was cancelled: ' or ' died: ') ..
                utf8_head(string.sub(outcome, 2), 300)
    if policy == 'continue' then
      w.release = true
    elseif policy == 'skip' then
      w.skip = why
    elseif policy ~= 'ignore' then -- fail (and anything foreign)
      w.die = why
    end
  end
  w.new[#w.new + 1] = dep
  w.new[#w.new + 1] = w.got[dep]
  w.left = math.max(w.left - 1, 0)
  return 1
end

-- Phase 1, after the last waiting_hear: what `w` becomes: dead, skipped (cancelled),
-- released (its payload built now), held (staged: its workflow not committed yet, see
-- flow_commit.lua; a 'continue' that would release it early says so in 'ready'), or still
-- waiting.
local function waiting_settle(w, ctx)
  if w.open and not w.die and not w.skip and not w.release and w.left == 0 and
     w.run.on_death_only == '1' then
    w.skip = 'every dependency finished and none died'
  end
  if w.open and not w.die and not w.skip and (w.release or w.left == 0) then
    if w.run.staged then
      w.ready, w.release = w.release == true, nil
    else
      w.release = true
      w.payload = flow_payload(w.run, w.deps_key, w.got_key, w.got)
      if w.payload and #w.payload > ctx.max_bytes then
        w.die = 'the results of its dependencies make a payload of ' .. #w.payload ..
                ' bytes, past the bound of ' .. int(ctx.max_bytes)
        w.release = nil
      end
    end
  end
  if w.die or w.skip then
    w.hist = w.run.hist ~= nil and history_ok(ctx.prefix, w.id)
    w.out = outbox_entry(ctx.outbox, w.run, w.id, ctx.now)
  end
  if w.die then w.order = outbox_entry(ctx.outbox, {parents = '!'}, '!' .. w.id, ctx.now) end
end

-- Phase 2: `w` as settled. Returns 'died', 'skipped', 'released' or nil; a released run's
-- due entry is added to ctx.due_pairs (the caller adds them all, and trims the indexes).
local function waiting_write(w, ctx)
  local now = ctx.now
  if #w.new > 0 then bulk('HSET', w.got_key, w.new, 2000) end
  if w.die then
    redis.call('HSET', w.key, 'left', w.left)
    bury(ctx.dead, ctx.prefix, w.id, now, w.die, ' ' .. w.die, ctx.dead_retention, w.hist,
         w.out, ctx.log, '0')
    redis.call('ZREM', ctx.waiting, w.id)
    to_outbox(w.order)
    return 'died'
  elseif w.skip then
    redis.call('HSET', w.key, 'state', 'cancelled', 'finished', now, 'error', w.skip,
               'left', w.left)
    if w.hist then history(ctx.prefix, w.id, now .. ' cancelled (was waiting): ' .. w.skip) end
    finish_record(ctx.prefix, w.id, ctx.retention, w.hist, w.out)
    redis.call('ZREM', ctx.waiting, w.id)
    redis.call('ZADD', ctx.done, now, w.id)
    if ctx.retention > 0 then
      redis.call('PEXPIRE', w.deps_key, ctx.retention)
      redis.call('PEXPIRE', w.got_key, ctx.retention)
    end
    emit(ctx.log, 'cancelled', w.id, utf8_head(w.skip, EVENT_TEXT))
    return 'skipped'
  elseif w.release then
    redis.call('HSET', w.key, 'state', 'pending', 'due', now, 'left', w.left)
    if w.payload then redis.call('HSET', w.key, 'payload', w.payload) end
    redis.call('ZREM', ctx.waiting, w.id)
    ctx.due_pairs[#ctx.due_pairs + 1] = due_score(now, next_slot(ctx.seq))
    ctx.due_pairs[#ctx.due_pairs + 1] = w.id
    if ctx.dead_retention > 0 then
      redis.call('PEXPIRE', w.deps_key, ctx.dead_retention)
      redis.call('PEXPIRE', w.got_key, ctx.dead_retention)
    end
    emit(ctx.log, 'ready', w.id, '')
    return 'released'
  elseif #w.new > 0 then
    redis.call('HSET', w.key, 'left', w.left)
    if w.ready then redis.call('HSET', w.key, 'ready', 1) end
  end
  return nil
end

-- Why a fenced operation is refused, or nil when the caller holds the current lease.
local function refusal(run, fence)
  if not run or not run.state then return 'unknown' end
  if run.state == 'cancelled' then return 'cancelled' end
  if (tonumber(run.fence) or 0) ~= fence then return 'fenced' end -- 0 until first claim
  if run.state == 'done' or run.state == 'dead' then return 'finished' end
  if run.state ~= 'running' then return 'not-running' end
  return nil
end

-- -- per-key and per-task concurrency caps (claim.lua, set_limit.lua) -------------------------
-- A running run that took a slot of a capped group holds it in jq:{q#p}:held:<group> (a set of
-- run ids), and its record's 'held' field says which: 't' = group 'task:<task>', 'k' = group
-- 'key:<limit_key>'. A due run of a full group is parked: its due score moves later (a
-- fallback recheck), its record's 'parked' field names the group, and it waits in
-- jq:{q#p}:parked:<group> (run_id -> its original due time, FIFO) and in the partition-wide
-- parked zset (KEYS; counting and visibility). A holder leaving its group (complete, fail,
-- cancel, release, claim's burial) frees its slot and unparks the oldest parked run of the
-- group: its due score goes back to its original due time.
local SLOT_CAP_MAX = 10000 -- a cap above it counts as none (validating a full set is bounded)
local UNPARK_LOOK = 32     -- parked entries looked at per group and call (stale ones dropped)

-- The groups whose slots a run holds, from its record's task, limit_key and held fields.
local function held_groups(run)
  local groups = {}
  local held = run and run.held
  if type(held) ~= 'string' then return groups end
  if string.find(held, 't', 1, true) and run.task then groups[#groups + 1] = 'task:' .. run.task end
  if string.find(held, 'k', 1, true) and run.limit_key then
    groups[#groups + 1] = 'key:' .. run.limit_key
  end
  return groups
end

-- Phase 2: put a parked run u = {id, due, level} back in line at its original due time, its
-- priority hint too (claim moved it to the recheck time; left there, the run would wait
-- behind the default level until then). The prio key (jq:{q#p}:prio, the prefix's hash tag)
-- is built from the prefix; its type is checked in phase 1 when level > 0.
local function unpark(prefix, due_key, u)
  redis.call('ZADD', due_key, u.due, u.id)
  if u.group then -- (a partition with groups: back in its group's queue)
    group_enter(prefix, u.group, u.id, prio_score(u.level, u.due), u.due)
  elseif u.level > 0 then
    redis.call('ZADD', prefix .. 'prio', prio_score(u.level, u.due), u.id)
  end
  redis.call('HDEL', prefix .. 'run:' .. u.id, 'parked')
end

-- Phase 1: a planner of slots freed in one call (parked_key: the partition-wide parked
-- zset). free(run_id, groups) checks each group's
-- held set and picks the oldest parked run of the group still waiting (pending, parked there,
-- in the due index); stale entries are noted for removal. Each group's entries are read once
-- per call, so that two holders freed in one call unpark two runs.
local function slot_freer(prefix, due_key, parked_key)
  local f = {frees = {}, groups = {}, order = {}}
  local function pick(group)
    local g = f.groups[group]
    if not g then
      if #f.order == 0 then
        expect(parked_key, 'zset')
        f.fair = fair_partition(prefix)
      end
      local pkey = prefix .. 'parked:' .. group
      g = {held = prefix .. 'held:' .. group, parked = pkey, entries = read('ZRANGE', pkey, 0,
           UNPARK_LOOK - 1), pos = 0, unpark = {}, drop = {}, gone = {}}
      expect(g.held, 'set')
      if f.fair and string.sub(group, 1, 4) == 'key:' then
        g.ring_group = string.sub(group, 5) -- held back whole while full: looked at again now
        expect(prefix .. 'gwait', 'zset')
      end
      f.groups[group] = g
      f.order[#f.order + 1] = group
    end
    while g.pos < #g.entries do
      g.pos = g.pos + 1
      local id = g.entries[g.pos]
      local r = load_run(prefix .. 'run:' .. id, 'state', 'parked', 'due', 'priority',
                         'limit_key')
      if r and r.state == 'pending' and r.parked == group and read('ZSCORE', due_key, id) then
        local level = priority_of(r.priority)
        local in_group = group_of(prefix, r.limit_key, f.fair)
        if level > 0 and not in_group then expect(prefix .. 'prio', 'zset') end
        g.unpark[#g.unpark + 1] = {id = id, due = whole_or(r.due, 0, 0), level = level,
                                   group = in_group}
        return g
      end
      g.drop[#g.drop + 1] = id
      -- Not waiting anywhere any more: its partition-wide entry goes too.
      if not (r and r.state == 'pending' and r.parked) then g.gone[#g.gone + 1] = id end
    end
    return g
  end
  f.pick = pick
  function f.free(run_id, groups)
    for _, group in ipairs(groups) do
      local g = pick(group)
      f.frees[#f.frees + 1] = {key = g.held, id = run_id}
    end
  end
  return f
end

-- Phase 2: SREM the freed slots, put the picked parked runs back at their original due time
-- (unpark) and drop stale entries. Returns how many runs were unparked.
local function free_slots(f, prefix, due_key, parked_key)
  for _, s in ipairs(f.frees) do redis.call('SREM', s.key, s.id) end
  local n = 0
  for _, group in ipairs(f.order) do
    local g = f.groups[group]
    if g.ring_group then redis.call('ZADD', prefix .. 'gwait', 'XX', 0, g.ring_group) end
    local ids, all = {}, {}
    for _, u in ipairs(g.unpark) do
      unpark(prefix, due_key, u)
      ids[#ids + 1] = u.id
      all[#all + 1] = u.id
      n = n + 1
    end
    for _, id in ipairs(g.drop) do ids[#ids + 1] = id end
    for _, id in ipairs(g.gone) do all[#all + 1] = id end
    if #ids > 0 then bulk('ZREM', g.parked, ids, 1000) end
    if #all > 0 then bulk('ZREM', parked_key, all, 1000) end
  end
  return n
end
