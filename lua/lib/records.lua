-- lib/records.lua: run records and their histories: a new pending record, a fire's run id,
-- history entries, expiry, index trims.
--
-- uses: (none)
--
-- Provides:
--   fire_run_id(job, instant) -> run id
--   write_pending(key, now, due, task, payload, attempts, lease, timeout, job, scheduled_for)
--   history(prefix, run_id, text) (only where history_ok() was true)
--   expire_record(prefix, run_id, retention_ms, has_history)
--   trim_index(key, now, retention_ms)

local HISTORY_LEN = 32 -- events kept per run

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

-- Entries of a finished-run index older than the retention: their records have expired.
-- Once per call, after the call's last entry was added to the index.
local function trim_index(key, now, retention_ms)
  if retention_ms and retention_ms > 0 then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now - retention_ms)
  end
end
