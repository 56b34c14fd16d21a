"""The ``Script`` type and the Lua fragments the scripts share (the clock, the fair queue,
the wake-up, pruning holders, the next fence), spliced into the branches that need them:
the common paths (free lock, nobody waiting) run no more commands than they must."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

__all__ = [
    "END_WAIT",
    "EXPIRE_HOLDERS",
    "IS_MINE",
    "KEYS_DOC",
    "NEXT_FENCE",
    "NOW",
    "PRUNE_HOLDERS",
    "QUEUE_HEAD",
    "RUN_ATTEMPT",
    "TAKE_TURN",
    "WAKE_ONE",
    "Script",
    "enqueue",
    "is_mine",
    "take_if_free",
]


@dataclass(frozen=True)
class Script:
    """A Lua script and its SHA1, so callers can ``EVALSHA`` and fall back to ``EVAL``."""

    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())  # noqa: S324


# Sets `now_us` (a string) and `now_ms` (a number) from the server clock, so that
# every client agrees on time whatever its own clock says.
NOW = r"""
  local now = redis.call('TIME')
  local now_us = now[1] .. string.sub('00000' .. now[2], -6)
  local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
"""

# Drops fair waiters that stopped confirming their place (their own lists expire by
# themselves); sets `head` (a local the including script declares, so that it outlives
# the block this is spliced into) to the first live one, or false.
QUEUE_HEAD = r"""
  while true do
    head = redis.call('LINDEX', KEYS[5], 0)
    if not head then break end
    local alive_until = redis.call('ZSCORE', KEYS[6], head)
    if alive_until and tonumber(alive_until) > now_ms then break end
    redis.call('LPOP', KEYS[5])
    redis.call('ZREM', KEYS[6], head)
    head = false
  end
"""

# Wakes exactly one waiter (needs `signal_ms`); sets `woken_head` to the first live fair
# waiter, whom the caller wakes (its list is not among our keys), or pushes to the shared
# signal list of unfair waiters. That list holds at most one element so that a burst of
# releases cannot become a burst of futile retries.
WAKE_ONE = (
    r"""
if redis.call('EXISTS', KEYS[3]) == 1 then
  local head = false"""
    + NOW
    + QUEUE_HEAD
    + r"""
  if head then
    woken_head = head
  else
    redis.call('DEL', KEYS[8])
    redis.call('RPUSH', KEYS[8], '1')
    redis.call('PEXPIRE', KEYS[8], signal_ms)
  end
end
"""
)

KEYS_DOC = r"""
-- KEYS[1] lock          KEYS[2] fence counter   KEYS[3] "someone waits" flag
-- KEYS[4] the bucket's listing index  KEYS[5] fair queue (list of waiter ids)
-- KEYS[6] fair waiters' liveness deadlines (zset, server ms)
-- KEYS[7] the caller's own wake-up list, for calls that end its wait or its place in
--         the queue (else the shared signal list: it is not touched then)
-- KEYS[8] shared wake-up list of unfair waiters
-- KEYS[9] holders of a shared or limited lock (hash)  KEYS[10] waiting writers (zset)
"""

# pcall: a lock held shared or limited is a sorted set, which GET refuses.
IS_MINE = r"""
local value = redis.pcall('GET', KEYS[1])
if type(value) ~= 'string' or string.sub(value, 1, #ARGV[1] + 1) ~= ARGV[1] .. '\n' then
  return NOT_MINE
end
"""


# Sets `fence` (a string) to the larger of the stored counter + 1 and the server clock in
# microseconds, and stores it back for the lease plus ARGV[5] ms (needs `now_us` and
# `lease_ms`): fences keep increasing on one server while the counter lives, and across
# data loss or failover as long as server clocks agree. One command when the clock is
# ahead of the counter (always, unless the clock stepped back): SET ... GET stores the
# clock and reads the counter it replaced.
NEXT_FENCE = r"""
    local fence_ttl = lease_ms + tonumber(ARGV[5])
    local fence = now_us
    local stored = redis.call('SET', KEYS[2], now_us, 'PX', fence_ttl, 'GET')
    if stored and tonumber(stored) >= tonumber(now_us) then
      fence = string.format('%.0f', tonumber(stored) + 1)
      redis.call('SET', KEYS[2], fence, 'PX', fence_ttl)
    end
"""

# Shared and limited holds: drops the holders whose lease is over; sets `held` to how many
# are left (0: both keys are gone). KEYS[1] must be a sorted set (or missing).
PRUNE_HOLDERS = r"""
  local expired_below = '(' .. string.format('%.0f', now_ms)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', expired_below)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', expired_below)
    redis.call('HDEL', KEYS[9], unpack(gone))
  end
  held = redis.call('ZCARD', KEYS[1])
  if held == 0 then redis.call('DEL', KEYS[1], KEYS[9]) end
"""

# Both keys of shared or limited holds live until the last holder's lease end.
EXPIRE_HOLDERS = r"""
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if last[2] then
    local keep_ms = math.max(1, tonumber(last[2]) - now_ms)
    redis.call('PEXPIRE', KEYS[1], keep_ms)
    redis.call('PEXPIRE', KEYS[9], keep_ms)
  end
"""


def is_mine(not_mine: str) -> str:
    return IS_MINE.replace("NOT_MINE", not_mine)


# A fair waiter whose turn it is (`head == waiter`) leaves the queue as it takes the lock.
TAKE_TURN = r"""
    if head then
      redis.call('LPOP', KEYS[5])
      redis.call('ZREM', KEYS[6], waiter)
    end"""


def enqueue(obstacle_ms: str) -> str:
    """A waiter that did not get the lock registers (needs `waiter`, `fair`, `head`,
    `now_ms`, `liveness`): at the back of the fair queue with a liveness deadline when
    fair, and in the "someone waits" flag, kept for its liveness plus the Lua variable
    ``obstacle_ms`` (how long the obstacle lasts, when positive)."""
    return (
        r"""
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
    if OBSTACLE > 0 then flag_ms = flag_ms + OBSTACLE end
    redis.call('SET', KEYS[3], '1', 'PX', flag_ms)"""
    ).replace("OBSTACLE", obstacle_ms)


# Ends the caller's own outstanding BLPOP (see ``ops.CallEndingWait``): a mark pushed to
# its own list, which its BLPOP watches first. Spliced at the end of a script, after
# anything that may clear that list, so that the push survives.
END_WAIT = r"""
if end_wait == '1' then
  redis.call('RPUSH', KEYS[7], 'c')
  redis.call('PEXPIRE', KEYS[7], liveness_ms)
end
"""


def take_if_free(obstacle: str) -> str:
    """Taking a lock whose obstacle is gone (the Lua variable ``obstacle`` is -2; needs
    `waiter`, `fair`, `now_ms`, `now_us`), up to the point where it is stored: a fair
    caller only on its turn, leaving the queue. Sets `head` (the fair queue's first live
    waiter, or false), `lease_ms` and `fence`; the including script stores the hold and
    closes the ``if``."""
    return (
        r"""
  local head = false
  if fair then"""
        + QUEUE_HEAD
        + r"""
  end
  if OBSTACLE == -2 and (not head or head == waiter) then"""
        + TAKE_TURN
        + r"""
    local lease_ms = tonumber(ARGV[2])"""
        + NEXT_FENCE
    ).replace("OBSTACLE", obstacle)


# Runs the including script's `attempt()`, then ends the caller's wait (END_WAIT) after
# whatever the attempt cleared, and returns the attempt's answer.
RUN_ATTEMPT = "\nlocal result = attempt()\n" + END_WAIT + "\nreturn result\n"
