"""What ``unique_while_queued`` (of the Celery and Django tasks integrations) keeps in
Redis: one claim per lock name, and the task ids that already ran.

Beside each lock (same bucket, so one script touches them with the lock key), named here
for the Celery integration (``celery-``); the Django tasks one uses ``tasks-`` (see
``TaskClaims(namespace=...)``):

- ``PREFIX{bb}:celery-claim:NAME``, a string ``q:<task id>`` while that task is queued,
  ``w:<task id>`` while its run waits for the lock, or ``r:<task id>`` while it runs
  holding the lock. Publishing another task with the same lock name is refused while it
  exists. A queued claim expires (a message lost from the queue frees the name); a
  waiting one lasts one lease of the lock, renewed by the waiting worker; a running one
  also counts as free once the lock itself is gone. So a worker killed while its run
  waits or runs frees the name at the end of a lease.
- ``PREFIX{bb}:celery-done:NAME``, a sorted set of the task ids whose run ended, scored by
  when they may be forgotten (server ms): a copy of the message delivered again (the
  broker's ``visibility_timeout`` ran out while the task ran) is acknowledged without
  running.
- ``PREFIX{bb}:celery-deferral:NAME``, a hash of the put-off copies of busy runs
  (Celery's ``retry``, the tasks' ``defer``), by copy id: ``p`` while the copy waits for
  its time, ``s`` once an early copy was queued in its place because the lock was
  released (the put-off copy then ends without running).
- ``PREFIX{bb}:celery-defer:NAME``, the id of a task whose redelivered copy was put back
  on the queue to run after the lock's lease, for a few seconds: other copies delivered
  meanwhile are dropped rather than all put back.

Each operation is one round trip, through the engine's extension point
(:class:`~django_distlock.engine.BesideLock`): every key is named by it beside the lock,
each script runs on the node serving the lock's slot, and nothing is written outside the
prefix. Django-free.
"""

from __future__ import annotations

import math
from typing import Any

from ..engine import Backend, BesideLock, Script

__all__ = [
    "CLAIM",
    "DEFERRAL",
    "FINISH",
    "PASS",
    "START",
    "WAIT",
    "TaskClaims",
]

# The server's clock in ms (the done records' scores), for the scripts that need it.
NOW = r"""
  local now = redis.call('TIME')
  local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
"""

CLAIM = Script(
    "celery_claim",
    r"""
-- KEYS[1] the name's claim   KEYS[2] the lock
-- ARGV[1] task id   ARGV[2] how long a queued claim lasts (ms)
-- Takes the claim for a task about to be published, or keeps it for the same task id
-- (a retry publishes the task again under its id: a waiting run's claim becomes queued).
-- returns: nothing when the task id holds the claim now, else the id of the queued or
-- waiting task, or of the running task whose lock is held, that holds it
local current = redis.call('GET', KEYS[1])
if current then
  local id = string.sub(current, 3)
  local state = string.sub(current, 1, 1)
  if id == ARGV[1] then
    if state == 'w' then
      redis.call('SET', KEYS[1], 'q:' .. id, 'PX', ARGV[2])
    elseif state == 'q' and redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
      redis.call('PEXPIRE', KEYS[1], ARGV[2])
    end
    return false
  end
  if state ~= 'r' or redis.call('EXISTS', KEYS[2]) == 1 then
    return id
  end
end
redis.call('SET', KEYS[1], 'q:' .. ARGV[1], 'PX', ARGV[2])
return false
""",
)

WAIT = Script(
    "task_claim_wait",
    r"""
-- KEYS[1] the name's claim
-- ARGV[1] task id   ARGV[2] the lock's lease (ms)   ARGV[3] 'mark' or 'renew'
-- A run of the task is about to wait for its lock ('mark'): its claim becomes waiting
-- for one lease, unless another task holds it; its worker renews it while it waits
-- ('renew': only a waiting claim still the task's).
-- returns 1 if the claim is the task's and waiting now, else 0
local current = redis.call('GET', KEYS[1])
local waiting = 'w:' .. ARGV[1]
local ours = not current or string.sub(current, 3) == ARGV[1]
if current == waiting or (ARGV[3] == 'mark' and ours) then
  redis.call('SET', KEYS[1], waiting, 'PX', ARGV[2])
  return 1
end
return 0
""",
)

