-- lib/limits.lua: a partition's flow limits as claim.lua reads them (the limits hash,
-- set_limit.lua), the room they leave a claim, and the rate limit's log.
--
-- uses: core, groups, slots, records
--
-- Provides (`call`: claim.lua's context):
--   claim_limits(call) -> lim (phase 1): the limits hash's fields read; call.limit lowered to
--     the room the partition's limits leave; lim.full with lim.next_wake when there is none.
--     A concurrency limit C counts the live leases (expiry after now): the call takes at most
--     C minus those, expired leases taken back included; with no room, next_wake is the
--     earliest live lease expiry (a slot is free by then at the latest; a commit frees one
--     sooner). A rate limit 'N W' counts the claims of the last W ms (KEYS claims: fence ->
--     claim time; expired leases taken back included): the call takes at most N minus those,
--     and with no room next_wake is when the oldest of them leaves the window. A limit field
--     that is not a whole number (rate: two) counts as no limit. lim also carries the per-key
--     and per-task fields (kcap, krate_n, krate_w, task_capped; lim.flow: any of them, see
--     lib/caps.lua) and lim.fair (fair shares on, lib/ring.lua).
--   log_claims(call, rate_w, fences) (phase 2): the rate limit's log, one entry per claim by
--     its fence (unique in the partition), trimmed to the window.

local function claim_limits(call)
  local now, limit = call.now, call.limit
  local prefix = call.prefix
  local limits = read('HMGET', call.limits, 'concurrency', 'rate', 'key_concurrency', 'key_rate',
                      'task_caps')
  local cap = limits[1]
  local rate_n, rate_w = string.match(limits[2] or '', '^(%d+) (%d+)$')
  local rated = count(rate_n, 0) and count(rate_w, 1)
  local kcap = count(limits[3], 0) and tonumber(limits[3]) <= SLOT_CAP_MAX and
               tonumber(limits[3]) or nil
  local krate_n, krate_w = string.match(limits[4] or '', '^(%d+) (%d+)$')
  if count(krate_n, 0) and count(krate_w, 1) then
    krate_n, krate_w = tonumber(krate_n), tonumber(krate_w)
  else
    krate_n, krate_w = nil, nil
  end
  local task_capped = count(limits[5], 1)
  local flow = kcap or krate_n or task_capped
  local fair = fair_partition(prefix)
  if count(cap, 0) then
    -- Live leases hold a slot each; expired ones free theirs (taken back below, they count
    -- as new claims against the room).
    local live = read('ZCOUNT', call.leases, '(' .. int(now), '+inf')
    local room = tonumber(cap) - live
    if room <= 0 then
      local first = read('ZRANGE', call.leases, '(' .. int(now), '+inf', 'BYSCORE', 'LIMIT', 0, 1,
                         'WITHSCORES')
      return {full = true, next_wake = whole_or(first[2], 0, -1)} -- no score 'inf' in a reply
    end
    if room < limit then limit = room end
  end
  if rated then
    local since = '(' .. int(now - tonumber(rate_w))
    local room = tonumber(rate_n) - read('ZCOUNT', call.claims, since, '+inf')
    if room <= 0 then
      local first = read('ZRANGE', call.claims, since, '+inf', 'BYSCORE', 'LIMIT', 0, 1,
                         'WITHSCORES')
      local oldest = whole_or(first[2], 0, nil)
      return {full = true, next_wake = oldest and oldest + tonumber(rate_w) or -1}
    end
    if room < limit then limit = room end
  end
  call.limit = limit
  return {flow = flow, fair = fair, kcap = kcap, krate_n = krate_n, krate_w = krate_w,
          task_capped = task_capped, rate_w = rated and tonumber(rate_w) or nil}
end

local function log_claims(call, rate_w, taken_fences)
  local now = call.now
  if rate_w and #taken_fences > 0 then
    -- The rate limit's log: one entry per claim, by its fence (unique in the partition).
    local entries = {}
    for _, fence in ipairs(taken_fences) do
      entries[#entries + 1] = now
      entries[#entries + 1] = int(fence)
    end
    bulk('ZADD', call.claims, entries, 2000)
    trim_index(call.claims, now, rate_w)
    -- The key's expiry runs on the server's clock: set only when the window does too (a caller's
    -- clock, ARGV[1], would let the log vanish before its window ends); the trim bounds it.
    if call.server_clock then redis.call('PEXPIRE', call.claims, rate_w) end
  end
end
