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

- ``mutex``, ``mutex-async``: ``Lock(name)``, sync or async API; ``fair``,
  ``fair-async``: ``fair=True``;
- ``limited``: ``Lock(name, limit=LIMIT)``; holders only read the register (up to
  ``LIMIT`` of them may hold at once, so a write would race by design);
- ``shared``: each hold is shared (reads the register) or exclusive (read-modify-write);
- ``reentrant``: ``Lock(name, reentrant=True)`` taken twice by the client (through two
  ``Lock`` objects), the write done at depth 2; the history shows the outer hold only;
- ``many``, ``many-async``: a ``LockGroup`` (what ``distlock_many`` returns) of 2 or 3
  of :data:`GROUP_NAMES` in a random order; each name is a hold of its own (sharing
  ``extra["group"]``) and guards its own register.

The ``-async`` kinds use the async API; the others drive the sync API from one asyncio
task (as ``tests/support/kind_workers.py`` does); register reads and writes go through
``sync_to_async`` in every kind, since Django refuses sync ORM calls while a loop runs.

The caller's faults (the nemesis' ``client-interrupt``, SIGUSR1): the signal arms an
interruption of the client's next acquire or release (chosen at random), which lands a
random short time into that call (:class:`_Interrupter`). A sync client gets a
``KeyboardInterrupt`` raised from a ``SIGALRM`` handler at whatever bytecode of the lock
call it is in; an async client's hold, run under one of :data:`CANCELLATIONS` chosen per
hold, is cancelled: its ``asyncio.timeout`` expires, a ``TaskGroup`` sibling fails, or
its task is cancelled twice (the second while it handles the first). An interrupted
acquire is recorded ``info``, an interrupted release ``info``, with
``extra["interrupted"]`` saying how; either way the client stops believing it holds
the lock there, and carries on with its next hold.

A ``mutex``, ``fair`` or ``many`` lock object whose acquire or release raised an error or
was interrupted is retired: kept alive and never used again (as an app keeps a lock
object it will not touch for a while), a new one taking its place. Whatever it left in
Redis must end by itself; the next acquire of the same object would otherwise adopt it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asgiref.sync import sync_to_async

from django_distlock.engine import Backend, Lock, LockError, LockGroup, LockLost, LockNotOwned
from django_distlock.fencing import StaleFence
from tests.support.chaos.mutants import apply as apply_mutant
from tests.support.chaos.registers import Registers, configure
from tests.support.history import PENDING, Outcome, Recorder
from tests.support.kind_workers import account_names, backend_for

__all__ = ["GROUP_NAMES", "KINDS", "LIMIT", "LOCK_NAME", "client_spec", "register_names"]

KINDS = (
    "mutex",
    "mutex-async",
    "fair",
    "fair-async",
    "limited",
    "shared",
    "reentrant",
    "many",
    "many-async",
)
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
CANCELLATIONS = ("timeout", "taskgroup", "cancel-twice")
"""How an async client's hold is cancelled when the nemesis interrupts it."""
# How far into the armed call an interruption lands (seconds, uniform in one of the
# ranges): a release is a round trip or a few; an acquire's first round trip (its
# request sent, its reply on the way), or later while it waits.
INTERRUPT_DELAYS = {"acquire": ((0.0, 0.004), (0.0, 0.05)), "release": ((0.0, 0.003),)}
INTERRUPT_SIGNAL = signal.SIGUSR1
_INTERRUPTIONS = (KeyboardInterrupt, asyncio.CancelledError)


def register_names(kind: str) -> list[str]:
    """The lock names (one register each) a kind's clients use."""
    return list(GROUP_NAMES) if kind.startswith("many") else [LOCK_NAME]


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
    min_replicas: int | str = 0,
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
    retired: list[Lock | LockGroup] = field(default_factory=list)
    """Lock objects whose release failed or was interrupted (:attr:`_Take.retire`)."""
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


