"""The Lua scripts behind every lock operation, each one round trip.

Every script lists the keys and arguments it takes and what it returns. The key layout
they assume is built by :class:`django_distlock.engine.keys.LockKeys`: all keys of one
lock share a Redis Cluster hash tag, so a script only ever touches one slot (the
listing index aside, see ``LockKeys.index``).

The lock key holds one string, ``token \\n fence \\n acquired_at_us \\n lease_ms \\n
owner_json``, so acquiring is a single ``SET ... PX`` and a holder check is a prefix
comparison.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

__all__ = [
    "ACQUIRE",
    "EXTEND",
    "PASS_ON",
    "RELEASE",
    "TTL",
    "Script",
]


@dataclass(frozen=True)
class Script:
    """A Lua script and its SHA1, so callers can ``EVALSHA`` and fall back to ``EVAL``."""

    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())  # noqa: S324


# Shared Lua fragments. `now_ms`/`now_us` come from the server clock so that every
# client agrees on time regardless of its own clock.
_NOW = """
local now = redis.call('TIME')
local now_us = now[1] .. string.format('%06d', now[2])
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
"""

# Drops fair waiters that stopped refreshing their place; returns the first live one.
# Wakes exactly one waiter: the first live fair waiter if there is a queue, otherwise
# whoever blocks first on the shared signal list. The list holds at most one element so
# that a burst of releases cannot turn into a burst of futile retries.
_QUEUE_FUNCTIONS = """
local function queue_head()
  while true do
    local head = redis.call('LINDEX', KEYS[5], 0)
    if not head then return false end
    local alive_until = redis.call('ZSCORE', KEYS[6], head)
    if alive_until and tonumber(alive_until) > now_ms then return head end
    redis.call('LPOP', KEYS[5])
    redis.call('ZREM', KEYS[6], head)
    redis.call('DEL', KEYS[7] .. head)
  end
end
local function wake_one(signal_ms)
  if redis.call('EXISTS', KEYS[3]) == 0 then return end
  local head = queue_head()
  if head then
    redis.call('RPUSH', KEYS[7] .. head, '1')
    redis.call('PEXPIRE', KEYS[7] .. head, signal_ms)
  else
    redis.call('DEL', KEYS[8])
    redis.call('RPUSH', KEYS[8], '1')
    redis.call('PEXPIRE', KEYS[8], signal_ms)
  end
end
"""

_KEYS_DOC = """
-- KEYS[1] lock          KEYS[2] fence counter   KEYS[3] "someone waits" flag
-- KEYS[4] listing index  KEYS[5] fair queue (list of waiter ids)
-- KEYS[6] fair waiters' liveness deadlines (zset, server ms)
-- KEYS[7] prefix of a fair waiter's own wake-up list (+ waiter id)
-- KEYS[8] shared wake-up list of unfair waiters
"""

ACQUIRE = Script(
    "acquire",
    "-- acquire: take the lock if it is free (and, for fair locks, it is our turn)."
    + _KEYS_DOC
    + """
