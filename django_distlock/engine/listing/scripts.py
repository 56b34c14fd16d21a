"""The listing's Lua scripts: they read the listing indexes (which the lock scripts of
:mod:`..protocol.scripts` keep: a sorted set per bucket of the exclusive holds, member =
lock name, score = lease end in server ms, and one of the shared and limited holds,
member = name NUL token), never write a lock, and answer in few, long strings (one
string parses much faster than thousands of elements)."""

from __future__ import annotations

from ..protocol.ops import Script

__all__ = ["LIST_BUCKETS", "LIST_INDEX", "LIST_WINDOW"]

# Sets `now_ms` (a number) and `now_text` (it as an integer string, for score ranges)
# from the server clock.
_NOW = r"""local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
-- A key lives until its expiry time is strictly past: live entries score now or more.
local now_text = string.format('%.0f', now_ms)
"""


LIST_INDEX = Script(
    "list_index",
    r"""-- list_index: the live entries of one bucket's listing indexes, and the server time.
-- KEYS[1] the bucket's listing index (zset: member = lock name, score = lease end, ms)
-- KEYS[2] (optional) the bucket's index of shared and limited holds (zset: member =
--         name NUL token, score = that hold's lease end, ms)
-- ARGV[1] '*' for every entry, '#' to count them, '=' to look up the names in ARGV[2..]
-- returns {now_ms, entries, holds} for '*' and '=': entries = 'name\0score\0name\0score...'
--         and holds = 'name\0token\0score\0...', each in one string (names never hold
--         NUL; one string parses much faster than thousands of elements);
--         {now_ms, count, holds_count} for '#'; entries whose lease is over are left
--         out (and dropped from KEYS[1]; the scripts that add holds prune KEYS[2]), and
--         holds is '' or 0 without KEYS[2]
"""
    + _NOW
    + r"""-- Pruned, then counted: ZCOUNT would decode every score of a small (listpack) set.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now_text)
-- The holds' index is only read: one command per bucket, which servers holding
-- exclusive locks only pay too (on a missing key it costs next to nothing).
local with_holds = #KEYS > 1
if ARGV[1] == '#' then
  local holds = 0
  if with_holds then holds = redis.call('ZCOUNT', KEYS[2], now_text, '+inf') end
  return {now_ms, redis.call('ZCARD', KEYS[1]), holds}
end
local entries
local holds = {}
if with_holds then
  holds = redis.call('ZRANGEBYSCORE', KEYS[2], now_text, '+inf', 'WITHSCORES')
end
if ARGV[1] == '*' then
  entries = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
else
  entries = {}
  local wanted = {}
  for i = 2, #ARGV do
    wanted[ARGV[i]] = true
    local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
    if score then
      entries[#entries + 1] = ARGV[i]
      entries[#entries + 1] = score
    end
  end
  -- Members are 'name NUL token': keep the holds of the names looked up.
  local kept = {}
  for i = 1, #holds, 2 do
    local cut = string.find(holds[i], '\0', 1, true)
    if cut and wanted[string.sub(holds[i], 1, cut - 1)] then
      kept[#kept + 1] = holds[i]
      kept[#kept + 1] = holds[i + 1]
    end
  end
  holds = kept
end
return {now_ms, table.concat(entries, '\0'), table.concat(holds, '\0')}
""",
)