class _Interrupter:
    """The caller's own faults in one client (see the module docstring): SIGUSR1 arms
    an interruption of the next ``acquire`` or ``release``; :meth:`calling` lands it
    inside that call. Its choices come from a generator of its own, so that a run
    without interruptions makes the choices it always made."""

    def __init__(self, seed: int, asynchronous: bool) -> None:
        self.rng = random.Random(seed)
        self.asynchronous = asynchronous
        self.armed: str | None = None
        self.in_call = False
        self.cancel: Callable[[], None] | None = None
        """Cancels the current async hold (set by :func:`_interruptible`)."""
        self.style = ""
        """How the current async hold is cancelled (one of :data:`CANCELLATIONS`)."""

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Take SIGUSR1 (and, sync, SIGALRM) in this process."""
        loop.add_signal_handler(INTERRUPT_SIGNAL, self._arm)
        if not self.asynchronous:
            signal.signal(signal.SIGALRM, self._alarm)

    def _arm(self) -> None:
        self.armed = self.rng.choice(("acquire", "release"))

    def calling(self, what: str) -> None:
        """A lock call ``what`` begins: land an armed interruption in it."""
        if self.armed != what:
            return
        self.armed = None
        delay = self.rng.uniform(*self.rng.choice(INTERRUPT_DELAYS[what]))
        if not self.asynchronous:
            signal.setitimer(signal.ITIMER_REAL, max(delay, 1e-6))
            return
        cancel = self.cancel
        if cancel is not None:
            asyncio.get_running_loop().call_later(delay, self._cancel, cancel)

    def _cancel(self, cancel: Callable[[], None]) -> None:
        if self.cancel is cancel:  # the same hold still runs
            cancel()

    def _alarm(self, signum: int, frame: Any) -> None:
        # Raised in the lock call's own code only: a KeyboardInterrupt in this module's
        # bookkeeping would be a fault of the harness, not of the lock.
        if not self.in_call:
            return
        if frame is not None and frame.f_code.co_filename == __file__:
            signal.setitimer(signal.ITIMER_REAL, 1e-4)  # a bytecode or so later
            return
        self.in_call = False
        raise KeyboardInterrupt("client-interrupt")


class _Api:
    """The sync or the async methods of a lock, awaited alike."""

    def __init__(self, asynchronous: bool, interrupter: _Interrupter | None = None) -> None:
        self.asynchronous = asynchronous
        self.interrupter = interrupter or _Interrupter(0, asynchronous)

    async def acquire(self, lock: Lock | LockGroup, blocking_timeout: float) -> bool:
        self.interrupter.calling("acquire")
        if self.asynchronous:
            return await lock.aacquire(blocking_timeout=blocking_timeout)
        interrupter = self.interrupter
        interrupter.in_call = True
        try:
            return lock.acquire(blocking_timeout=blocking_timeout)
        finally:
            interrupter.in_call = False
            signal.setitimer(signal.ITIMER_REAL, 0)

    async def release(self, lock: Lock | LockGroup, *, armable: bool = True) -> None:
        if armable:
            self.interrupter.calling("release")
        if self.asynchronous:
            await lock.arelease()
            return
        interrupter = self.interrupter
        interrupter.in_call = True
        try:
            lock.release()
        finally:
            interrupter.in_call = False
            signal.setitimer(signal.ITIMER_REAL, 0)


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
    retire: Callable[[], None] | None = None
    """Called after an acquire or a release that raised an error or was interrupted (the
    lock may be held, though its caller does not believe it is): the client leaves
    that lock object alone from then on (and keeps it, as an app keeps a lock it will not
    use again soon), and takes a new one for its next holds. A hold the failed release
    left behind must end by itself."""


def _chooser(kind: str, backend: Backend, client: _Client) -> Callable[[], _Take]:
    """The next hold of a client of ``kind``."""
    options: dict[str, Any] = {
        "backend": backend,
        "timeout": client.lease,
        "on_lost": client.on_lost,
        "raise_on_lost": True,
    }
    rng = client.rng
    kind = kind.removesuffix("-async")
    if kind in ("mutex", "fair"):
        current = [Lock(LOCK_NAME, fair=kind == "fair", **options)]

        def retire() -> None:
            client.retired.append(current[0])
            current[0] = Lock(LOCK_NAME, fair=kind == "fair", **options)

        return lambda: _Take(current[0], [LOCK_NAME], retire=retire)
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
        # One group object per choice of names, kept for the whole run (as an app keeps
        # its locks), but for those retired.
        groups: dict[tuple[str, ...], LockGroup] = {}

        def group() -> _Take:
            names = rng.sample(GROUP_NAMES, rng.randint(2, len(GROUP_NAMES)))
            key = tuple(names)
            lock = groups.get(key)
            if lock is None:
                lock = groups[key] = LockGroup(names, **options)
            return _Take(
                lock,
                names,
                extra={"group": names},
                retire=lambda: client.retired.append(groups.pop(key)),
            )

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
    # A cancellation waits for the database call to finish: its thread would commit
    # anyway, after the hold, and the history would not say so.
    future = asyncio.ensure_future(sync_to_async(call)(*args))
    cancelled: asyncio.CancelledError | None = None
    while not future.done():
        try:
            await asyncio.wait([future])
        except asyncio.CancelledError as error:
            cancelled = error
    if cancelled is not None:
        raise cancelled
    return future.result()


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

    def not_taken(outcome: Outcome, detail: str, extra: dict[str, Any]) -> None:
        for name in take.names:
            client.record(
                "acquire",
                name,
                start,
                outcome,
                hold=holds[name],
                detail=detail,
                extra=extra,
                **common,
            )

    try:
        got = await api.acquire(take.lock, blocking_timeout)
    except LockError as error:
        not_taken("info", repr(error), take.extra)
        if take.retire is not None:
            take.retire()
        await asyncio.sleep(ERROR_BACKOFF)
        return
    except _INTERRUPTIONS as error:
        if take.retire is not None:
            take.retire()
        interrupted = {**take.extra, "interrupted": _how(api, error)}
        not_taken("info", f"interrupted: {error!r}", interrupted)
        raise
    if not got:
        not_taken("fail", "busy" if blocking_timeout == 0 else "timeout", take.extra)
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
                await api.release(take.inner, armable=False)
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
    extra = take.extra
    try:
        await api.release(take.lock)
    except _INTERRUPTIONS as error:
        if take.retire is not None:
            take.retire()
        # Given up by its caller: the hold may or may not have been released.
        _record_release(
            client,
            take,
            start,
            "info",
            f"interrupted: {error!r}",
            extra={**take.extra, "interrupted": _how(api, error)},
            believed=believed,
        )
        raise
    except LockLost as error:
        outcome, detail = "fail", f"lost: {error}"
    except LockNotOwned as error:
        outcome, detail = "fail", f"not owned: {error}"
    except LockError as error:  # Redis unreachable or refusing: unknown
        outcome, detail = "info", repr(error)
        if take.retire is not None:
            take.retire()
    _record_release(client, take, start, outcome, detail, extra=extra, believed=believed)


def _record_release(
    client: _Client,
    take: _Take,
    start: float,
    outcome: Outcome,
    detail: str,
    *,
    extra: dict[str, Any],
    believed: dict[str, float],
) -> None:
    """Record the release of ``take``'s names; ``believed``: the lease end each holder
    believed in when the release began (:func:`_lease_ends`)."""
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
            extra=extra,
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


def _how(api: _Api, error: BaseException) -> str:
    """How a hold was interrupted, for the history."""
    if isinstance(error, KeyboardInterrupt):
        return "KeyboardInterrupt"
    return api.interrupter.style


async def _interruptible(api: _Api, hold: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run one hold the way the caller's faults can interrupt it (see the module
    docstring); an interruption ends the hold, and the client goes on."""
    interrupter = api.interrupter
    if not api.asynchronous:
        with contextlib.suppress(KeyboardInterrupt):  # recorded where it landed
            await hold()
        return
    style = interrupter.style = interrupter.rng.choice(CANCELLATIONS)
    try:
        if style == "timeout":
            await _under_timeout(interrupter, hold)
        elif style == "taskgroup":
            await _beside_failing_sibling(interrupter, hold)
        else:
            await _cancelled_twice(interrupter, hold)
    finally:
        interrupter.cancel = None


