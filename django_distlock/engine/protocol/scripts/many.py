"""The script taking several names at once (one bucket's, atomically)."""

from __future__ import annotations

from .lua import NOW, Script

__all__ = ["MANY_ACQUIRE"]


MANY_ACQUIRE = Script(
    "many_acquire",
    r"""-- many_acquire: take several locks at once, exclusively, all or none.
-- KEYS[5i-4..5i] of the i-th lock (KEYS[1] to KEYS[5] for the first): the lock, its
--   fence counter, its "someone waits" flag, its bucket's listing index and its waiting
--   writers (zset)
-- KEYS[#KEYS] the caller's own wake-up list for the lock it waits on (ending its
--   outstanding BLPOP), or any of the locks' keys
-- ARGV[1] token  ARGV[2] lease ms  ARGV[3] owner metadata (JSON)
-- ARGV[4] ms a fence counter outlives the lease  ARGV[5] waiter liveness ms, '' when
--   the caller will not wait  ARGV[6] '1' to end the caller's outstanding BLPOP
-- ARGV[7] waiter id, '' when the caller will not wait
-- ARGV[8..] the locks' names, in the order of their keys
-- returns {'taken', acquired_at_us, fence1, fence2, ...} when all were free (or already
--         held with this token) and are taken (the caller is off every lock's writers);
--         {'busy', wait_ms, i, writer} when the i-th lock is held by someone else (wait_ms:
--         its remaining lease, -1 if unknown); writer = '1' when it is held shared and
--         the caller now waits among its writers, who go before new shared holders
--         (PASS_ON takes it off); nothing is taken
local count = (#KEYS - 1) / 5
local token = ARGV[1]
local waiter = ARGV[7]
local function attempt()
  local mine = 0
  for i = 1, count do
    local value = redis.pcall('GET', KEYS[5 * i - 4])
    if type(value) == 'string' and string.sub(value, 1, #token + 1) == token .. '\n' then
      mine = mine + 1
    elseif value then
      -- Held by someone else (a string), or shared or limited holds (a sorted set,
      -- GET refused it): the caller waits for this one.
      local pttl = redis.call('PTTL', KEYS[5 * i - 4])
      local writer = ''
      if ARGV[5] ~= '' then
        local flag_ms = tonumber(ARGV[5])
        if pttl > 0 then flag_ms = flag_ms + pttl end
        redis.call('SET', KEYS[5 * i - 2], '1', 'PX', flag_ms)
        if type(value) == 'table' and waiter ~= '' then
          -- Held shared: wait as a writer, so that new shared holders let us go first.
          local time = redis.call('TIME')
          local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
          local liveness = tonumber(ARGV[5])
          redis.call('ZADD', KEYS[5 * i], now_ms + liveness, waiter)
          redis.call('PEXPIRE', KEYS[5 * i], liveness)
          writer = '1'
        end
      end
      return {'busy', pttl, i, writer}
    end
  end"""
    + NOW
    + r"""
  local result = {'taken', now_us}
  local lease_ms = tonumber(ARGV[2])
  for i = 1, count do
    local fence
    if waiter ~= '' then redis.call('ZREM', KEYS[5 * i], waiter) end
    if mine == count then
      -- Already ours: a request retried after its reply was lost. Answer as before.
      local value = redis.call('GET', KEYS[5 * i - 4])
      fence = string.match(value, '^[^\n]*\n([^\n]*)\n')
      result[2] = string.match(value, '^[^\n]*\n[^\n]*\n([^\n]*)\n')
    else
      fence = tonumber(now_us)
      local stored = redis.call('GET', KEYS[5 * i - 3])
      if stored then fence = math.max(fence, tonumber(stored) + 1) end
      fence = string.format('%.0f', fence)
      redis.call('SET', KEYS[5 * i - 3], fence, 'PX', lease_ms + tonumber(ARGV[4]))
      redis.call('SET', KEYS[5 * i - 4],
        token .. '\n' .. fence .. '\n' .. now_us .. '\n' .. ARGV[2] .. '\n' .. ARGV[3],
        'PX', lease_ms)
      redis.call('ZREMRANGEBYSCORE', KEYS[5 * i - 1], '-inf',
        '(' .. string.format('%.0f', now_ms))
      redis.call('ZADD', KEYS[5 * i - 1], now_ms + lease_ms, ARGV[7 + i])
    end
    result[#result + 1] = fence
  end
  return result
end
local result = attempt()
if ARGV[6] == '1' then
  redis.call('RPUSH', KEYS[#KEYS], 'c')
  redis.call('PEXPIRE', KEYS[#KEYS], ARGV[5])
end
return result
""",
)
