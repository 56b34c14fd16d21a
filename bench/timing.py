"""What every interleaved benchmark does the same way: where the client and the server
run (CPU placement), which implementation goes first in a round, and a timed loop of
calls. Callers put ``bench/`` and the repository root on ``sys.path``."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tests.support.redis_servers import RedisServer
from tests.support.servers import set_process_affinity

T = TypeVar("T")

PLACEMENTS = ("split", "same", "none")
"""``split``: this process on the first CPU, the server on the second; ``same``: both on
the first; ``none``: left to the scheduler."""


def place(pin: str, server: RedisServer, cpus: Sequence[int] | None = None) -> str:
    """Pin this process (every thread) and ``server`` for placement ``pin`` (one of
    :data:`PLACEMENTS`; ``split`` falls back to ``same`` with one usable CPU); return
    what was done, for the report."""
    usable = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if pin == "none":
        set_process_affinity(os.getpid(), set(usable))
        server.pin(set(usable))
        return "not pinned"
    client_cpu = usable[0]
    server_cpu = usable[1] if pin == "split" and len(usable) > 1 else client_cpu
    set_process_affinity(os.getpid(), {client_cpu})
    server.pin({server_cpu})
    if server_cpu != client_cpu:
        return f"client pinned to CPU {client_cpu}, server to CPU {server_cpu}"
    return f"client and server both pinned to CPU {client_cpu}"


def rotated(items: Sequence[T], round_number: int) -> list[T]:
    """``items`` starting at position ``round_number`` (modulo their number): each round
    of an interleaved run starts with another one, so that none always runs first (on a
    cold cache, after the pause between rounds)."""
    if not items:
        return []
    shift = round_number % len(items)
    return [*items[shift:], *items[:shift]]


@dataclass(frozen=True)
class Timed:
    """One timed loop: each call's duration, the whole loop's and its process CPU (ns)."""

    durations: list[int]
    total_ns: int
    cpu_ns: int

    @property
    def mean_ns(self) -> float:
        return self.total_ns / len(self.durations) if self.durations else 0.0


def timed(call: Callable[[int], Any], count: int, *, collect: bool = True) -> Timed:
    """``call(0)`` ... ``call(count - 1)``, each timed; process CPU time (all threads)
    counted over the loop. Garbage is collected first unless ``collect`` is false, so
    that no earlier loop's garbage is collected inside this one."""
    if collect:
        gc.collect()
    durations = [0] * count
    clock = time.perf_counter_ns
    cpu_before = time.process_time_ns()
    start = clock()
    for i in range(count):
        t0 = clock()
        call(i)
        durations[i] = clock() - t0
    end = clock()
    return Timed(durations, end - start, time.process_time_ns() - cpu_before)