START = Script(
    "celery_start",
    r"""
-- KEYS[1] the name's claim   KEYS[2] the name's done set
-- ARGV[1] task id   ARGV[2] how long the running claim lasts (ms)
-- Called holding the lock, when a run of the task begins: marks the claim running,
-- unless another task's queued claim holds it (a claim taken after ours expired).
-- returns 1 if this task id already ran (this delivery is a copy), else 0
"""
    + NOW
    + r"""
local done_until = redis.call('ZSCORE', KEYS[2], ARGV[1])
if done_until and tonumber(done_until) > now_ms then return 1 end
local current = redis.call('GET', KEYS[1])
if not current or string.sub(current, 3) == ARGV[1] or string.sub(current, 1, 1) == 'r' then
  redis.call('SET', KEYS[1], 'r:' .. ARGV[1], 'PX', ARGV[2])
end
return 0
""",
)

FINISH = Script(
    "celery_finish",
    r"""
-- KEYS[1] the name's claim   KEYS[2] the name's done set
-- ARGV[1] task id   ARGV[2] 'done' (the run ended), 'queued' (it was published again:
-- a retry) or 'forget' (it could not be published)   ARGV[3] how long the done record,
-- or the queued claim, lasts (ms)
-- Gives up the claim if it is still this task's (compare-and-delete, never another's).
-- returns 1
"""
    + NOW
    + r"""
local current = redis.call('GET', KEYS[1])
local mine = current and string.sub(current, 3) == ARGV[1]
if ARGV[2] == 'done' then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms)
  redis.call('ZADD', KEYS[2], now_ms + tonumber(ARGV[3]), ARGV[1])
  local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  redis.call('PEXPIRE', KEYS[2], tonumber(last[2]) - now_ms + 1)
  if mine then redis.call('DEL', KEYS[1]) end
elseif ARGV[2] == 'queued' then
  if not current or mine then redis.call('SET', KEYS[1], 'q:' .. ARGV[1], 'PX', ARGV[3]) end
elseif mine then
  redis.call('DEL', KEYS[1])
end
return 1
""",
)


PASS = Script(
    "task_claim_pass",
    r"""
-- KEYS[1] the name's claim
-- ARGV[1] task id holding the claim   ARGV[2] task id to pass it to
-- ARGV[3] how long the passed (queued) claim lasts (ms)
-- Passes the claim from one task id to another, queued, if the first still holds it
-- (compare-and-set: a claim that expired or changed hands is left alone).
-- returns 1 if passed, else 0
local current = redis.call('GET', KEYS[1])
if current and string.sub(current, 3) == ARGV[1] then
  redis.call('SET', KEYS[1], 'q:' .. ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
""",
)


DEFERRAL = Script(
    "task_deferral",
    r"""
-- KEYS[1] the name's put-off copies (a hash: copy id -> 'p' waiting, 's' served early)
-- ARGV[1] copy id   ARGV[2] 'park', 'serve', 'unserve' or 'take'
-- ARGV[3] with 'park': how long the record lasts at least (ms)
-- park: the copy is queued to run later; serve: an early copy is about to be queued in
-- its place (only if it still waits); unserve: that early copy could not be queued;
-- take: the copy runs now (its record goes).
-- returns park, serve, unserve: 1 if done, else 0; take: the copy's state, or ''
local state = redis.call('HGET', KEYS[1], ARGV[1])
local mode = ARGV[2]
if mode == 'park' then
  redis.call('HSET', KEYS[1], ARGV[1], 'p')
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
  end
  return 1
elseif mode == 'take' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  return state or ''
end
local from, to = 'p', 's'
if mode == 'unserve' then from, to = 's', 'p' end
if state ~= from then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], to)
return 1
""",
)