-- ARGV[1] token            ARGV[2] lease ms          ARGV[3] owner metadata (JSON)
-- ARGV[4] lock name (index member)                    ARGV[5] fence counter lifetime ms
-- ARGV[6] waiter id, '' when the caller will not wait  ARGV[7] waiter liveness ms
-- ARGV[8] '1' for a fair lock, '0' otherwise
-- returns {1, fence, acquired_at_us} when taken;
--         {0, wait_ms} when not, wait_ms = how long the current obstacle lasts at most
--         (the holder's PTTL, -1 if unknown)
"""
    + _NOW
    + _QUEUE_FUNCTIONS
    + """
local waiter = ARGV[6]
local fair = ARGV[8] == '1'
local head = false
if fair then head = queue_head() end
local pttl = redis.call('PTTL', KEYS[1])
local my_turn = (not fair) or (not head) or head == waiter
if pttl == -2 and my_turn then
  if fair and head then
    redis.call('LPOP', KEYS[5])
    redis.call('ZREM', KEYS[6], waiter)
    redis.call('DEL', KEYS[7] .. waiter)
  end
  local fence = redis.call('INCR', KEYS[2])
  if fence == 1 then
    -- Counter missing (first use, expiry or data loss): seed from the server clock in
    -- microseconds so fences keep increasing across resets.
    fence = tonumber(now_us)
    redis.call('SET', KEYS[2], now_us)
  end
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
  local lease = tonumber(ARGV[2])
  redis.call('SET', KEYS[1],
    ARGV[1] .. '\\n' .. string.format('%.0f', fence) .. '\\n' .. now_us .. '\\n'
      .. ARGV[2] .. '\\n' .. ARGV[3],
    'PX', lease)
  redis.call('ZADD', KEYS[4], now_ms + lease, ARGV[4])
  return {1, fence, tonumber(now_us)}
end
local wait_ms = pttl
if waiter ~= '' then
  local liveness = tonumber(ARGV[7])
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
  redis.call('PEXPIRE', KEYS[7] .. head, ARGV[7])
  wait_ms = tonumber(redis.call('ZSCORE', KEYS[6], head)) - now_ms
end
return {0, wait_ms}
""",
)

RELEASE = Script(
    "release",
    "-- release: delete the lock if it holds this token, then wake one waiter."
    + _KEYS_DOC
    + """
-- ARGV[1] token  ARGV[2] lock name (index member)  ARGV[3] wake-up signal lifetime ms
-- returns 1 when released, 0 when the lock is not held with this token
"""
    + _NOW
    + _QUEUE_FUNCTIONS
    + """
local value = redis.call('GET', KEYS[1])
if not value or string.sub(value, 1, #ARGV[1] + 1) ~= ARGV[1] .. '\\n' then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[4], ARGV[2])
wake_one(tonumber(ARGV[3]))
return 1
""",
)

EXTEND = Script(
    "extend",
    """-- extend: change the lease of a lock held with this token.
-- KEYS[1] lock  KEYS[2] listing index
-- ARGV[1] token  ARGV[2] milliseconds  ARGV[3] lock name (index member)
-- ARGV[4] mode: 'add' (PTTL + ms), 'set' (exactly ms), 'renew' (at least ms: a watchdog
--         renewal must never shorten a lease the holder extended)
-- returns the new PTTL in ms, or -2 when the lock is not held with this token
local value = redis.call('GET', KEYS[1])
if not value or string.sub(value, 1, #ARGV[1] + 1) ~= ARGV[1] .. '\\n' then return -2 end
local ms = tonumber(ARGV[2])
local pttl = redis.call('PTTL', KEYS[1])
local new_ms = ms
if ARGV[4] == 'add' then
  new_ms = pttl + ms
elseif ARGV[4] == 'renew' then
  new_ms = math.max(pttl, ms)
end
redis.call('PEXPIRE', KEYS[1], new_ms)
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZADD', KEYS[2], now_ms + new_ms, ARGV[3])
return new_ms
""",
)

TTL = Script(
    "ttl",
    """-- ttl: the remaining lease of a lock held with this token.
-- KEYS[1] lock
-- ARGV[1] token
-- returns the PTTL in ms, or -2 when the lock is not held with this token
local value = redis.call('GET', KEYS[1])
if not value or string.sub(value, 1, #ARGV[1] + 1) ~= ARGV[1] .. '\\n' then return -2 end
return redis.call('PTTL', KEYS[1])
""",
)

PASS_ON = Script(
    "pass_on",
    "-- pass_on: a waiter stops waiting; hand any wake-up it consumed to the next one."
    + _KEYS_DOC
    + """
-- ARGV[1] waiter id ('' for an unfair waiter)  ARGV[2] wake-up signal lifetime ms
-- ARGV[3] '1' when the leaving waiter consumed a wake-up it will not use
-- returns 1
"""
    + _NOW
    + _QUEUE_FUNCTIONS
    + """
local waiter = ARGV[1]
if waiter ~= '' then
  redis.call('LREM', KEYS[5], 0, waiter)
  redis.call('ZREM', KEYS[6], waiter)
  redis.call('DEL', KEYS[7] .. waiter)
end
if ARGV[3] == '1' or (waiter ~= '' and redis.call('EXISTS', KEYS[1]) == 0) then
  wake_one(tonumber(ARGV[2]))
end
return 1
""",
)
