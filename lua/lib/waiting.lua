-- lib/waiting.lua: a waiting run hears of its dependencies (deliver.lua, complete.lua).
--
-- uses: core, records, sequence, events, workflows, bury
--
-- Provides:
--   waiting_plan(prefix, id) -> w; waiting_hear(w, dep, outcome) -> 0 or 1;
--   waiting_settle(w, ctx) (phase 1); waiting_write(w, ctx) -> what w became (phase 2)

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
-- released (its payload built now), kept (staged: its workflow not committed yet, see
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
