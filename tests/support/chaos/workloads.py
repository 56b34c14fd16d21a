"""The client loop of a chaos run, one per lock kind: take the lock, do a read-modify-write
of the register it guards (:mod:`.registers`), give it back, again and again until the
run's end, recording every operation (:class:`tests.support.history.Recorder`).

``python -m tests.support.chaos.workloads SPEC_JSON`` runs one client process; the spec
(built by :func:`client_spec`) names the target (as :func:`tests.support.kind_workers.
backend_for` takes it), the kind, the register database, the history file, the client's
name and seed, the lease, whether writes are fenced, a mutant (a deliberately broken lock,
:mod:`.mutants`) or ``None``, and how long a hold works before its write (``None``:
:data:`HOLD_SECONDS`). The client prints ``ready`` once
connected, then reads a line from stdin: the run's end, a ``time.monotonic()`` instant
(one clock for every process of the machine); its last hold starts before that.

Kinds (:data:`KINDS`):

- ``mutex``, ``mutex-async``: ``Lock(name)``, sync or async API; ``fair``: ``fair=True``;
- ``limited``: ``Lock(name, limit=LIMIT)``; holders only read the register (up to
  ``LIMIT`` of them may hold at once, so a write would race by design);
- ``shared``: each hold is shared (reads the register) or exclusive (read-modify-write);
- ``reentrant``: ``Lock(name, reentrant=True)`` taken twice by the client (through two
  ``Lock`` objects), the write done at depth 2; the history shows the outer hold only;
- ``many``: a ``LockGroup`` of 2 or 3 of :data:`GROUP_NAMES` in a random order; each
  name is a hold of its own (sharing ``extra["group"]``) and guards its own register.

Every kind but ``mutex-async`` drives the sync API from one asyncio task (as
``tests/support/kind_workers.py`` does); register reads and writes go through
``sync_to_async`` in every kind, since Django refuses sync ORM calls while a loop runs.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asgiref.sync import sync_to_async

from django_distlock.engine import (
    Backend,
    Lock,
    LockError,
    LockGroup,
    LockLost,
    LockNotOwned,
)
from django_distlock.fencing import StaleFence
from tests.support.chaos.mutants import apply as apply_mutant
from tests.support.chaos.registers import Registers, configure
from tests.support.history import PENDING, Outcome, Recorder
from tests.support.kind_workers import account_names, backend_for

__all__ = ["GROUP_NAMES", "KINDS", "LIMIT", "LOCK_NAME", "client_spec", "register_names"]

KINDS = ("mutex", "mutex-async", "fair", "limited", "shared", "reentrant", "many")
LOCK_NAME = "chaos:register"
# On a cluster one script takes the first and last together, the rest spread over nodes.
GROUP_NAMES = account_names(3)
LIMIT = 2
# Blocking timeouts an acquire picks from (0: do not wait): bounded, so that every client
# gets back to its loop (and its deadline) while a server is down.
BLOCKING_TIMEOUTS = (0.0, 0.5, 2.0, 2.0)
HOLD_SECONDS = (0.0, 0.02)  # between the read and the write
# After an acquire that failed with an error: a server refusing every write (maxmemory)
# answers at once, and the history need not hold thousands of those.
ERROR_BACKOFF = 0.05
PAUSE_SECONDS = (0.0, 0.01)  # between two holds


def register_names(kind: str) -> list[str]:
    """The lock names (one register each) a kind's clients use."""
    return list(GROUP_NAMES) if kind == "many" else [LOCK_NAME]


