"""Scripts of a plain (exclusive) lock: take, release, leave the wait, wake, extend, TTL."""

from __future__ import annotations

from .lua import (
    END_WAIT,
    KEYS_DOC,
    NOW,
    PRUNE_HOLDERS,
    RUN_ATTEMPT,
    WAKE_ONE,
    Script,
    enqueue,
    is_mine,
    take_if_free,
)

__all__ = ["ACQUIRE", "EXTEND", "PASS_ON", "RELEASE", "TTL", "WAKE"]


ACQUIRE = Script(
    "acquire",
    "-- acquire: take the lock if it is free (and, for fair locks, it is our turn)."
    + KEYS_DOC
    + r"""
-- ARGV[1] token            ARGV[2] lease ms          ARGV[3] owner metadata (JSON)
-- ARGV[4] lock name (index member)  ARGV[5] ms the fence counter outlives the lease
-- ARGV[6] waiter id, '' when the caller will not wait  ARGV[7] waiter liveness ms
-- ARGV[8] '1' for a fair lock, '0' otherwise
-- ARGV[9] '1' to end the caller's outstanding BLPOP (see KEYS[7]), '' otherwise
-- ARGV[10] '1' when the caller waits among the writers of a lock held shared
-- returns 'taken FENCE' when taken with a fence equal to the acquisition time (the usual
--         case: the server clock is ahead of the fence counter), else
--         'taken FENCE ACQUIRED_AT_US' when taken (or already held with this token);
--         {'busy', wait_ms, head, writer} when not: wait_ms = how long the current
--         obstacle lasts at most (the holder's PTTL, -1 if unknown); head = a fair waiter
--         whose turn it is, for the caller to wake, or ''; writer = '1' when the caller
--         now waits among the writers of a lock held shared (PASS_ON takes it off);
--         {'kind', kind} when the lock is held as another kind ('limited N')
--         Every reply is tagged: a stray integer or OK can never read as "taken".
local end_wait = ARGV[9]
local liveness_ms = ARGV[7]
local function attempt()
  local pttl = -2
  local shared_by = false
  local value = redis.pcall('GET', KEYS[1])
  if type(value) == 'table' then
    -- A sorted set: the lock is held shared (we wait for its holders, as a writer whom
    -- new shared holders let go first) or limited (another kind: refused).
    local held_as = redis.call('HGET', KEYS[9], '#kind')
    if held_as and held_as ~= 'shared' then return {'kind', held_as} end"""
    + NOW
    + r"""
    local held = 0"""
    + PRUNE_HOLDERS
    + r"""
    if held > 0 then
      local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
      pttl = math.max(0, tonumber(first[2]) - now_ms)
      shared_by = true
    end
  elseif value then
    if string.sub(value, 1, #ARGV[1] + 1) == ARGV[1] .. '\n' then
      -- Already ours: a request retried after its reply was lost. Answer as before.
      local fence, acquired_at = string.match(value, '^[^\n]*\n([^\n]*)\n([^\n]*)\n')
      return 'taken ' .. fence .. ' ' .. acquired_at
    end
    pttl = redis.call('PTTL', KEYS[1])
  end
  local waiter = ARGV[6]
  local fair = ARGV[8] == '1'
  if pttl ~= -2 and waiter == '' then return {'busy', pttl, ''} end
"""
    + NOW
    + take_if_free("pttl")
    + r"""
    redis.call('SET', KEYS[1],
      ARGV[1] .. '\n' .. fence .. '\n' .. now_us .. '\n' .. ARGV[2] .. '\n' .. ARGV[3],
      'PX', lease_ms)
    -- Entries of locks that expired without a release go at one acquire in 16 (by the
    -- clock's microseconds) and at every listing, which skips them meanwhile: a bucket
    -- keeps them a few acquires longer, the common acquire runs a command less.
    if tonumber(now[2]) % 16 == 0 then
      redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. string.format('%.0f', now_ms))
    end
    redis.call('ZADD', KEYS[4], now_ms + lease_ms, ARGV[4])
    if ARGV[10] == '1' then redis.call('ZREM', KEYS[10], waiter) end
    if fence == now_us then return 'taken ' .. fence end
    return 'taken ' .. fence .. ' ' .. now_us
  end
  local wait_ms = pttl
  local writer = ''
  if waiter ~= '' then
    local liveness = tonumber(liveness_ms)
    if shared_by then
      redis.call('ZADD', KEYS[10], now_ms + liveness, waiter)
      redis.call('PEXPIRE', KEYS[10], liveness)
      writer = '1'
    end
"""
    + enqueue("pttl")
    + r"""
  end
  if pttl == -2 then
    -- Free, but another fair waiter is first: the caller nudges it in case it missed
    -- its wake-up, and comes back when its place would lapse.
    return {'busy', tonumber(redis.call('ZSCORE', KEYS[6], head)) - now_ms, head, writer}
  end
  return {'busy', wait_ms, '', writer}
end"""
    + RUN_ATTEMPT,
)

