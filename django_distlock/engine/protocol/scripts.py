"""The Lua scripts behind every lock operation, each one round trip.

Every script lists the keys and arguments it takes and what it returns. The key layout
they assume is built by :class:`django_distlock.engine.keys.LockKeys`: the keys of one
lock, its bucket's listing index and its waiters' lists share one Redis Cluster hash tag
(the lock's bucket), so a script only ever touches one slot.

Every key a script touches is one of its ``KEYS``, used as such (never built in the
script from another key): Redis Cluster routes on the declared keys, and managed
cluster proxies refuse scripts that compute key names. The one key a script cannot know
in advance, the wake-up list of the first fair waiter, is returned to the caller, who
pushes to it with :data:`WAKE`.

An exclusive hold (the default) makes the lock key one string, ``token \\n fence \\n
acquired_at_us \\n lease_ms \\n owner_json``, so acquiring is a single ``SET ... PX`` and a
holder check is a prefix comparison. Shared and limited holds (``shared=True``,
``limit=N``) make it a sorted set instead: member = token, score = that holder's lease
end (server ms), with each holder's ``fence \\n acquired_at_us \\n lease_ms \\n
owner_json`` in the holders' hash (field ``#kind``: ``shared`` or ``limited N``). Both
keys expire with the last holder's lease, and a holder whose lease is over counts as
gone at once (every script drops such holders before it counts). The key's type is
what tells the kinds apart, so an exclusive acquire of a free lock costs what it did.

The scripts come by what they serve: the Lua fragments the scripts share (the clock, the
fair queue, the wake-up, pruning holders, the next fence, spliced into the branches that
need them: the common paths, a free lock with nobody waiting, run no more commands than
they must), then a plain lock's, shared and limited holds', and several names at once.
The listing's own scripts, which read the locks held now, are :mod:`..listing.scripts`.
A script is a :class:`~.ops.Script`.
"""

from __future__ import annotations

from .ops import Script

__all__ = [
    "ACQUIRE",
    "END_WAIT",
    "EXPIRE_HOLDERS",
    "EXTEND",
    "EXTEND_MANY",
    "HOLDER_ACQUIRE",
    "HOLDER_EXTEND",
    "HOLDER_RELEASE",
    "HOLDER_TTL",
    "IS_MINE",
    "KEYS_DOC",
    "MANY_ACQUIRE",
    "NEXT_FENCE",
    "NOW",
    "PASS_ON",
    "PRUNE_HOLDERS",
    "QUEUE_HEAD",
    "RELEASE",
    "RUN_ATTEMPT",
    "TAKEN",
    "TAKE_TURN",
    "TTL",
    "WAKE",
    "WAKE_ONE",
    "enqueue",
    "is_mine",
    "take_if_free",
]


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

