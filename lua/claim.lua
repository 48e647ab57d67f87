-- claim.lua: lease up to N claimable runs of one partition to one worker.
--
-- uses: core, fences, records, events, workflows, limits, caps, claimable, expired, ring, hints,
--       due, orphans, burial
--
-- KEYS[1]  due       zset    jq:{q#p}:due      run_id -> due time (ms)
-- KEYS[2]  leases    zset    jq:{q#p}:leases   run_id -> lease expiry (ms)
-- KEYS[3]  dead      zset    jq:{q#p}:dead     run_id -> time it died
-- KEYS[4]  stats     hash    jq:{q#p}:stats    counters
-- KEYS[5]  fences    string  jq:{q#p}:fences   the last fence issued in the partition
-- KEYS[6]  orphans   zset    jq:{q#p}:orphans  run_id -> when its index entry was found
--                                              without a record (see below)
-- KEYS[7]  paused    string  jq:{q#p}:paused   present while the queue is paused (pause.lua)
-- KEYS[8]  limits    hash    jq:{q#p}:limits   the partition's flow limits (set_limit.lua):
--                                              concurrency = the most runs running at once,
--                                              rate = 'N W': at most N claims in any W ms
-- KEYS[9]  claims    zset    jq:{q#p}:claims   fence -> claim time (ms), the claims of the
--                                              last W ms (kept only under a rate limit)
-- KEYS[10] prio      zset    jq:{q#p}:prio     run_id -> (9 - priority) * 2^43 + due time,
--                                              the runs above the default priority
-- KEYS[11] parked    zset    jq:{q#p}:parked   run_id -> original due time: the runs
--                                              parked by a per-key or per-task cap
-- KEYS[12] outbox    zset    jq:{q#p}:outbox   finished runs whose parents must hear
-- ARGV[1]  now                now ms, or '' for the server clock
-- ARGV[2]  prefix             key prefix jq:{q#p}:
-- ARGV[3]  limit              the most runs to claim
-- ARGV[4]  owner              worker id
-- ARGV[5]  lease_ms           default lease (used when the run has no lease of its own)
-- ARGV[6]  dead_retention_ms  how long dead records live (the dead index is trimmed to it)
-- Returns  {now, next_wake, count, then 12 fields per claimed run:
--           run_id, fence, attempt, max_attempts, task, payload, lease_until, timeout_ms,
--           job_id, scheduled_for, due, meta}
--          next_wake = earliest due time or lease expiry still pending in this partition
--          (ms), or -1 when there is none: the worker sleeps on the wake list until then.
--          A paused partition replies {now, -1, 0} and changes nothing: no run is claimed, no
--          expired lease taken back (that waits for the resume).
--          A concurrency limit C counts the live leases (expiry after now): the call takes at
--          most C minus those, expired leases taken back included. With no room it changes
--          nothing and replies {now, next_wake, 0}, next_wake being the earliest live lease
--          expiry (a slot is free by then at the latest; a commit frees one sooner).
--          A rate limit 'N W' counts the claims of the last W ms (claims, expired leases taken
--          back included): the call takes at most N minus those, and with no room replies
--          next_wake = when the oldest of them leaves the window, changing nothing.
--          A limit field that is not a whole number (rate: two) counts as no limit.
--          Per-key and per-task caps (limits fields key_concurrency, task:<name>, at most
--          10,000) and a per-key rate (key_rate 'N W'): a due run whose group is full is
--          parked (see below) and one whose key's window is full has its due score moved to
--          when the window has room; neither uses up the call's limit, and next_wake is now
--          when more due entries may follow.
--          Refused whole (an error reply, nothing changed) when a key is not on this node
--          (TRYLATER: a slot migration), or an index key (prio too), the paused or the
--          limits key (or, under a rate limit, the claims key) holds another type.
--
-- The steps, each in the lib named: the limits' room (limits), then 1. leases that expired,
-- taken first (expired); 1b. in a partition with fair shares, the ring (ring); 2. due runs
-- above the default priority (hints); 3. due runs in due order (due); under per-key or
-- per-task caps or a per-key rate, each run admitted, parked or delayed (caps); 4. orphans put
-- back (orphans). Every claim issues a new fence (claimable: lease_runs). A record that
-- cannot be run is dead-lettered with the reason (burial), never handed to a worker. A run
-- enqueued under a deduplication key without a ttl releases the key at its first claim
-- (claimable: dedupe_ends). Events (lib/events.lua): 'claimed' ('<attempt>|<worker>') per
-- run taken, 'expired' ('<attempt>|<worker>' of the lapsed attempt) per lease taken back,
-- 'dead' per run dead-lettered with a record.

local now = clock(ARGV[1])
local call = {now = now, prefix = ARGV[2], limit = tonumber(ARGV[3]), owner = ARGV[4],
              default_lease = tonumber(ARGV[5]), dead_retention = tonumber(ARGV[6]),
              server_clock = ARGV[1] == '', due = KEYS[1], leases = KEYS[2], dead = KEYS[3],
              stats = KEYS[4], fences = KEYS[5], orphans = KEYS[6], limits = KEYS[8],
              claims = KEYS[9], prio = KEYS[10], parked = KEYS[11], outbox = KEYS[12]}

-- -- phase 1: read everything, decide everything -------------------------------------------

local ok, plan = reading(function()
  if read('GET', KEYS[7]) ~= false then return {paused = true} end
  local lim = claim_limits(call) -- (call.limit lowered to the room the limits leave)
  if lim.full then return lim end
  local limit = call.limit
  local p = {take = {}, bury = {}, foreign = {}, lost = {}, orphan = {}, stray = {},
             stray_due = {}, restore = {}, forget = {}, undedupe = {}, expired = 0,
             rate_w = lim.rate_w, fair = lim.fair}
  -- One entry past the limit of each index: after this call's removals, the first entry left
  -- tells the next wake-up without reading after a write. Under per-key or per-task limits a
  -- few more due entries: parked and delayed runs do not use up the limit.
  local due_read = (lim.flow or lim.fair) and limit + 64 or limit
  local leases = read('ZRANGE', KEYS[2], 0, limit, 'WITHSCORES')
  local due = read('ZRANGE', KEYS[1], 0, due_read, 'WITHSCORES')
  p.admit = cap_admitter(p, call, lim)
  expect(KEYS[3], 'zset')
  p.orphans = read('ZRANGE', KEYS[6], 0, ORPHANS_PER_CALL - 1, 'WITHSCORES')
  p.stats = counters(KEYS[4], 'claimed', 'lease_expired', 'dead')
  p.fences = fence_counter(KEYS[5])
  p.log = event_log(call.prefix)

  local taking = take_expired(p, call, leases, 0) -- 1.
  p.handled, p.unhint, p.rehint, p.hinted = {}, {}, {}, {}
  local hint_count = read('ZCARD', KEYS[10]) -- read whatever happens: step 3 may write it
  if lim.fair then taking = ring_take(p, call, taking) end -- 1b.
  taking = take_hinted(p, call, taking, hint_count) -- 2.
  taking = take_due(p, call, due, due_read, taking) -- 3.
  caps_settle(p, call)
  orphans_plan(p, call) -- 4.
  -- A buried run others wait on goes to the outbox (finish_record in lib/workflows.lua).
  for _, run in ipairs(p.bury) do
    run.outbox = outbox_entry(KEYS[12], run, run.id, now)
  end
  return p
end)
if not ok then return plan end
if plan.paused then return {now, -1, 0} end
if plan.full then return {now, plan.next_wake, 0} end

-- -- phase 2: write ---------------------------------------------------------------------------

local out, fences, new_leases, next_lease_added = lease_runs(plan, call)
log_claims(call, plan.rate_w, fences)
-- Leases are added before any is removed: the leases key is never emptied and then written
-- in one call (on a node migrating the slot, a write to a missing key is refused).
if #new_leases > 0 then bulk('ZADD', KEYS[2], new_leases, 2000) end
if #plan.rehint > 0 then bulk('ZADD', KEYS[10], plan.rehint, 2000) end
-- Runs of a full group: parked, their due score a fallback recheck later.
local recheck = now + call.default_lease
if plan.flow then set_aside(plan, call, recheck) end
-- The ring: group queues, then the groups' places, then the runs adopted into their group and
-- those unparked (free_slots): ZADD LT brings a group's next look earlier than its place says.
-- Removals come after all of these (a key emptied here is not written again), and spare what
-- they put in: a group found empty that got a run in this call stays in gwait.
local entered = {} -- run_id -> the group it entered in this call
if plan.ring then ring_write(plan, call, entered) end
local unparked = plan.freer and unpark_freed(plan, call, entered) or 0
if plan.ring then ring_tidy(plan, call, entered) end
caps_tidy(plan, call)
local died = bury_runs(plan, call)
orphans_write(plan, call)

-- Removals last (a key emptied here is not written again). Leases that expired and were
-- taken again were re-added above with their new expiry.
if #plan.handled > 0 then bulk('ZREM', KEYS[1], plan.handled, 1000) end
if #plan.unhint > 0 then bulk('ZREM', KEYS[10], plan.unhint, 1000) end
for _, dkey in ipairs(plan.undedupe) do redis.call('DEL', dkey) end
drop_leases(plan, call)
orphans_settle(plan, call)
trim_index(KEYS[3], now, call.dead_retention)

bump(plan.stats, 'claimed', #plan.take)
bump(plan.stats, 'lease_expired', plan.expired)
bump(plan.stats, 'dead', died)
trim_events(plan.log)

-- The next wake-up, from what phase 1 read: the first index entries not handled, the leases
-- just granted, the orphans put back.
local next_wake = -1
local function earlier(t) if t and (next_wake < 0 or t < next_wake) then next_wake = t end end
earlier(plan.next_due)
earlier(plan.next_lease)
earlier(next_lease_added)
for _, r in ipairs(plan.later or {}) do earlier(r.due) end
if plan.park and #plan.park > 0 then earlier(recheck) end
if unparked > 0 then earlier(now) end
if plan.ring then ring_wake(plan, earlier, now) end
for _, r in ipairs(plan.restore) do earlier(r[2]) end

local result = {now, next_wake, #plan.take}
for i = 1, #out do result[#result + 1] = out[i] end
return result