def client_spec(
    *,
    target: dict[str, Any],
    kind: str,
    database: Path,
    history: Path,
    client: str,
    seed: int,
    lease: float,
    fenced: bool,
    min_replicas: int = 0,
    mutant: str | None = None,
    hold_seconds: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """The JSON spec of one client process."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}, not one of {KINDS}")
    return {
        "target": target,
        "kind": kind,
        "database": str(database),
        "history": str(history),
        "client": client,
        "seed": seed,
        "lease": lease,
        "fenced": fenced,
        "min_replicas": min_replicas,
        "mutant": mutant,
        "hold_seconds": hold_seconds,
    }


@dataclass
class _Held:
    """One name of the current hold: its hold number, fence and token."""

    name: str
    hold: int
    fence: int | None
    token: str | None
    lost_recorded: bool = False


@dataclass
class _Client:
    """What a client loop shares with its lock kind: the recorder (thread-safe: on_lost
    callbacks record from the watchdog), the registers and the current hold."""

    recorder: Recorder
    registers: Registers
    rng: random.Random
    lease: float
    fenced: bool
    held: dict[str, _Held] = field(default_factory=dict)
    guard: threading.Lock = field(default_factory=threading.Lock)
    hold_seconds: tuple[float, float] = HOLD_SECONDS

    def record(self, kind: Any, name: str, start: float, outcome: Outcome, **fields: Any) -> None:
        with self.guard:
            self.recorder.record(
                kind, name, start, outcome, lease=self.lease, fenced=self.fenced, **fields
            )

    def on_lost(self, lock: Lock) -> None:
        """The watchdog found ``lock`` lost: record it once for the current hold."""
        with self.guard:
            held = self.held.get(lock.name)
            if held is None or held.lost_recorded:
                return
            held.lost_recorded = True
            now = time.monotonic()
            # Its lease ended at its local lease end (lock.lost is true from then on),
            # however late this callback runs.
            valid_until = lock.valid_until
            lease_until = now if valid_until is None else now - (time.time() - valid_until)
            self.recorder.record(
                "lost",
                lock.name,
                now,
                "ok",
                hold=held.hold,
                fence=held.fence,
                token=held.token,
                lease=self.lease,
                fenced=self.fenced,
                detail=lock.lost_reason or "on_lost",
                extra={"lease_until": min(now, lease_until)},
            )


class _Api:
    """The sync or the async methods of a lock, awaited alike."""

    def __init__(self, asynchronous: bool) -> None:
        self.asynchronous = asynchronous

    async def acquire(self, lock: Lock | LockGroup, blocking_timeout: float) -> bool:
        if self.asynchronous:
            return await lock.aacquire(blocking_timeout=blocking_timeout)
        return lock.acquire(blocking_timeout=blocking_timeout)

    async def release(self, lock: Lock | LockGroup) -> None:
        if self.asynchronous:
            await lock.arelease()
        else:
            lock.release()


@dataclass
class _Take:
    """One hold a kind asks for: the lock object, and what the history says of it."""

    lock: Lock | LockGroup
    names: list[str]
    mode: str = "exclusive"
    limit: int = 1
    writes: bool = True
    inner: Lock | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _chooser(kind: str, backend: Backend, client: _Client) -> Callable[[], _Take]:
    """The next hold of a client of ``kind``."""
    options: dict[str, Any] = {
        "backend": backend,
        "timeout": client.lease,
        "on_lost": client.on_lost,
        "raise_on_lost": True,
    }
    rng = client.rng
    if kind in ("mutex", "mutex-async", "fair"):
        lock = Lock(LOCK_NAME, fair=kind == "fair", **options)
        return lambda: _Take(lock, [LOCK_NAME])
    if kind == "limited":
        limited = Lock(LOCK_NAME, limit=LIMIT, **options)
        return lambda: _Take(limited, [LOCK_NAME], mode="limited", limit=LIMIT, writes=False)
    if kind == "shared":
        reader = Lock(LOCK_NAME, shared=True, **options)
        writer = Lock(LOCK_NAME, **options)

        def shared_or_exclusive() -> _Take:
            if rng.random() < 0.6:
                return _Take(reader, [LOCK_NAME], mode="shared", writes=False)
            return _Take(writer, [LOCK_NAME])

        return shared_or_exclusive
    if kind == "reentrant":
        outer = Lock(LOCK_NAME, reentrant=True, **options)
        inner = Lock(LOCK_NAME, reentrant=True, **options)
        return lambda: _Take(outer, [LOCK_NAME], inner=inner, extra={"depth": 2})
    if kind == "many":

        def group() -> _Take:
            names = rng.sample(GROUP_NAMES, rng.randint(2, len(GROUP_NAMES)))
            return _Take(LockGroup(names, **options), names, extra={"group": names})

        return group
    raise ValueError(f"unknown kind {kind!r}")


def _granted_until(take: _Take) -> float:
    """The monotonic time the lease just granted ends, as the lock tells its holder."""
    lock = take.lock
    ends = [
        each.valid_until
        for each in (lock.locks.values() if isinstance(lock, LockGroup) else [lock])
        if each.valid_until is not None
    ]
    return time.monotonic() - (time.time() - min(ends)) if ends else time.monotonic()


def _fences(take: _Take) -> dict[str, tuple[int | None, str | None]]:
    lock = take.lock
    if isinstance(lock, LockGroup):
        return {name: (lock.locks[name].fence, lock.locks[name].token) for name in take.names}
    return {take.names[0]: (lock.fence, lock.token)}


async def _database(call: Callable[..., Any], *args: Any) -> Any:
    return await sync_to_async(call)(*args)


async def _read_modify_write(client: _Client, held: _Held, take: _Take) -> None:
    """Read the register of ``held.name``; with ``take.writes``, write it + 1."""
    common: dict[str, Any] = {
        "hold": held.hold,
        "fence": held.fence,
        "token": held.token,
        "mode": take.mode,
        "limit": take.limit,
    }
    if client.fenced and take.writes:
        await _fenced_increment(client, held, common)
        return
    start = time.monotonic()
    try:
        value = await _database(client.registers.read, held.name)
    except Exception as error:
        client.record("read", held.name, start, "info", detail=repr(error), **common)
        return
    client.record("read", held.name, start, "ok", value=value, **common)
    if not take.writes:
        return
    await asyncio.sleep(client.rng.uniform(*client.hold_seconds))
    start = time.monotonic()
    try:
        await _database(client.registers.write, held.name, value + 1)
    except Exception as error:
        client.record(
            "write", held.name, start, "info", value=value + 1, detail=repr(error), **common
        )
        return
    client.record("write", held.name, start, "ok", value=value + 1, **common)


async def _fenced_increment(client: _Client, held: _Held, common: dict[str, Any]) -> None:
    """The hold's work, then the register read and written + 1 with its fence in one
    transaction (a fence refuses a stale write, not a stale read: read in the transaction
    of the fenced write, or lose updates; docs/fencing.md)."""
    assert held.fence is not None
    await asyncio.sleep(client.rng.uniform(*client.hold_seconds))
    start = time.monotonic()

    def pending(value: int) -> None:
        client.record("write", held.name, start, "info", value=value + 1, detail=PENDING, **common)

    try:
        value, seq = await _database(
            client.registers.increment_fenced, held.name, held.fence, pending
        )
    except StaleFence as error:  # refused, nothing written
        outcome: Outcome = "fail"
        client.record("write", held.name, start, outcome, detail=repr(error), **common)
        return
    except Exception as error:
        client.record("write", held.name, start, "info", detail=repr(error), **common)
        return
    client.record("read", held.name, start, "ok", value=value, **common)
    client.record("write", held.name, start, "ok", value=value + 1, extra={"seq": seq}, **common)


async def _one_hold(client: _Client, api: _Api, take: _Take) -> None:
    blocking_timeout = client.rng.choice(BLOCKING_TIMEOUTS)
    holds = {name: client.recorder.next_hold() for name in take.names}
    common = {"mode": take.mode, "limit": take.limit, "blocking_timeout": blocking_timeout}
    start = time.monotonic()
    try:
        got = await api.acquire(take.lock, blocking_timeout)
    except LockError as error:
        for name in take.names:
            client.record(
                "acquire",
                name,
                start,
                "info",
                hold=holds[name],
                detail=repr(error),
                extra=take.extra,
                **common,
            )
        await asyncio.sleep(ERROR_BACKOFF)
        return
    if not got:
        for name in take.names:
            client.record(
                "acquire",
                name,
                start,
                "fail",
                hold=holds[name],
                detail="busy" if blocking_timeout == 0 else "timeout",
                extra=take.extra,
                **common,
            )
        return
    granted = {**take.extra, "granted_until": _granted_until(take)}
    with client.guard:
        for name, (fence, token) in _fences(take).items():
            client.held[name] = _Held(name, holds[name], fence, token)
    for name in take.names:
        held = client.held[name]
        client.record(
            "acquire",
            name,
            start,
            "ok",
            hold=held.hold,
            fence=held.fence,
            token=held.token,
            extra=granted,
            **common,
        )
    try:
        if take.inner is not None:
            assert await api.acquire(take.inner, 0), "re-entry refused to the owner"
        for name in take.names:
            await _read_modify_write(client, client.held[name], take)
    finally:
        try:
            if take.inner is not None:
                await api.release(take.inner)
        except LockError:
            pass  # the outer release says what became of the hold
        await _release(client, api, take)


def _lease_ends(take: _Take) -> dict[str, float]:
    """The monotonic lease end each name's holder believes in now (none if not held)."""
    lock = take.lock
    locks = lock.locks if isinstance(lock, LockGroup) else {take.names[0]: lock}
    now, wall = time.monotonic(), time.time()
    ends = {name: locks[name].valid_until for name in take.names}
    return {name: now - (wall - end) for name, end in ends.items() if end is not None}


async def _release(client: _Client, api: _Api, take: _Take) -> None:
    believed = _lease_ends(take)
    start = time.monotonic()
    for name in take.names:  # a client killed during the release leaves this behind
        held = client.held[name]
        client.record(
            "release", name, start, "info", hold=held.hold, detail=PENDING, mode=take.mode
        )
    outcome: Outcome = "ok"
    detail = ""
    try:
        await api.release(take.lock)
    except LockLost as error:
        outcome, detail = "fail", f"lost: {error}"
    except LockNotOwned as error:
        outcome, detail = "fail", f"not owned: {error}"
    except LockError as error:  # Redis unreachable or refusing: unknown
        outcome, detail = "info", repr(error)
    with client.guard:
        helds = [client.held.pop(name) for name in take.names]
    for held in helds:
        common = {"hold": held.hold, "fence": held.fence, "token": held.token, "mode": take.mode}
        client.record(
            "release",
            held.name,
            start,
            outcome,
            detail=detail,
            limit=take.limit,
            extra=take.extra,
            **common,
        )
        if outcome == "fail" and not held.lost_recorded:
            # The lease end it believed in, told now (the checker's "own records").
            until = {"lease_until": believed[held.name]} if held.name in believed else {}
            client.record(
                "lost",
                held.name,
                start,
                "ok",
                detail=detail,
                limit=take.limit,
                extra=until,
                **common,
            )


async def _run(spec: dict[str, Any]) -> None:
    configure(spec["database"])
    if spec.get("mutant"):
        apply_mutant(spec["mutant"])
    backend = backend_for(spec["target"], min_replicas=spec["min_replicas"])
    api = _Api(asynchronous=spec["kind"] == "mutex-async")
    with Recorder(spec["history"], spec["client"]) as recorder:
        client = _Client(
            recorder=recorder,
            registers=Registers(),
            rng=random.Random(spec["seed"]),
            lease=spec["lease"],
            fenced=spec["fenced"],
        )
        if spec.get("hold_seconds"):
            client.hold_seconds = tuple(spec["hold_seconds"])
        choose = _chooser(spec["kind"], backend, client)
        # A first request pays for connecting (a cluster's slots, the node's pool): made
        # here, before the run's clock starts, it is not counted as a wait.
        for name in register_names(spec["kind"]):
            probe = Lock(name, backend=backend)
            await probe.alocked() if api.asynchronous else probe.locked()
        print("ready", flush=True)
        until = float(await asyncio.to_thread(sys.stdin.readline))
        while time.monotonic() < until:
            await _one_hold(client, api, choose())
            await asyncio.sleep(client.rng.uniform(*PAUSE_SECONDS))


def main(argv: list[str]) -> None:
    """Run one client process (``python -m tests.support.chaos.workloads SPEC_JSON``)."""
    (spec,) = argv
    asyncio.run(_run(json.loads(spec)))


if __name__ == "__main__":
    main(sys.argv[1:])