RELEASE = Script(
    "release",
    "-- release: delete the lock if it holds this token, then wake one waiter."
    + KEYS_DOC
    + r"""
-- ARGV[1] token  ARGV[2] lock name (index member)  ARGV[3] wake-up signal lifetime ms
-- returns 'released', or {'released', head} when head, a fair waiter, is for the caller
--         to wake; 'not held' when the lock is not held with this token
"""
    + r"""
-- One read for the lock and the "someone waits" flag (MGET answers nil for a lock held
-- shared or limited, a sorted set: not ours to release here).
local read = redis.call('MGET', KEYS[1], KEYS[3])
local value = read[1]
if not value or string.sub(value, 1, #ARGV[1] + 1) ~= ARGV[1] .. '\n' then return 'not held' end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[4], ARGV[2])
local signal_ms = ARGV[3]
local woken_head = ''
"""
    + WAKE_ONE.replace("if redis.call('EXISTS', KEYS[3]) == 1 then", "if read[2] then")
    + r"""
if woken_head == '' then return 'released' end
return {'released', woken_head}
""",
)

PASS_ON = Script(
    "pass_on",
    "-- pass_on: a waiter stops waiting; hand any wake-up it consumed to the next one."
    + KEYS_DOC
    + r"""
-- ARGV[1] waiter id to take off the fair queue ('' for an unfair waiter)
-- ARGV[2] wake-up signal lifetime ms
-- ARGV[3] '1' when the leaving waiter consumed a wake-up it will not use
-- ARGV[4] '1' to end the caller's outstanding BLPOP (see KEYS[7]), '' otherwise
-- ARGV[5] waiter id to take off the waiting writers of a lock held shared, or ''
-- returns {1, head}: head = a fair waiter for the caller to wake, or ''
local waiter = ARGV[1]
local signal_ms = ARGV[2]
local liveness_ms = ARGV[2]
local end_wait = ARGV[4]
local woken_head = ''
local wake = ARGV[3] == '1'
if waiter ~= '' then
  redis.call('LREM', KEYS[5], 0, waiter)
  redis.call('ZREM', KEYS[6], waiter)
  redis.call('DEL', KEYS[7])
  wake = wake or redis.call('EXISTS', KEYS[1]) == 0
end
if ARGV[5] and ARGV[5] ~= '' and redis.call('ZREM', KEYS[10], ARGV[5]) == 1 then
  -- Shared holders may have been waiting only for this writer.
  wake = wake or redis.call('ZCARD', KEYS[10]) == 0
end
if wake then"""
    + WAKE_ONE
    + r"""
end
"""
    + END_WAIT
    + r"""
return {1, woken_head}
""",
)

WAKE = Script(
    "wake",
    r"""-- wake: wake a fair waiter whose turn it is (its list is not among the lock's keys).
-- KEYS[1] the waiter's own wake-up list
-- ARGV[1] wake-up lifetime ms
-- returns 1
redis.call('RPUSH', KEYS[1], '1')
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
""",
)

EXTEND = Script(
    "extend",
    r"""-- extend: change the lease of a lock held with this token.
-- KEYS[1] lock  KEYS[2] the bucket's listing index
-- ARGV[1] token  ARGV[2] milliseconds  ARGV[3] lock name (index member)
-- ARGV[4] mode: 'add' (PTTL + ms), 'set' (exactly ms), 'renew' (at least ms: a watchdog
--         renewal must never shorten a lease the holder extended)
-- returns the new PTTL in ms, or -2 when the lock is not held with this token
"""
    + is_mine("-2")
    + r"""
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
    r"""-- ttl: the remaining lease of a lock held with this token.
-- KEYS[1] lock
-- ARGV[1] token
-- returns the PTTL in ms, or -2 when the lock is not held with this token"""
    + is_mine("-2")
    + r"""
return redis.call('PTTL', KEYS[1])
""",
)
