"""The key layout before buckets (django-distlock 0.1.0.dev0), frozen for the upgrade tests.

``ACQUIRE_SOURCE`` and ``RELEASE_SOURCE`` are that version's acquire and release scripts,
verbatim, and :func:`legacy_acquire`/:func:`legacy_release` call them with that version's
keys (``PREFIX{NAME}`` for the lock, ``PREFIXindex`` for every lock's index entry), so the
tests run the earlier version's side of a rolling deploy against this one.
"""

from __future__ import annotations

import json
import os

import redis

__all__ = ["ACQUIRE_SOURCE", "RELEASE_SOURCE", "legacy_acquire", "legacy_keys", "legacy_release"]

ACQUIRE_SOURCE = r"""-- acquire: take the lock if it is free (and, for fair locks, it is our turn).
-- KEYS[1] lock          KEYS[2] fence counter   KEYS[3] "someone waits" flag
-- KEYS[4] listing index  KEYS[5] fair queue (list of waiter ids)
-- KEYS[6] fair waiters' liveness deadlines (zset, server ms)
-- KEYS[7] prefix of a fair waiter's own wake-up list (+ waiter id)
-- KEYS[8] shared wake-up list of unfair waiters

-- ARGV[1] token            ARGV[2] lease ms          ARGV[3] owner metadata (JSON)
-- ARGV[4] lock name (index member)  ARGV[5] ms the fence counter outlives the lease
-- ARGV[6] waiter id, '' when the caller will not wait  ARGV[7] waiter liveness ms
-- ARGV[8] '1' for a fair lock, '0' otherwise
-- ARGV[9] waiter id whose outstanding BLPOP to end, '' for none
-- returns {1, fence, acquired_at_us} when taken (or already held with this token);
--         {0, wait_ms} when not, wait_ms = how long the current obstacle lasts at most
--         (the holder's PTTL, -1 if unknown)
local end_wait = ARGV[9]
local liveness_ms = ARGV[7]
local function attempt()
  local pttl = -2
  local value = redis.call('GET', KEYS[1])
  if value then
    if string.sub(value, 1, #ARGV[1] + 1) == ARGV[1] .. '\n' then
      -- Already ours: a request retried after its reply was lost. Answer as before.
      local fence, acquired_at = string.match(value, '^[^\n]*\n([^\n]*)\n([^\n]*)\n')
      return {1, fence, acquired_at}
    end
    pttl = redis.call('PTTL', KEYS[1])
  end
  local waiter = ARGV[6]
  local fair = ARGV[8] == '1'
  if pttl ~= -2 and waiter == '' then return {0, pttl} end

  local now = redis.call('TIME')
  local now_us = now[1] .. string.sub('00000' .. now[2], -6)
  local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)

  local head = false
  if fair then
  while true do
    head = redis.call('LINDEX', KEYS[5], 0)
    if not head then break end
    local alive_until = redis.call('ZSCORE', KEYS[6], head)
    if alive_until and tonumber(alive_until) > now_ms then break end
    redis.call('LPOP', KEYS[5])
    redis.call('ZREM', KEYS[6], head)
    redis.call('DEL', KEYS[7] .. head)
    head = false
  end

  end
  if pttl == -2 and (not head or head == waiter) then
    if head then
      redis.call('LPOP', KEYS[5])
      redis.call('ZREM', KEYS[6], waiter)
      redis.call('DEL', KEYS[7] .. waiter)
    end
    -- The fence is the larger of the stored counter + 1 and the server clock in
    -- microseconds: it keeps increasing on one server while the counter lives, and
    -- across data loss or failover as long as server clocks agree.
    local fence = tonumber(now_us)
    local stored = redis.call('GET', KEYS[2])
    if stored then fence = math.max(fence, tonumber(stored) + 1) end
    fence = string.format('%.0f', fence)
    local lease_ms = tonumber(ARGV[2])
    redis.call('SET', KEYS[2], fence, 'PX', lease_ms + tonumber(ARGV[5]))
    redis.call('SET', KEYS[1],
      ARGV[1] .. '\n' .. fence .. '\n' .. now_us .. '\n' .. ARGV[2] .. '\n' .. ARGV[3],
      'PX', lease_ms)
    -- Entries of locks that expired without a release go at the next acquire.
    redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. string.format('%.0f', now_ms))
    redis.call('ZADD', KEYS[4], now_ms + lease_ms, ARGV[4])
    return {1, fence, now_us}
  end
  local wait_ms = pttl
  if waiter ~= '' then
    local liveness = tonumber(liveness_ms)
    if fair then
      if not redis.call('ZSCORE', KEYS[6], waiter) then
        redis.call('RPUSH', KEYS[5], waiter)
        if not head then head = waiter end
      end
      redis.call('ZADD', KEYS[6], now_ms + liveness, waiter)
      redis.call('PEXPIRE', KEYS[5], liveness)
      redis.call('PEXPIRE', KEYS[6], liveness)
    end
    local flag_ms = liveness
    if pttl > 0 then flag_ms = flag_ms + pttl end
    redis.call('SET', KEYS[3], '1', 'PX', flag_ms)
  end
  if pttl == -2 then
    -- Free, but another fair waiter is first: nudge it in case it missed its wake-up,
    -- and come back when its place would lapse.
    redis.call('RPUSH', KEYS[7] .. head, '1')
    redis.call('PEXPIRE', KEYS[7] .. head, liveness_ms)
    wait_ms = tonumber(redis.call('ZSCORE', KEYS[6], head)) - now_ms
  end
  return {0, wait_ms}
end
local result = attempt()

if end_wait ~= '' then
  redis.call('RPUSH', KEYS[7] .. end_wait, 'c')
  redis.call('PEXPIRE', KEYS[7] .. end_wait, liveness_ms)
end

return result
"""

