-- index_page.lua: a page of one partition's run index (due, leases, waiting, dead or done) in
-- (score, member) order, from just after a place, within a score range (read only). A
-- listing pages through an index by its last entry's (score, member) instead of a rank, so a
-- run that stays in the index is listed once even while others come and go; a place whose
-- run has left is found again by binary search among the entries of its score (a bulk
-- enqueue gives thousands the same due time): O(log n) reads, never a scan.
--
-- Flags: no-writes (it runs on a replica and under OOM)
--
-- uses: core
--
-- KEYS[1]  index     zset    jq:{q#p}:<due|leases|waiting|dead|done>
-- ARGV[1]  now                now ms, or '' for the server clock (not used: by convention)
-- ARGV[2]  order              'asc' (lowest score first) or 'desc'
-- ARGV[3]  low                the lowest score listed ('-inf': no bound)
-- ARGV[4]  high               the highest score listed ('+inf': no bound)
-- ARGV[5]  after_score        the place, its score; '' to start at the range's start
-- ARGV[6]  after_member       the place, its member
-- ARGV[7]  inclusive          '1': an entry at the place itself is listed (the place was
--                             another queue's run of the same id and score), '0': not
-- ARGV[8]  count              at most this many entries (1 to 10,000)
-- Returns  {in_range, member_1, score_1, ..., member_n, score_n}: how many entries the range
--          holds, then the page in the order asked; false when the index holds another
--          type (the caller reports it). Refused whole (an error reply) for a bad argument or
--          a key not on this node.

local _ = clock(ARGV[1])
local key, order, low, high = KEYS[1], ARGV[2], ARGV[3], ARGV[4]
local after_score, after_member = ARGV[5], ARGV[6]
local inclusive, want = ARGV[7] == '1', tonumber(ARGV[8])

-- Members in the order Redis keeps them: bytewise (Lua's < follows the server's locale).
local function bytes_less(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

local ok, out = reading(function()
  if order ~= 'asc' and order ~= 'desc' then refuse('ERR jobqueue: order is asc or desc') end
  if not tonumber(low) or not tonumber(high) then
    refuse('ERR jobqueue: low and high are scores')
  end
  if not whole(want, 1) or want > 10000 then
    refuse('ERR jobqueue: count is 1 to 10000')
  end
  local kind = read('TYPE', key)
  kind = type(kind) == 'table' and kind.ok or kind
  if kind ~= 'zset' and kind ~= 'none' then return false end
  -- Ranks, ascending: [first, last] holds the range.
  local first = read('ZCOUNT', key, '-inf', '(' .. low)
  local last = read('ZCOUNT', key, '-inf', high) - 1
  local in_range = math.max(0, last - first + 1)
  if after_score ~= '' then
    local s = tonumber(after_score)
    if not s then refuse('ERR jobqueue: after_score is a score') end
    -- below: how many entries come before the place; at: whether the place is an entry.
    local below = read('ZCOUNT', key, '-inf', '(' .. after_score)
    local ties = read('ZCOUNT', key, after_score, after_score)
    local at = false
    if ties > 0 then
      local own = read('ZSCORE', key, after_member)
      if own and tonumber(own) == s then
        below, at = read('ZRANK', key, after_member), true
      else
        local lo, hi = below, below + ties
        while lo < hi do
          local mid = math.floor((lo + hi) / 2)
          local m = read('ZRANGE', key, mid, mid)[1]
          if bytes_less(m, after_member) then lo = mid + 1 else hi = mid end
        end
        below = lo
      end
    end
    if order == 'asc' then
      first = math.max(first, (at and not inclusive) and below + 1 or below)
    else
      last = math.min(last, (at and inclusive) and below or below - 1)
    end
  end
  local reply = {in_range}
  if first > last then return reply end
  local from, to = first, math.min(last, first + want - 1)
  if order == 'desc' then from, to = math.max(first, last - want + 1), last end
  local page = read('ZRANGE', key, from, to, 'WITHSCORES')
  local n = #page / 2
  for i = 1, n do
    local j = order == 'asc' and i or n + 1 - i
    reply[#reply + 1] = page[2 * j - 1]
    reply[#reply + 1] = page[2 * j]
  end
  return reply
end)
return out
