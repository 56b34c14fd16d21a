"""Worker processes for the multi-process tests of lock kinds, and the analysis of what
they recorded.

``python -m tests.support.kind_workers SCENARIO SPEC_JSON`` builds a backend for the
spec's ``target`` (see :func:`backend_for`), warms it (connections open, scripts loaded,
on a name of its own), prints ``ready``, waits for a line on stdin, runs the scenario
and prints one JSON line: ``{"records": [...]}``. Scenarios:

- ``cycle``: until ``duration`` seconds are over, take ``Lock(name, **options)`` (with
  ``names``, a ``LockGroup`` of ``name`` and those), hold it a random ``hold`` (seconds,
  ``[low, high]``), release it, pause a random ``pause``; each record is ``[called, got,
  leaving, fence]`` (``time.monotonic_ns()``: acquire called, acquire returned, release
  about to be called; the fence of ``name``).
- ``group``: ``iterations`` times, take a random subset (1 to ``max_size``) of ``names``
  in a random order, with ``LockGroup`` (a plain ``Lock`` for one name), hold it a random
  ``hold``; each record is ``[names, got, leaving, fences]``.
- ``hold``: take ``Lock(name, **options)`` (``depth`` of them, for re-entrant locks), or
  with ``names`` a ``LockGroup``, print ``acquired {tokens}`` (JSON: name -> token)
  instead of ``ready``, and hold until a line arrives on stdin (then release and print
  ``released``) or the worker is killed. Renewal is on (the default): only the kill
  or the release ends the hold.

``CLOCK_MONOTONIC`` is one clock for every process on Linux, so intervals recorded by
different processes can be compared. A record's ``[got, leaving]`` lies inside the time
Redis saw the hold (the acquire script ran before ``got``, the release script runs after
``leaving``), so intervals that overlap beyond what a kind allows prove a violation.

With ``"api": "async"`` a worker uses ``aacquire``/``arelease`` in one task; otherwise
the sync methods (called from the same single task: nothing else runs on its loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel

from django_distlock.engine import Backend, Lock, LockGroup
from django_distlock.engine.keys import bucket_of
from tests.support import REPO_ROOT

__all__ = [
    "Topology",
    "Workers",
    "account_names",
    "backend_for",
    "cluster_target",
    "max_overlap",
    "overlapping_pairs",
    "sentinel_target",
    "single_target",
]

Target = dict[str, Any]


@dataclass
class Topology:
    """Where a test's workers take their locks: ``name`` (``"single"``, ``"cluster"``),
    the spec workers get (``target``) and a client of it to look at keys (a
    ``RedisCluster`` on a cluster)."""

    name: str
    target: Target
    client: Any


def single_target(url: str) -> Target:
    """A target spec for one server at ``url``."""
    return {"single": url}


def cluster_target(urls: Sequence[str]) -> Target:
    """A target spec for a cluster seeded with ``urls``."""
    return {"cluster": list(urls)}


def sentinel_target(sentinels: Sequence[tuple[str, int]], service: str) -> Target:
    """A target spec for the primary of Sentinel ``service``."""
    return {"sentinels": [list(address) for address in sentinels], "service": service}


def backend_for(target: Target, **options: Any) -> Backend:
    """A backend on ``target``, sync and async, as the Django settings would build it."""
    if "cluster" in target:
        return Backend(cluster=target["cluster"], **options)
    if "sentinels" in target:
        sentinels = [tuple(address) for address in target["sentinels"]]
        service = target["service"]
        client = redis.sentinel.Sentinel(sentinels).master_for(service)

        def async_primary() -> redis.asyncio.Redis:
            return redis.asyncio.sentinel.Sentinel(sentinels).master_for(service)

        return Backend(client, async_client=async_primary, **options)
    url = target["single"]
    return Backend(
        redis.Redis.from_url(url),
        async_client=lambda: redis.asyncio.Redis.from_url(url),
        **options,
    )


def account_names(count: int) -> list[str]:
    """``count`` lock names (``account:N``), the last in the bucket of the first: on a
    cluster one script takes those two together, the others spread over the nodes."""
    names = [f"account:{number}" for number in range(count - 1)]
    twin = next(
        name
        for name in (f"account:twin-{n}" for n in range(100_000))
        if bucket_of(name) == bucket_of(names[0])
    )
    return [*names, twin]


# -- the parent's side ------------------------------------------------------------------


class Workers:
    """Worker processes started together and released at once.

    >>> with Workers([("cycle", spec)] * 8) as workers:  # doctest: +SKIP
    ...     results = workers.run(timeout=60)
    """

    def __init__(self, jobs: Iterable[tuple[str, dict[str, Any]]]) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        self.processes = [
            subprocess.Popen(
                [sys.executable, "-m", "tests.support.kind_workers", scenario, json.dumps(spec)],
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for scenario, spec in jobs
        ]

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.kill()

    def first_lines(self) -> list[str]:
        """Each worker's first line (``ready``, or ``acquired ...`` for ``hold``)."""
        lines = []
        for process in self.processes:
            assert process.stdout is not None
            line = process.stdout.readline().strip()
            if not line:
                raise AssertionError(f"a worker failed to start:\n{self._stderr(process)}")
            lines.append(line)
        return lines

    def run(self, timeout: float) -> list[list[Any]]:
        """Wait until all are ready, start them at once, and return each one's records;
        a worker that fails, or does not finish within ``timeout`` seconds, fails the
        test with its output."""
        assert self.first_lines() == ["ready"] * len(self.processes)
        for process in self.processes:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        deadline = time.monotonic() + timeout
        results = []
        for process in self.processes:
            try:
                out, err = process.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(
                    f"a worker did not finish within {timeout}s (deadlock?):\n"
                    + "\n".join(self._stderr(p) for p in self.processes)
                ) from None
            if process.returncode != 0:
                raise AssertionError(f"a worker failed ({process.returncode}):\n{err}")
            results.append(json.loads(out.strip().splitlines()[-1])["records"])
        return results

    def tell(self, index: int, line: str) -> str:
        """Send ``line`` to worker ``index`` and return the line it answers."""
        process = self.processes[index]
        assert process.stdin is not None
        assert process.stdout is not None
        process.stdin.write(f"{line}\n")
        process.stdin.flush()
        answer = process.stdout.readline().strip()
        if not answer:
            raise AssertionError(f"a worker failed:\n{self._stderr(process)}")
        return answer

    def kill(self, index: int | None = None) -> None:
        """SIGKILL worker ``index`` (default: every one still running)."""
        chosen = self.processes if index is None else [self.processes[index]]
        for process in chosen:
            if process.poll() is None:
                process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired, ValueError):
                process.communicate(timeout=10)

    @staticmethod
    def _stderr(process: subprocess.Popen[str]) -> str:
        if process.poll() is None:
            process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired, ValueError):
            _out, err = process.communicate(timeout=10)
            return err or ""
        return ""


