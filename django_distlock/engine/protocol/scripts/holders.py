"""Scripts of shared and limited holds (the lock key a sorted set of holders)."""

from __future__ import annotations

from .lua import (
    EXPIRE_HOLDERS,
    KEYS_DOC,
    NOW,
    PRUNE_HOLDERS,
    RUN_ATTEMPT,
    WAKE_ONE,
    Script,
    enqueue,
    take_if_free,
)

__all__ = ["HOLDER_ACQUIRE", "HOLDER_EXTEND", "HOLDER_RELEASE", "HOLDER_TTL"]

HOLDER_KEYS_DOC = KEYS_DOC + "\n-- (KEYS[4] is the bucket's index of shared and limited holds)"


HOLDER_ACQUIRE = Script(
    "holder_acquire",
    "-- holder_acquire: take a shared hold, or one of a limited lock's slots."
    + HOLDER_KEYS_DOC
    + r"""
-- ARGV[1..9] as for acquire; ARGV[4] is the index member (name NUL token)
-- ARGV[10] kind: 'shared' or 'limited N'   ARGV[11] N (0 for shared)
-- returns {'taken', fence, acquired_at_us, head} when taken (or already held with this
--         token): head = a waiter to wake (a free slot or a shared hold may let one more
--         in); {'busy', wait_ms, head} when not (as for acquire);
--         {'kind', kind} when the lock is held as another kind ('limited N' with another N)
local end_wait = ARGV[9]
local liveness_ms = ARGV[7]
local signal_ms = ARGV[7]
local kind = ARGV[10]
local limit = tonumber(ARGV[11])
local woken_head = ''
local function attempt()"""
    + NOW
    + r"""
  local obstacle_ms = -2
  local writer_first = false
  local held = 0
  local key_type = redis.call('TYPE', KEYS[1])['ok']
  if key_type == 'string' then
    -- An exclusive holder: shared holds wait for it, a limited lock is another kind.
    if limit > 0 then return {'kind', 'exclusive'} end
    obstacle_ms = redis.call('PTTL', KEYS[1])
  elseif key_type == 'zset' then
    local held_as = redis.call('HGET', KEYS[9], '#kind')
    if held_as and held_as ~= kind then return {'kind', held_as} end
    local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
    if score and tonumber(score) >= now_ms then
      -- Already ours: a request retried after its reply was lost. Answer as before.
      local entry = redis.call('HGET', KEYS[9], ARGV[1])
      local fence, acquired_at = string.match(entry, '^([^\n]*)\n([^\n]*)\n')
      return {'taken', fence, acquired_at, ''}
    end"""
    + PRUNE_HOLDERS
    + r"""
    if limit > 0 and held >= limit then
      local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
      obstacle_ms = math.max(0, tonumber(first[2]) - now_ms)
    end
  elseif key_type ~= 'none' then
    return {'kind', key_type}
  end
  local fair = ARGV[8] == '1'
  if obstacle_ms == -2 and limit == 0 and not fair then
    -- A writer waiting for this lock goes before new shared holders (fair ones follow
    -- the queue instead, where writers and readers keep their arrival order).
    redis.call('ZREMRANGEBYSCORE', KEYS[10], '-inf', '(' .. string.format('%.0f', now_ms))
    if redis.call('ZCARD', KEYS[10]) > 0 then
      writer_first = true
      obstacle_ms = -1
    end
  end
  local waiter = ARGV[6]
  if obstacle_ms ~= -2 and waiter == '' then return {'busy', obstacle_ms, ''} end"""
    + take_if_free("obstacle_ms")
    + r"""
    redis.call('ZADD', KEYS[1], now_ms + lease_ms, ARGV[1])
    redis.call('HSET', KEYS[9], ARGV[1],
      fence .. '\n' .. now_us .. '\n' .. ARGV[2] .. '\n' .. ARGV[3], '#kind', kind)"""
    + EXPIRE_HOLDERS
    + r"""
    redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. string.format('%.0f', now_ms))
    redis.call('ZADD', KEYS[4], now_ms + lease_ms, ARGV[4])
    if limit == 0 or held + 1 < limit then
      -- Room for one more: the next waiter need not wait for a release."""
    + WAKE_ONE
    + r"""
    end
    return {'taken', fence, now_us, woken_head}
  end
  if waiter ~= '' then
    local liveness = tonumber(liveness_ms)
"""
    + enqueue("obstacle_ms")
    + r"""
  end
  if writer_first and held == 0 then
    -- Nobody holds it and a writer waits: the wake-up the caller may have consumed
    -- was the writer's. Hand it on.
    local head = false"""
    + WAKE_ONE.replace(
        "if redis.call('EXISTS', KEYS[3]) == 1 then\n  local head = false", "if true then"
    )
    + r"""
    return {'busy', obstacle_ms, woken_head}
  end
  if obstacle_ms == -2 then
    return {'busy', tonumber(redis.call('ZSCORE', KEYS[6], head)) - now_ms, head}
  end
  return {'busy', obstacle_ms, ''}
end"""
    + RUN_ATTEMPT,
)

