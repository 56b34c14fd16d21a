"""Scenario 1: uncontended acquire+release in one process, interleaved in rounds.

Each implementation runs ``cycles`` acquire+release cycles on its own lock name per
round; the order of implementations rotates from round to round so that slow phases of
a noisy machine hit everyone. The ratio to the floor is taken per round (same round,
same conditions) and the median over rounds is reported.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field

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
    client_cpu_ns: int = 0
    server_cpu_s: float = 0.0
    error: str = ""

    @property
    def ops_per_s(self) -> float:
        return self.cycles / (self.total_ns / 1e9) if self.total_ns else float("nan")

    def p(self, q: float) -> float:
        """Percentile of one cycle, in microseconds."""
        return percentile(self.durations_ns, q) / 1000


def _server_commands(stats_client: redis.Redis) -> int:
    stats = stats_client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k not in _OWN_COMMANDS)


def _server_cpu(stats_client: redis.Redis) -> float:
    cpu = stats_client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def run(port: int, keys: list[str], *, rounds: int, cycles: int, warmup: int) -> dict[str, Result]:
    """Run the interleaved rounds in this process; returns one result per key."""
    stats_client = redis.Redis(host=impls.HOST, port=port)
    handles = {key: impls.make(key, port, f"uncontended:{key}") for key in keys}
    results = {key: Result(key) for key in keys}
    for key, handle in handles.items():
        for _ in range(warmup):
            if not handle.acquire():
                raise RuntimeError(f"{key}: uncontended acquire failed during warm-up")
            handle.release()

    for r in range(rounds):
        order = keys[r % len(keys) :] + keys[: r % len(keys)]
        for key in order:
            handle, result = handles[key], results[key]
            durations = [0] * cycles
            gc.collect()
            requests_before = impls.requests_sent()
            commands_before = _server_commands(stats_client)
            server_cpu_before = _server_cpu(stats_client)
            cpu_before = time.process_time_ns()
            clock = time.perf_counter_ns
            batch_start = clock()
            for i in range(cycles):
                t0 = clock()
                if not handle.acquire():
                    raise RuntimeError(f"{key}: uncontended acquire returned False")
                handle.release()
                durations[i] = clock() - t0
            batch_ns = clock() - batch_start
            result.client_cpu_ns += time.process_time_ns() - cpu_before
            result.server_cpu_s += _server_cpu(stats_client) - server_cpu_before
            result.requests += impls.requests_sent() - requests_before
            result.server_commands += _server_commands(stats_client) - commands_before
            result.durations_ns.extend(durations)
            result.round_means_ns.append(batch_ns / cycles)
            result.round_p50s_ns.append(percentile(durations, 50))
            result.total_ns += batch_ns
            result.cycles += cycles
    return results


def ratios(results: dict[str, Result], key: str, floor: str = "floor") -> tuple[float, float]:
    """Median over rounds of (mean cycle time / floor's) and (p50 / floor's p50)."""
    mine, base = results[key], results[floor]
    by_mean = [m / b for m, b in zip(mine.round_means_ns, base.round_means_ns, strict=True)]
    by_p50 = [m / b for m, b in zip(mine.round_p50s_ns, base.round_p50s_ns, strict=True)]
    return median(by_mean), median(by_p50)