def max_overlap(intervals: Iterable[tuple[int, int]]) -> int:
    """The most intervals ``(start, end)`` open at one instant (touching ones do not
    overlap)."""
    events = sorted(
        [(start, 1) for start, _end in intervals] + [(end, -1) for _start, end in intervals]
    )  # at equal times -1 sorts first: an end and a start at one instant do not overlap
    open_now = most = 0
    for _at, step in events:
        open_now += step
        most = max(most, open_now)
    return most


def overlapping_pairs(
    intervals: Sequence[tuple[int, int]], others: Sequence[tuple[int, int]]
) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Pairs of an interval of ``intervals`` and one of ``others`` that overlap (an
    interval is not compared with itself)."""
    found = []
    ordered = sorted(others)
    for interval in intervals:
        start, end = interval
        for other in ordered:
            if other[0] >= end:
                break
            if other is not interval and other[1] > start:
                found.append((interval, other))
    return found


# -- the worker's side -------------------------------------------------------------------


def _spans(spec: dict[str, Any], rng: random.Random, key: str) -> float:
    low, high = spec.get(key, (0, 0))
    return rng.uniform(low, high)


class _Api:
    """The sync or the async methods of a lock, awaited alike."""

    def __init__(self, name: str) -> None:
        self.asynchronous = name == "async"

    async def acquire(self, lock: Lock | LockGroup) -> bool:
        return await lock.aacquire() if self.asynchronous else lock.acquire()

    async def release(self, lock: Lock | LockGroup) -> None:
        if self.asynchronous:
            await lock.arelease()
        else:
            lock.release()

    async def sleep(self, seconds: float) -> None:
        if self.asynchronous:
            await asyncio.sleep(seconds)
        elif seconds > 0:
            time.sleep(seconds)  # noqa: ASYNC251 - the sync API's worker blocks, as it would


async def _warm(backend: Backend, api: _Api) -> None:
    warm = Lock(f"warm-up:{os.getpid()}", backend=backend, timeout=10)
    for _ in range(2):
        assert await api.acquire(warm)
        await api.release(warm)


async def _cycle(backend: Backend, spec: dict[str, Any], api: _Api) -> list[Any]:
    rng = random.Random(spec.get("seed"))
    name = spec["name"]
    options = spec.get("options", {})
    lock: Lock | LockGroup
    if "names" in spec:
        lock = LockGroup([name, *spec["names"]], backend=backend, **options)
    else:
        lock = Lock(name, backend=backend, **options)
    clock = time.monotonic_ns
    records = []
    end = clock() + int(spec["duration"] * 1e9)
    while clock() < end:
        called = clock()
        assert await api.acquire(lock)
        got = clock()
        await api.sleep(_spans(spec, rng, "hold"))
        leaving = clock()
        fence = lock.fences[name] if isinstance(lock, LockGroup) else lock.fence
        await api.release(lock)
        records.append([called, got, leaving, fence])
        await api.sleep(_spans(spec, rng, "pause"))
    return records


async def _group(backend: Backend, spec: dict[str, Any], api: _Api) -> list[Any]:
    rng = random.Random(spec.get("seed"))
    names = spec["names"]
    clock = time.monotonic_ns
    records = []
    for _ in range(spec["iterations"]):
        chosen = rng.sample(names, rng.randint(1, spec["max_size"]))  # a random order
        lock: Lock | LockGroup
        if len(chosen) == 1:
            lock = Lock(chosen[0], backend=backend, timeout=10)
        else:
            lock = LockGroup(chosen, backend=backend, timeout=10)
        assert await api.acquire(lock)
        got = clock()
        fences = lock.fences if isinstance(lock, LockGroup) else {chosen[0]: lock.fence}
        await api.sleep(_spans(spec, rng, "hold"))
        leaving = clock()
        await api.release(lock)
        records.append([chosen, got, leaving, fences])
    return records


async def _hold(backend: Backend, spec: dict[str, Any], api: _Api) -> None:
    locks: list[Lock | LockGroup]
    if "names" in spec:
        group = LockGroup(spec["names"], backend=backend, **spec.get("options", {}))
        locks = [group]
        assert await api.acquire(group)
        tokens = {name: lock.token for name, lock in group.locks.items()}
    else:
        locks = [
            Lock(spec["name"], backend=backend, **spec.get("options", {}))
            for _ in range(spec.get("depth", 1))
        ]
        for lock in locks:
            assert await api.acquire(lock)
        tokens = {spec["name"]: locks[0].token}
    print(f"acquired {json.dumps(tokens)}", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    for lock in reversed(locks):
        await api.release(lock)
    print("released", flush=True)


_SCENARIOS = {"cycle": _cycle, "group": _group}


async def _main(scenario: str, spec: dict[str, Any]) -> None:
    backend = backend_for(spec["target"])
    api = _Api(spec.get("api", "sync"))
    await _warm(backend, api)
    if scenario == "hold":
        await _hold(backend, spec, api)
        return
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    records = await _SCENARIOS[scenario](backend, spec, api)
    print(json.dumps({"records": records}), flush=True)


def _run(argv: list[str]) -> None:
    scenario, spec = argv
    asyncio.run(_main(scenario, json.loads(spec)))


if __name__ == "__main__":
    _run(sys.argv[1:])