HOLDER_RELEASE = Script(
    "holder_release",
    "-- holder_release: end a shared or limited hold with this token, then wake a waiter."
    + HOLDER_KEYS_DOC
    + r"""
-- ARGV[1] token  ARGV[2] index member (name NUL token)  ARGV[3] wake-up lifetime ms
-- returns {'released', head} when released (head: a fair waiter for the caller to wake,
--         or ''), {'not held', ''} when the lock is not held with this token (or its
--         lease is over)
local signal_ms = ARGV[3]
local woken_head = ''
if redis.call('TYPE', KEYS[1])['ok'] ~= 'zset' then return {'not held', ''} end"""
    + NOW
    + r"""
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
local mine = score and tonumber(score) >= now_ms
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[9], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[2])
local held = 0"""
    + PRUNE_HOLDERS
    + r"""
if held > 0 then"""
    + EXPIRE_HOLDERS
    + r"""
end
if not mine then return {'not held', ''} end
-- A slot is free (limited), or the last shared holder left (a writer may go).
if held == 0 or redis.call('HGET', KEYS[9], '#kind') ~= 'shared' then"""
    + WAKE_ONE
    + r"""
end
return {'released', woken_head}
""",
)

HOLDER_EXTEND = Script(
    "holder_extend",
    r"""-- holder_extend: change the lease of a shared or limited hold with this token.
-- KEYS[1] lock (sorted set of holders)  KEYS[2] the bucket's index of such holds
-- KEYS[3] holders (hash)
-- ARGV[1] token  ARGV[2] milliseconds  ARGV[3] index member (name NUL token)
-- ARGV[4] mode: 'add', 'set' or 'renew' (as for extend)
-- returns the new lease in ms, or -2 when the lock is not held with this token
if redis.call('TYPE', KEYS[1])['ok'] ~= 'zset' then return -2 end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) < now_ms then return -2 end
local pttl = tonumber(score) - now_ms
local ms = tonumber(ARGV[2])
local new_ms = ms
if ARGV[4] == 'add' then
  new_ms = pttl + ms
elseif ARGV[4] == 'renew' then
  new_ms = math.max(pttl, ms)
end
redis.call('ZADD', KEYS[1], now_ms + new_ms, ARGV[1])
redis.call('ZADD', KEYS[2], now_ms + new_ms, ARGV[3])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
local keep_ms = math.max(1, tonumber(last[2]) - now_ms)
redis.call('PEXPIRE', KEYS[1], keep_ms)
redis.call('PEXPIRE', KEYS[3], keep_ms)
return new_ms
""",
)

HOLDER_TTL = Script(
    "holder_ttl",
    r"""-- holder_ttl: the remaining lease of a shared or limited hold with this token.
-- KEYS[1] lock (sorted set of holders)
-- ARGV[1] token
-- returns the lease left in ms, or -2 when the lock is not held with this token
if redis.call('TYPE', KEYS[1])['ok'] ~= 'zset' then return -2 end
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then return -2 end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local left = tonumber(score) - now_ms
if left < 0 then return -2 end
return left
""",
)
