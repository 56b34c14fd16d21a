"""Scenario 1: uncontended acquire+release in one process, interleaved in rounds.

Each implementation runs ``cycles`` acquire+release cycles on its own lock name per
round; the order of implementations rotates from round to round so that slow phases of
a noisy machine hit everyone. The ratio to the floor is taken per round (same round,
same conditions) and the median over rounds is reported.

The async rows (``redis.asyncio``) run in the same rounds, on one event loop kept for the
whole run: a batch of cycles is one coroutine, each cycle timed inside it (``await
acquire(); await release()``), so the loop's start-up per batch is not counted.
"""

from __future__ import annotations

import asyncio
import gc
import time
from dataclasses import dataclass, field
from typing import Any

import impls
import redis
from stats import median, percentile

# Commands that the benchmark itself sends to read the counters.
_OWN_COMMANDS = ("cmdstat_info", "cmdstat_config|resetstat")


@dataclass
class Result:
    key: str
    durations_ns: list[int] = field(default_factory=list)
    round_means_ns: list[float] = field(default_factory=list)
    round_p50s_ns: list[float] = field(default_factory=list)
    total_ns: int = 0
    cycles: int = 0
    requests: int = 0
    server_commands: int = 0
    server_script_us: float = 0.0
    client_cpu_ns: int = 0
    server_cpu_s: float = 0.0
    error: str = ""

    @property
    def ops_per_s(self) -> float:
        return self.cycles / (self.total_ns / 1e9) if self.total_ns else float("nan")

    @property
    def mean_us(self) -> float:
        """Mean time of one cycle, in microseconds."""
        return self.total_ns / self.cycles / 1000 if self.cycles else float("nan")

    def p(self, q: float) -> float:
        """Percentile of one cycle, in microseconds."""
        return percentile(self.durations_ns, q) / 1000


def server_commands(stats_client: redis.Redis) -> int:
    stats = stats_client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k not in _OWN_COMMANDS)


def server_script_us(stats_client: redis.Redis) -> float:
    """Microseconds the server spent running scripts (``EVALSHA``/``EVAL``, the commands
    they call included), from ``INFO commandstats``."""
    stats = stats_client.info("commandstats")
    return sum(float(stats.get(k, {}).get("usec", 0)) for k in ("cmdstat_evalsha", "cmdstat_eval"))


def server_cpu(stats_client: redis.Redis) -> float:
    cpu = stats_client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def _batch(key: str, handle: impls.Handle, cycles: int) -> tuple[list[int], int]:
    """``cycles`` acquire+release: per-cycle and total nanoseconds."""
    durations = [0] * cycles
    clock = time.perf_counter_ns
    batch_start = clock()
    for i in range(cycles):
        t0 = clock()
        if not handle.acquire():
            raise RuntimeError(f"{key}: uncontended acquire returned False")
        handle.release()
        durations[i] = clock() - t0
    return durations, clock() - batch_start


async def _abatch(key: str, handle: impls.AsyncHandle, cycles: int) -> tuple[list[int], int]:
    """The async twin of :func:`_batch` (timed inside the running loop)."""
    durations = [0] * cycles
    clock = time.perf_counter_ns
    batch_start = clock()
    for i in range(cycles):
        t0 = clock()
        if not await handle.acquire():
            raise RuntimeError(f"{key}: uncontended acquire returned False")
        await handle.release()
        durations[i] = clock() - t0
    return durations, clock() - batch_start


async def _amake(key: str, port: int, clients: list[Any]) -> impls.AsyncHandle:
    client = impls.make_async_client(port)
    clients.append(client)
    handle: impls.AsyncHandle = impls.make(key, port, f"uncontended:{key}", client=client)
    return handle


async def _aclose(clients: list[Any]) -> None:
    for client in clients:
        await client.aclose()


def run(port: int, keys: list[str], *, rounds: int, cycles: int, warmup: int) -> dict[str, Result]:
    """Run the interleaved rounds in this process; returns one result per key."""
    stats_client = redis.Redis(host=impls.HOST, port=port)
    loop = asyncio.new_event_loop()
    async_clients: list[Any] = []
    try:
        return _run(
            loop,
            stats_client,
            port,
            keys,
            async_clients,
            rounds=rounds,
            cycles=cycles,
            warmup=warmup,
        )
    finally:
        # Our backend's async connections are closed by the loop's shutdown hooks.
        loop.run_until_complete(_aclose(async_clients))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
        stats_client.close()


def _run(
    loop: asyncio.AbstractEventLoop,
    stats_client: redis.Redis,
    port: int,
    keys: list[str],
    async_clients: list[Any],
    *,
    rounds: int,
    cycles: int,
    warmup: int,
) -> dict[str, Result]:
    handles: dict[str, Any] = {}
    for key in keys:
        if impls.IMPLS[key].is_async:
            handles[key] = loop.run_until_complete(_amake(key, port, async_clients))
        else:
            handles[key] = impls.make(key, port, f"uncontended:{key}")

    def batch(key: str, n: int) -> tuple[list[int], int]:
        if impls.IMPLS[key].is_async:
            return loop.run_until_complete(_abatch(key, handles[key], n))
        return _batch(key, handles[key], n)

    results = {key: Result(key) for key in keys}
    for key in keys:
        batch(key, warmup)

    for r in range(rounds):
        order = keys[r % len(keys) :] + keys[: r % len(keys)]
        for key in order:
            result = results[key]
            gc.collect()
            requests_before = impls.requests_sent()
            commands_before = server_commands(stats_client)
            scripts_before = server_script_us(stats_client)
            server_cpu_before = server_cpu(stats_client)
            cpu_before = time.process_time_ns()
            durations, batch_ns = batch(key, cycles)
            result.client_cpu_ns += time.process_time_ns() - cpu_before
            result.server_cpu_s += server_cpu(stats_client) - server_cpu_before
            result.requests += impls.requests_sent() - requests_before
            result.server_commands += server_commands(stats_client) - commands_before
            result.server_script_us += server_script_us(stats_client) - scripts_before
            result.durations_ns.extend(durations)
            result.round_means_ns.append(batch_ns / cycles)
            result.round_p50s_ns.append(percentile(durations, 50))
            result.total_ns += batch_ns
            result.cycles += cycles
    return results


def ratios(
    results: dict[str, Result], key: str, base_key: str | None = None
) -> tuple[float, float]:
    """Median over rounds of (mean cycle time / the base's) and (p50 / the base's p50);
    the base is the floor of ``key``'s API (sync or async) unless ``base_key`` is given."""
    mine, base = results[key], results[base_key or impls.IMPLS[key].floor]
    by_mean = [m / b for m, b in zip(mine.round_means_ns, base.round_means_ns, strict=True)]
    by_p50 = [m / b for m, b in zip(mine.round_p50s_ns, base.round_p50s_ns, strict=True)]
    return median(by_mean), median(by_p50)
