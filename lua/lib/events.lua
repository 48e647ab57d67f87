-- lib/events.lua: the event log (jq:{q#p}:events), written by the scripts that make the
-- transitions.
--
-- uses: core
--
-- Provides:
--   EVENT_TEXT; event_log(prefix) -> log or nil (phase 1)
--   emit(log, event, run_id, info); trim_events(log) (phase 2)

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
