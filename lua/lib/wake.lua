-- lib/wake.lua: waking idle workers (the one wake policy).
--
-- uses: core
--
-- Provides:
--   waker(key) -> w (phase 1: a wake list and its room; nil for a key of another type)
--   wake(w, runs) (phase 2: one token per run, never more than WAKE_TOKENS in the list)

local WAKE_TOKENS = 8  -- a wake list never holds more: enough for several idle workers

-- A wake list and the room left in it, for wake(); nil when its key holds another type (no
-- wake-up then).
local function waker(key)
  local n, foreign = checked(redis.pcall('LLEN', key), key, true)
  if foreign then return nil end
  return {key = key, room = WAKE_TOKENS - n}
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