class TaskClaims:
    """The claims of task ``task_id`` on lock ``name`` of ``backend`` (see the module's
    docstring); ``namespace`` names the keys (``"celery"``: ``celery-claim``, ...), one per
    integration."""

    __slots__ = ("beside", "claim", "defer", "deferral", "done", "lock", "name", "task_id")

    def __init__(
        self, backend: Backend, name: str, task_id: str, *, namespace: str = "celery"
    ) -> None:
        beside = BesideLock(backend, name)
        self.beside = beside
        self.name = name
        self.task_id = task_id
        self.lock = beside.lock
        self.claim = beside.key(f"{namespace}-claim")
        self.done = beside.key(f"{namespace}-done")
        self.defer = beside.key(f"{namespace}-defer")
        self.deferral = beside.key(f"{namespace}-deferral")

    def take(self, lasts: float) -> str | None:
        """Claim the name for the task, about to be published, for ``lasts`` seconds;
        ``None`` on success, else the id of the task holding the claim."""
        holder = self.beside.run(CLAIM, (self.claim, self.lock), (self.task_id, _ms(lasts)))
        return None if holder is None else _text(holder)

    def held_by_a_run(self) -> bool:
        """Whether the lock is held by a run of the task (its context label ends with
        ``[<task id>]``): a message of the task delivered again finds it so."""
        record = self.beside.holder()
        return record is not None and record.context.endswith(f"[{self.task_id}]")

    def start(self, lasts: float) -> bool:
        """A run of the task begins (the lock is held): ``False`` if the task has already
        run, so this delivery is a copy that must not run."""
        reply = self.beside.run(START, (self.claim, self.done), (self.task_id, _ms(lasts)))
        return int(reply) == 0

    def wait(self, lease: float) -> bool:
        """A run of the task is about to wait for the lock: mark its claim waiting for
        ``lease`` seconds (the lock's lease; renew it with :meth:`still_waiting` while the
        wait lasts). ``False`` if another task holds the claim."""
        return self._wait(lease, "mark")

    def still_waiting(self, lease: float) -> bool:
        """Renew the waiting claim of :meth:`wait` for ``lease`` seconds; ``False`` if it
        is no longer the task's waiting claim (it lapsed, or ended)."""
        return self._wait(lease, "renew")

    def _wait(self, lease: float, mode: str) -> bool:
        reply = self.beside.run(WAIT, (self.claim,), (self.task_id, _ms(lease), mode))
        return int(reply) == 1

    def finish(self, *, requeued: bool, lasts: float) -> None:
        """The run of the task ended (remember it for ``lasts`` seconds), or it was
        published again (``requeued``: claim the name as queued for ``lasts`` seconds)."""
        mode = "queued" if requeued else "done"
        self.beside.run(FINISH, (self.claim, self.done), (self.task_id, mode, _ms(lasts)))

    def forget(self) -> None:
        """Give up the task's claim if it still holds it (compare-and-delete): its message
        could not be published, or a run that needs no done record ended."""
        self.beside.run(FINISH, (self.claim, self.done), (self.task_id, "forget", 1))

    def pass_to(self, task_id: str, lasts: float) -> bool:
        """Hand the task's claim to ``task_id``, queued for ``lasts`` seconds (its
        placeholder id gets the id a backend gave the queued task, or a run that is put
        off hands the name to the task queued in its place); ``False`` if the claim is no
        longer this task's."""
        reply = self.beside.run(PASS, (self.claim,), (self.task_id, task_id, _ms(lasts)))
        return int(reply) == 1

    def park(self, lasts: float) -> None:
        """The task (a put-off copy of a busy run, its id the copy's) is queued to run
        later; remember it for at least ``lasts`` seconds."""
        self._deferral("park", _ms(lasts))

    def serve_early(self) -> bool:
        """The lock was released before the parked copy's time: ``True`` if it still
        waits, and is marked served (queue an early copy now, or :meth:`unserve`)."""
        return int(self._deferral("serve")) == 1

    def unserve(self) -> None:
        """The early copy of :meth:`serve_early` could not be queued: the parked copy
        runs at its time after all."""
        self._deferral("unserve")

    def take_parked(self) -> str:
        """The parked copy runs now: ``"s"`` if an early copy was queued in its place (it
        must not run), ``"p"`` if not (none will be), ``""`` if it was never parked."""
        return _text(self._deferral("take"))

    def _deferral(self, mode: str, lasts_ms: int = 0) -> Any:
        return self.beside.run(DEFERRAL, (self.deferral,), (self.task_id, mode, lasts_ms))

    def defer_once(self, lasts: float) -> bool:
        """``True`` if no other copy of the task was put back in the last ``lasts``
        seconds (and none will be until then): this copy is the one to put back."""
        defer = self.defer
        return (
            self.beside.execute(defer, "SET", defer, self.task_id, "NX", "PX", _ms(lasts))
            is not None
        )


def _ms(seconds: float) -> int:
    # Seconds as whole milliseconds for Redis, rounded up (never 0), as the engine's.
    return max(1, math.ceil(seconds * 1000))


def _text(value: bytes | str) -> str:
    # A reply from a client with or without decode_responses.
    return value if isinstance(value, str) else value.decode("utf-8", "replace")