RELEASE_SOURCE = r"""-- release: delete the lock if it holds this token, then wake one waiter.
-- KEYS[1] lock          KEYS[2] fence counter   KEYS[3] "someone waits" flag
-- KEYS[4] listing index  KEYS[5] fair queue (list of waiter ids)
-- KEYS[6] fair waiters' liveness deadlines (zset, server ms)
-- KEYS[7] prefix of a fair waiter's own wake-up list (+ waiter id)
-- KEYS[8] shared wake-up list of unfair waiters

-- ARGV[1] token  ARGV[2] lock name (index member)  ARGV[3] wake-up signal lifetime ms
-- returns 1 when released, 0 when the lock is not held with this token

local value = redis.call('GET', KEYS[1])
if not value or string.sub(value, 1, #ARGV[1] + 1) ~= ARGV[1] .. '\n' then return 0 end

redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[4], ARGV[2])
local signal_ms = ARGV[3]

if redis.call('EXISTS', KEYS[3]) == 1 then
  local head = false
  local now = redis.call('TIME')
  local now_us = now[1] .. string.sub('00000' .. now[2], -6)
  local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)

  while true do
    head = redis.call('LINDEX', KEYS[5], 0)
    if not head then break end
    local alive_until = redis.call('ZSCORE', KEYS[6], head)
    if alive_until and tonumber(alive_until) > now_ms then break end
    redis.call('LPOP', KEYS[5])
    redis.call('ZREM', KEYS[6], head)
    redis.call('DEL', KEYS[7] .. head)
    head = false
  end

  if head then
    redis.call('RPUSH', KEYS[7] .. head, '1')
    redis.call('PEXPIRE', KEYS[7] .. head, signal_ms)
  else
    redis.call('DEL', KEYS[8])
    redis.call('RPUSH', KEYS[8], '1')
    redis.call('PEXPIRE', KEYS[8], signal_ms)
  end
end

return 1
"""


def legacy_keys(prefix: str, name: str) -> tuple[str, ...]:
    """The eight keys 0.1.0.dev0's scripts took for lock ``name``."""
    lock = prefix + "{" + name.replace("%", "%25").replace("{", "%7B").replace("}", "%7D") + "}"
    return (
        lock,
        f"{lock}:fence",
        f"{lock}:waiters",
        f"{prefix}index",
        f"{lock}:queue",
        f"{lock}:queue-deadlines",
        f"{lock}:wake:",
        f"{lock}:signal",
    )


def legacy_acquire(
    client: redis.Redis, prefix: str, name: str, token: str, lease_ms: int
) -> list[object]:
    """Try to take ``name`` as 0.1.0.dev0 did (non-blocking, unfair): its script's reply
    (``[1, fence, acquired_at_us]`` when taken); a refused script raises."""
    owner = json.dumps(
        {
            "host": "old",
            "pid": os.getpid(),
            "thread": "MainThread",
            "context": "",
            "auto_renew": False,
        }
    )
    return client.eval(  # type: ignore[no-any-return]
        ACQUIRE_SOURCE,
        8,
        *legacy_keys(prefix, name),
        token,
        lease_ms,
        owner,
        name,
        3_600_000,
        "",
        3000,
        "0",
        "",
    )


def legacy_release(client: redis.Redis, prefix: str, name: str, token: str) -> int:
    """Release ``name`` as 0.1.0.dev0 did: 1 when it held ``token``."""
    return int(client.eval(RELEASE_SOURCE, 8, *legacy_keys(prefix, name), token, name, 3000))
