-- extend.lua: make new runs dependencies of waiting runs of one partition, in the name of a
-- dependency of theirs that has not finished (a running step adding runs to its batch: the
-- runs waiting on it wait on the new ones too, with its edge's policy).
--
-- uses: core
--
-- KEYS[1]  waiting   zset    jq:{q#p}:waiting  run_id -> creation time: the waiting runs
-- ARGV[1]  now                now ms, or '' for the server clock
-- ARGV[2]  prefix             key prefix jq:{q#p}:
-- ARGV[3]  adder              the dependency in whose name the runs are added
-- ARGV[4]  n                  how many runs are added
-- ARGV[5..] entries          n pairs: the added run's id and its queue; then the ids of
--                             the waiting runs to extend
-- Returns  one integer per waiting run, in order: 1 when it waits on the added runs (now, or
--          from an earlier call: a retried add counts each run once), 0 when it no longer
--          waits on the adder (it was released, died or was cancelled; the adder's outcome
--          was heard of; the adder is not its dependency; or there is no such run). Refused
--          whole (an error reply, nothing changed) when a field is malformed, a waiting run's
--          'left' is not a count, it would wait on more than 100,000 runs, a key is not on
--          this node or a key holds another type.
--
-- An added run's entry names its adder: '<index>|<policy>|<queue>|<adder>' (the workers' audit
-- cancels, for the waiting run, an added run never created once its adder has ended).
-- The adder still unfinished is what makes this safe: a waiting run cannot be released while
-- it waits on the adder, so the added runs are counted before the run can go. An added run
-- gets the next index in jq:{q#p}:deps:<run_id> (past the record's 'deps_n', the indexes
-- used so far) (a receiving run gets its result after the
-- others'), and 'left' goes up by the runs that were not dependencies already.

local now = clock(ARGV[1])
local prefix, adder, n = ARGV[2], ARGV[3], tonumber(ARGV[4])
local MAX_DEPENDENCIES = 100000

local ok, plan = reading(function()
  if not count(ARGV[4], 1) or 4 + 2 * n > #ARGV then
    refuse('ERR jobqueue: extend: n is a count of 1 or more, and n run pairs follow')
  end
  expect(KEYS[1], 'zset')
  local p = {runs = {}}
  for i = 5 + 2 * n, #ARGV do
    local id = ARGV[i]
    local w = {id = id, key = prefix .. 'run:' .. id, ok = false}
    local run = load_run(w.key, 'state', 'left', 'deps_n')
    if run and run.state == 'waiting' then
      w.deps_key, w.got_key = prefix .. 'deps:' .. id, prefix .. 'got:' .. id
      expect(w.deps_key, 'hash')
      expect(w.got_key, 'hash')
      local spec = read('HGET', w.deps_key, adder)
      if spec and not read('HGET', w.got_key, adder) then
        if not whole(run.left, 0) then
          refuse('ERR jobqueue: extend: run ' .. utf8_head(id, 80) .. "'s left is not a count")
        end
        w.ok = true
        w.policy = string.match(spec, '^%d+|(%a+)|') or 'fail'
        -- past every index used: a dependency named twice at creation took two
        w.next = math.max(read('HLEN', w.deps_key), whole_or(run.deps_n, 0, 0))
        w.left = tonumber(run.left)
        w.new = {}
        local named = {}
        for j = 0, n - 1 do
          local dep, queue = ARGV[5 + 2 * j], ARGV[6 + 2 * j]
          if not named[dep] and not read('HGET', w.deps_key, dep) then
            named[dep] = true
            w.new[#w.new + 1] = dep
            w.new[#w.new + 1] = int(w.next) .. '|' .. w.policy .. '|' .. queue .. '|' .. adder
            w.next, w.left = w.next + 1, w.left + 1
          end
        end
        if w.next > MAX_DEPENDENCIES then
          refuse('ERR jobqueue: extend: run ' .. utf8_head(id, 80) .. ' would wait on ' ..
                 int(w.next) .. ' runs; at most ' .. MAX_DEPENDENCIES)
        end
      end
    end
    p.runs[#p.runs + 1] = w
  end
  return p
end)
if not ok then return plan end

local out = {}
for _, w in ipairs(plan.runs) do
  if w.ok and #w.new > 0 then
    bulk('HSET', w.deps_key, w.new, 2000)
    redis.call('HSET', w.key, 'left', w.left, 'deps_n', int(w.next))
  end
  out[#out + 1] = w.ok and 1 or 0
end
return out