# Wakes exactly one waiter (needs `signal_ms`) if a live one is registered: waiters that
# took the lock or left are off KEYS[3], and those past their deadline are dropped here,
# so that a release with nobody waiting leaves no wake-up for a later waiter to take for a
# futile re-check. Sets `woken_head` to the first live fair waiter, whom the caller wakes
# (its list is not among our keys), or pushes to the shared signal list of unfair
# waiters. That list holds at most one element so that a burst of releases cannot become
# a burst of futile retries. Whether anybody still waits is asked again only when the
# prune removed somebody.
WAKE_ONE = (
    r"""
if redis.call('EXISTS', KEYS[3]) == 1 then
  local head = false"""
    + NOW
    + r"""
  local below = '(' .. string.format('%.0f', now_ms)
  local lapsed = redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', below)
  if lapsed == 0 or redis.call('EXISTS', KEYS[3]) == 1 then"""
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
end
"""
)

KEYS_DOC = r"""
-- KEYS[1] lock          KEYS[2] fence counter
-- KEYS[3] who waits (zset: waiter id -> server ms it counts as waiting until)
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
    fair, and among those who wait (KEYS[3]) for its liveness plus the Lua variable
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
    redis.call('ZADD', KEYS[3], now_ms + flag_ms, waiter)
    if redis.call('PTTL', KEYS[3]) < flag_ms then redis.call('PEXPIRE', KEYS[3], flag_ms) end"""
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


# An exclusive lock just stored (needs `lease_ms`, `fence`, `now`, `now_ms`, `now_us`,
# `waiter`): indexed for the listing, the caller off those who wait, and the answer.
TAKEN = r"""
    -- Entries of locks that expired without a release go at one acquire in 16 (by the
    -- clock's microseconds) and at every listing, which skips them meanwhile: a bucket
    -- keeps them a few acquires longer, the common acquire runs a command less.
    if tonumber(now[2]) % 16 == 0 then
      redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. string.format('%.0f', now_ms))
    end
    redis.call('ZADD', KEYS[4], now_ms + lease_ms, ARGV[4])
    if ARGV[10] then
      redis.call('ZREM', KEYS[3], waiter)
      if ARGV[10] == 'writer' then redis.call('ZREM', KEYS[10], waiter) end
    end
    if fence == now_us then return 'taken ' .. fence end
    return 'taken ' .. fence .. ' ' .. now_us"""


# Runs the including script's `attempt()`, then ends the caller's wait (END_WAIT) after
# whatever the attempt cleared, and returns the attempt's answer.
RUN_ATTEMPT = "\nlocal result = attempt()\n" + END_WAIT + "\nreturn result\n"


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
-- ARGV[10] 'waited' when an earlier attempt of the caller may have registered it among
--          those who wait (KEYS[3]), 'writer' when it also waits among the writers of a
--          lock held shared (KEYS[10]); absent otherwise
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
  local waiter = ARGV[6]
  local fair = ARGV[8] == '1'"""
    + NOW
    + r"""
  -- The lock's value while we hold it with `fence`.
  local function ours(fence)
    return ARGV[1] .. '\n' .. fence .. '\n' .. now_us .. '\n' .. ARGV[2] .. '\n' .. ARGV[3]
  end
  local value
  if fair then
    value = redis.pcall('GET', KEYS[1])
  else
    -- Taken at once if free, with the clock as its fence (the usual case); busy, the
    -- reply is what GET would read. pcall: SET refuses a sorted set (held shared).
    value = redis.pcall('SET', KEYS[1], ours(now_us), 'NX', 'GET', 'PX', ARGV[2])
    if type(value) == 'table' and string.sub(value.err, 1, 9) ~= 'WRONGTYPE' then
      -- Refused as a write (out of memory, a demoted primary) whether or not it would
      -- have written: read instead, so that a busy lock answers busy as it would.
      value = redis.pcall('GET', KEYS[1])
    elseif not value then
      local lease_ms = tonumber(ARGV[2])"""
    + NEXT_FENCE
    + r"""
      if fence ~= now_us then
        redis.call('SET', KEYS[1], ours(fence), 'PX', lease_ms)
      end"""
    + TAKEN
    + r"""
    end
  end
  if type(value) == 'table' then
    -- A sorted set: the lock is held shared (we wait for its holders, as a writer whom
    -- new shared holders let go first) or limited (another kind: refused).
    local held_as = redis.call('HGET', KEYS[9], '#kind')
    if held_as and held_as ~= 'shared' then return {'kind', held_as} end
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
  if pttl ~= -2 and waiter == '' then return {'busy', pttl, ''} end
"""
    + take_if_free("pttl")
    + r"""
    redis.call('SET', KEYS[1], ours(fence), 'PX', lease_ms)"""
    + TAKEN
    + r"""
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
-- pcall: a lock held shared or limited is a sorted set (GET refuses it), not ours here.
local value = redis.pcall('GET', KEYS[1])
if type(value) ~= 'string' or string.sub(value, 1, #ARGV[1] + 1) ~= ARGV[1] .. '\n' then
  return 'not held'
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[4], ARGV[2])
local signal_ms = ARGV[3]
local woken_head = ''
"""
    + WAKE_ONE
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
-- ARGV[6] waiter id to take off those who wait (KEYS[3]), or ''
-- returns {1, head}: head = a fair waiter for the caller to wake, or ''
if ARGV[6] and ARGV[6] ~= '' then redis.call('ZREM', KEYS[3], ARGV[6]) end
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

EXTEND_MANY = Script(
    "extend_many",
    r"""-- extend_many: renew the leases of several locks, each held with its token.
-- KEYS[1] a lock  KEYS[2] its bucket's listing index, then the same two of each next
--         lock (KEYS[2i-1], KEYS[2i]); on a Cluster, locks of one bucket only
-- ARGV[1] token  ARGV[2] milliseconds  ARGV[3] lock name (index member) of the first
--         lock, then the same three of each next (ARGV[3i-2..3i]): a lease is raised to
--         at least that many ms, never shortened (as extend's 'renew')
-- returns one new PTTL in ms per lock, or -2 where it is not held with its token
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local leases = {}
for i = 1, #KEYS / 2 do
  local token = ARGV[3 * i - 2]
  -- pcall: a lock held shared or limited is a sorted set (GET refuses it), not ours here.
  local value = redis.pcall('GET', KEYS[2 * i - 1])
  if type(value) ~= 'string' or string.sub(value, 1, #token + 1) ~= token .. '\n' then
    leases[i] = -2
  else
    -- GT: a longer lease (the holder extended it) is kept, and then read.
    local new_ms = tonumber(ARGV[3 * i - 1])
    if redis.call('PEXPIRE', KEYS[2 * i - 1], new_ms, 'GT') == 0 then
      new_ms = redis.call('PTTL', KEYS[2 * i - 1])
    end
    redis.call('ZADD', KEYS[2 * i], now_ms + new_ms, ARGV[3 * i])
    leases[i] = new_ms
  end
end
return leases
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


HOLDER_KEYS_DOC = KEYS_DOC + "\n-- (KEYS[4] is the bucket's index of shared and limited holds)"


HOLDER_ACQUIRE = Script(
    "holder_acquire",
    "-- holder_acquire: take a shared hold, or one of a limited lock's slots."
    + HOLDER_KEYS_DOC
    + r"""
-- ARGV[1..9] as for acquire; ARGV[4] is the index member (name NUL token)
-- ARGV[10] kind: 'shared' or 'limited N'   ARGV[11] N (0 for shared)
-- ARGV[12] '1' when an earlier attempt of the caller may have registered it among those
--          who wait (KEYS[3]); absent otherwise
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
    if ARGV[12] then redis.call('ZREM', KEYS[3], waiter) end
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


MANY_ACQUIRE = Script(
    "many_acquire",
    r"""-- many_acquire: take several locks at once, exclusively, all or none.
-- KEYS[5i-4..5i] of the i-th lock (KEYS[1] to KEYS[5] for the first): the lock, its
--   fence counter, who waits for it (zset, as KEYS[3] of acquire), its bucket's listing
--   index and its waiting writers (zset)
-- KEYS[#KEYS] the caller's own wake-up list for the lock it waits on (ending its
--   outstanding BLPOP), or any of the locks' keys
-- ARGV[1] token  ARGV[2] lease ms  ARGV[3] owner metadata (JSON)
-- ARGV[4] ms a fence counter outlives the lease  ARGV[5] waiter liveness ms, '' when
--   the caller will not wait  ARGV[6] '1' to end the caller's outstanding BLPOP
-- ARGV[7] waiter id, '' when the caller will not wait
-- ARGV[8] '1' when an earlier attempt of the caller may have registered it as a waiter
--   of one of the locks (who waits, waiting writers), '' otherwise
-- ARGV[9..] the locks' names, in the order of their keys
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
        local time = redis.call('TIME')
        local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
        redis.call('ZADD', KEYS[5 * i - 2], now_ms + flag_ms, waiter)
        if redis.call('PTTL', KEYS[5 * i - 2]) < flag_ms then
          redis.call('PEXPIRE', KEYS[5 * i - 2], flag_ms)
        end
        if type(value) == 'table' and waiter ~= '' then
          -- Held shared: wait as a writer, so that new shared holders let us go first.
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
    if ARGV[8] == '1' then
      redis.call('ZREM', KEYS[5 * i - 2], waiter)
      redis.call('ZREM', KEYS[5 * i], waiter)
    end
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
      redis.call('ZADD', KEYS[5 * i - 1], now_ms + lease_ms, ARGV[8 + i])
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