async def _under_timeout(
    interrupter: _Interrupter, hold: Callable[[], Coroutine[Any, Any, None]]
) -> None:
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(None) as scope:
            interrupter.cancel = lambda: scope.reschedule(loop.time())
            await hold()
    except TimeoutError:
        pass  # the timeout expired: recorded where it landed


async def _beside_failing_sibling(
    interrupter: _Interrupter, hold: Callable[[], Coroutine[Any, Any, None]]
) -> None:
    failed = asyncio.Event()

    async def sibling() -> None:
        await failed.wait()
        raise _SiblingFailed

    try:
        async with asyncio.TaskGroup() as group:
            interrupter.cancel = failed.set
            helper = group.create_task(sibling())
            main = group.create_task(hold())
            main.add_done_callback(lambda _task: helper.cancel())
    except* _SiblingFailed:
        pass  # the hold was cancelled: recorded where it landed


async def _cancelled_twice(
    interrupter: _Interrupter, hold: Callable[[], Coroutine[Any, Any, None]]
) -> None:
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(hold())

    def twice() -> None:
        task.cancel()
        loop.call_later(interrupter.rng.uniform(0.0, 0.002), task.cancel)

    interrupter.cancel = twice
    await asyncio.wait([task])
    if not task.cancelled() and task.exception() is not None:
        raise task.exception()  # type: ignore[misc]


class _SiblingFailed(Exception):
    """What the failing ``TaskGroup`` sibling raises."""


async def _run(spec: dict[str, Any]) -> None:
    configure(spec["database"])
    if spec.get("mutant"):
        apply_mutant(spec["mutant"])
    backend = backend_for(spec["target"], min_replicas=spec["min_replicas"])
    asynchronous = spec["kind"].endswith("-async")
    interrupter = _Interrupter(spec["seed"] + 7919, asynchronous)
    interrupter.install(asyncio.get_running_loop())
    api = _Api(asynchronous, interrupter)
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
            take = choose()
            await _interruptible(api, lambda take=take: _one_hold(client, api, take))
            await asyncio.sleep(client.rng.uniform(*PAUSE_SECONDS))


def main(argv: list[str]) -> None:
    """Run one client process (``python -m tests.support.chaos.workloads SPEC_JSON``)."""
    (spec,) = argv
    asyncio.run(_run(json.loads(spec)))


if __name__ == "__main__":
    main(sys.argv[1:])