LIST_BUCKETS = Script(
    "list_buckets",
    r"""-- list_buckets: list_index for every bucket of a single server, in one call.
-- KEYS[1], KEYS[2], then each next pair: a bucket's listing index and its index of shared
--         and limited holds (as KEYS[1] and KEYS[2] of list_index)
-- ARGV[1] '*' for every entry, '#' to count them
-- returns {now_ms, entries_1, holds_1, entries_2, holds_2, ...}: per bucket what
--         list_index returns after now_ms (counts for '#'); a cluster cannot run it (its
--         buckets live in different slots), a single server answers at once what 256
--         pipelined list_index calls would
"""
    + _NOW
    + r"""local result = {now_ms}
for i = 1, #KEYS, 2 do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', '(' .. now_text)
  if ARGV[1] == '#' then
    result[#result + 1] = redis.call('ZCARD', KEYS[i])
    result[#result + 1] = redis.call('ZCOUNT', KEYS[i + 1], now_text, '+inf')
  else
    result[#result + 1] = table.concat(redis.call('ZRANGE', KEYS[i], 0, -1, 'WITHSCORES'), '\0')
    result[#result + 1] = table.concat(
      redis.call('ZRANGEBYSCORE', KEYS[i + 1], now_text, '+inf', 'WITHSCORES'), '\0')
  end
end
return result
""",
)

LIST_WINDOW = Script(
    "list_window",
    r"""-- list_window: the first live entries of bucket indexes in lease-end order, for one
-- page ordered by TTL: each index is read from its end that comes first, only as far as
-- the page needs (ZRANGE BYSCORE ... LIMIT), never whole.
-- KEYS[1], KEYS[2], then each next pair: a bucket's listing index and its index of shared
--         and limited holds (as KEYS[1] and KEYS[2] of list_index); a cluster sends one
--         pair per call, a single server every bucket's in one call
-- ARGV[1] 'asc' (soonest lease end first) or 'desc'
-- ARGV[2] how many matching entries each index answers at most
-- ARGV[3..] name lookups, each a pair: 'startswith' or 'contains', then the value (plain
--         byte comparisons; all must match; a hold's name is its member up to NUL)
-- returns {now_ms, entries_1, more_1, holds_1, more_holds_1, entries_2, ...}: per bucket
--         the entries as list_index joins them ('name\0score...', 'name\0token\0score...')
--         and 1 when that index may hold more matching entries past its last one, else 0
"""
    + _NOW
    + r"""local ascending = ARGV[1] == 'asc'
local wanted = tonumber(ARGV[2])
local lookups = {}
for i = 3, #ARGV, 2 do lookups[#lookups + 1] = {ARGV[i], ARGV[i + 1]} end
local function matches(member)
  local cut = string.find(member, '\0', 1, true)
  local name = cut and string.sub(member, 1, cut - 1) or member
  for _, lookup in ipairs(lookups) do
    if lookup[1] == 'startswith' then
      if string.sub(name, 1, #lookup[2]) ~= lookup[2] then return false end
    elseif not string.find(name, lookup[2], 1, true) then
      return false
    end
  end
  return true
end
-- The first `wanted` matching entries of KEYS[i] in lease-end order, and whether more
-- may follow. Without lookups one range is read; with them, growing ranges until enough
-- entries matched (a rare match reads the whole index).
local function first_entries(i)
  local found, offset, step = {}, 0, wanted
  if #lookups > 0 then step = math.max(wanted, 64) end
  while true do
    local got
    if ascending then
      got = redis.call('ZRANGE', KEYS[i], now_text, '+inf', 'BYSCORE', 'LIMIT', offset, step,
        'WITHSCORES')
    else
      got = redis.call('ZRANGE', KEYS[i], '+inf', now_text, 'BYSCORE', 'REV', 'LIMIT', offset,
        step, 'WITHSCORES')
    end
    for j = 1, #got, 2 do
      if #lookups == 0 or matches(got[j]) then
        found[#found + 1] = got[j]
        found[#found + 1] = got[j + 1]
        if #found == 2 * wanted then return found, 1 end
      end
    end
    if #got < 2 * step then return found, 0 end
    offset = offset + step
    step = step * 2
  end
end
local result = {now_ms}
for i = 1, #KEYS, 2 do
  local entries, more = first_entries(i)
  local holds, more_holds = first_entries(i + 1)
  result[#result + 1] = table.concat(entries, '\0')
  result[#result + 1] = more
  result[#result + 1] = table.concat(holds, '\0')
  result[#result + 1] = more_holds
end
return result
""",
)
