"""django-distlock benchmark: this engine side by side with redis-py's Lock,
python-redis-lock and pottery's Redlock, against one private server and a private
3-primary cluster.

    .venv/bin/python bench/run.py            # full run, about 8-10 minutes
    .venv/bin/python bench/run.py --quick    # about 2 minutes

Prints Markdown tables and writes them to bench/results.md. See bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import hashlib
import importlib.util
import multiprocessing
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for path in (str(HERE), str(ROOT)):  # sibling modules and tests/, also when imported
    if path not in sys.path:
        sys.path.insert(0, path)

import contended  # noqa: E402
import crash  # noqa: E402
import impls  # noqa: E402
import uncontended  # noqa: E402
from impls import Target  # noqa: E402
from server import bench_cluster, bench_server  # noqa: E402
from stats import fmt, table  # noqa: E402
from timing import place, rotated  # noqa: E402

from tests.support.redis_servers import RedisServer  # noqa: E402
from tests.support.servers import set_process_affinity  # noqa: E402

UNCONTENDED = [
    "floor",
    "distlock",
    "distlock-norenew",
    "distlock-fair",
    "redis-py",
    "python-redis-lock",
    "pottery",
    "afloor",
    "adistlock",
    "adistlock-norenew",
    "aredis-py",
]
CONTENDED = ["distlock", "distlock-fair", "redis-py", "python-redis-lock", "pottery"]
SCENARIOS = ("uncontended", "contended", "crash")
PLACEMENTS = ("split", "same", "none")
TOPOLOGIES = ("single", "cluster")
TOPOLOGY_LABELS = {"single": "single server", "cluster": "3-primary cluster"}
PEER_MODULES = {"python-redis-lock": "redis_lock", "pottery": "pottery"}
# Rows held to the fast-path target (at or below redis-py's Lock of the same API).
FAST_PATH = ("distlock", "distlock-norenew", "adistlock", "adistlock-norenew")


def label(key: str) -> str:
    return impls.IMPLS[key].label


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(HERE.parent), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def engine_digest() -> str:
    """A digest of the engine's source, to notice it changing during a run."""
    digest = hashlib.sha256()
    for path in sorted((HERE.parent / "django_distlock").rglob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def machine_info(server: RedisServer, topologies: list[str]) -> str:
    v = impls.versions()
    lines = [
        f"- Date: {time.strftime('%Y-%m-%d %H:%M %Z')}; django-distlock {git_commit()} "
        f"(source digest {engine_digest()})",
        f"- CPU: {cpu_model()}; {os.cpu_count()} logical CPUs "
        f"(usable: {sorted(os.sched_getaffinity(0))}); {platform.system()} "
        f"{platform.release()}",
        f"- Python {platform.python_version()}; redis-py {v['redis']} "
        f"(hiredis {v['hiredis']}); python-redis-lock {v['python-redis-lock']}; "
        f"pottery {v['pottery']}",
        f"- Server: {server.version()} ({Path(server.binary).name}), loopback TCP, no persistence",
    ]
    if "cluster" in topologies:
        lines.append(
            "- Cluster: 3 primaries, no replicas, same binary, loopback (the suite's "
            "`ClusterSetup`, `tests/support/topologies.py`), started after the uncontended "
            "case; our locks on it through `Backend(cluster=[seed URLs])`, redis-py's `Lock` "
            "and pottery through a `redis.cluster.RedisCluster` client"
        )
    lines.append(f"- Load average at the start: {load()}")
    return "\n".join(lines)


def load() -> str:
    """The machine's load average (1, 5, 15 minutes): other work competing for the CPUs."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f}"


class Report:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def add(self, text: str) -> None:
        print(text, flush=True)
        print(flush=True)
        self.parts.append(text)

    def write(self, path: Path) -> None:
        path.write_text("\n\n".join(self.parts) + "\n")


# -- 1. uncontended -----------------------------------------------------------------------

PLACEMENT_LABELS = {
    "split": "client and server on 2 CPUs",
    "same": "both on 1 CPU",
    "none": "unpinned",
}


Uncontended = dict[str, dict[str, uncontended.Result]]


def run_uncontended(
    server: RedisServer, report: Report, args: argparse.Namespace, checks: list[str]
) -> Uncontended:
    cpus = sorted(os.sched_getaffinity(0))
    by_placement: Uncontended = {}
    for pin in args.pins:
        if pin == "split" and len(cpus) < 2:
            report.add(f"### 1. Uncontended, {pin}: skipped (only one usable CPU)")
            continue
        where = place(pin, server, cpus)
        print(f"  uncontended: {where}", flush=True)
        try:
            results = uncontended.run(
                server.port,
                UNCONTENDED,
                rounds=args.rounds,
                cycles=args.cycles,
                warmup=args.warmup,
            )
        finally:
            set_process_affinity(os.getpid(), set(cpus))
            server.pin(set(cpus))
        by_placement[pin] = results
        report.add(_uncontended_table(results, args, where))
        checks.extend(_uncontended_checks(results, pin))
    return by_placement


def _uncontended_table(
    results: dict[str, uncontended.Result], args: argparse.Namespace, where: str
) -> str:
    rows = []
    for key in UNCONTENDED:
        r = results[key]
        by_mean, by_p50 = uncontended.ratios(results, key)
        peer = impls.IMPLS[key].peer
        vs_mean, vs_p50 = uncontended.ratios(results, key, peer) if peer in results else (None,) * 2
        rows.append(
            [
                label(key),
                fmt(r.mean_us, 0),
                fmt(r.p(50), 0),
                fmt(r.p(99), 0),
                fmt(by_mean, 2),
                fmt(by_p50, 2),
                fmt(vs_mean, 2),
                fmt(vs_p50, 2),
                fmt(r.requests / r.cycles, 2),
                fmt(r.server_commands / r.cycles, 1),
                fmt(r.client_cpu_ns / r.cycles / 1000, 0),
                fmt(r.server_cpu_s / r.cycles * 1e6, 0),
                fmt(
                    (r.server_cpu_s / r.cycles)
                    / (results[peer].server_cpu_s / results[peer].cycles),
                    2,
                )
                if peer in results and results[peer].server_cpu_s
                else "n/a",
                fmt(r.server_script_us / r.cycles, 1),
            ]
        )
    return (
        f"### 1. Uncontended acquire+release, {where} (one process, {args.rounds} "
        f"interleaved rounds x {args.cycles} cycles per implementation; load "
        f"{load()})\n\n"
        + table(
            [
                "implementation",
                "mean µs",
                "p50 µs",
                "p99 µs",
                "x floor (mean)",
                "x floor (p50)",
                "x redis-py Lock (mean)",
                "x redis-py Lock (p50)",
                "round trips/cycle",
                "server cmds/cycle",
                "client CPU µs/cycle",
                "server CPU µs/cycle",
                "server CPU x redis-py Lock",
                "server µs in scripts/cycle",
            ],
            rows,
        )
        + "\n\n`mean µs`: one acquire+release cycle. `x floor`, `x redis-py Lock`: median "
        "over rounds of this implementation's cycle time divided by the floor's (redis-py "
        "`Lock`'s) of the same API in the same round: sync rows against the sync floor and "
        "`redis.Redis().lock()`, async rows against the async floor and "
        "`redis.asyncio.Redis().lock()`. `round trips/cycle`: requests the client wrote "
        "(counted in the connection). `server cmds/cycle`: `INFO commandstats` calls, "
        "including the commands run inside Lua scripts. CPU: process CPU time of the "
        "benchmark process (all its threads) and of the server (INFO cpu), per cycle; "
        "`server CPU x redis-py Lock`: per cycle, against redis-py's `Lock` of the same API. "
        "`server µs in scripts/cycle`: `INFO commandstats` usec of `EVALSHA`/`EVAL` (the "
        "commands a script calls included); the rest of the server's CPU is reading "
        "requests, writing replies and its event loop, about the same per round trip for "
        "every implementation."
    )


def _uncontended_checks(results: dict[str, uncontended.Result], pin: str) -> list[str]:
    checks = []
    place = PLACEMENT_LABELS[pin]
    for api, keys in (("sync", FAST_PATH[:2]), ("async", FAST_PATH[2:])):
        keys = tuple(k for k in keys if k in results)
        if not keys:
            continue
        peer = impls.IMPLS[keys[0]].peer
        vs = {k: uncontended.ratios(results, k, peer) for k in keys}
        floor = {k: uncontended.ratios(results, k) for k in keys}
        worst_vs = max(p50 for _, p50 in vs.values())
        worst_floor = max(p50 for _, p50 in floor.values())
        checks.append(
            f"{'PASS' if worst_vs <= 1.10 else 'FAIL'}: {place}, {api}: uncontended cycle at "
            + ", ".join(f"{vs[k][0]:.2f}x / {vs[k][1]:.2f}x ({label(k)})" for k in keys)
            + " redis-py's `Lock` (mean / p50; target: p50 <= 1.10x, issue 18)"
        )
        checks.append(
            f"{'PASS' if worst_floor <= 1.15 else 'FAIL'}: {place}, {api}: uncontended cycle "
            "at "
            + ", ".join(f"{floor[k][0]:.2f}x / {floor[k][1]:.2f}x ({label(k)})" for k in keys)
            + " the two-round-trip floor (mean / p50; target: p50 <= 1.15x)"
        )
        if peer in results and results[peer].server_cpu_s:
            base = results[peer].server_cpu_s / results[peer].cycles
            cpu = {k: results[k].server_cpu_s / results[k].cycles / base for k in keys}
            checks.append(
                f"{'PASS' if max(cpu.values()) <= 1.30 else 'FAIL'}: {place}, {api}: server "
                "CPU per uncontended cycle at "
                + ", ".join(f"{cpu[k]:.2f}x ({label(k)})" for k in keys)
                + " redis-py's `Lock` (target <= 1.30x, issue 18)"
            )
    return checks


# -- 2. contended -------------------------------------------------------------------------

Runnable = dict[str, dict[str, str | None]]
"""topology -> implementation -> why it cannot run there (``None``: it runs)."""


def _na(reason: str | None) -> str:
    return f"n/a: {reason}"


def run_contended(
    ctx: Any,
    targets: dict[str, Target],
    runnable: Runnable,
    report: Report,
    args: argparse.Namespace,
    checks: list[str],
) -> dict[str, dict[str, dict[str, float]]]:
    pairs = [(t, k) for t in targets for k in CONTENDED if runnable[t][k] is None]
    runs: dict[tuple[str, str], list[contended.Run]] = {pair: [] for pair in pairs}
    for r in range(args.contended_rounds):
        for topo, key in rotated(pairs, r):
            print(
                f"  contended: {key} on {TOPOLOGY_LABELS[topo]}, round "
                f"{r + 1}/{args.contended_rounds}",
                flush=True,
            )
            runs[(topo, key)].append(
                contended.run(
                    ctx,
                    key,
                    targets[topo],
                    workers=args.workers,
                    duration=args.duration,
                    tag=f"{topo}:{r}",
                )
            )
    latency_rows, fairness_rows = [], []
    problems: list[str] = []
    summaries: dict[str, dict[str, dict[str, float]]] = {t: {} for t in targets}
    for topo in targets:
        for key in CONTENDED:
            why = runnable[topo][key]
            head = [label(key), TOPOLOGY_LABELS[topo]]
            if why is not None:
                latency_rows.append([*head, _na(why), *["n/a"] * 8])
                fairness_rows.append([*head, _na(why), *["n/a"] * 6])
                continue
            s = summaries[topo][key] = contended.summary(runs[(topo, key)])
            latency_rows.append(
                [
                    *head,
                    fmt(s["throughput"], 0),
                    fmt(s["gap_other_p50"], 3),
                    fmt(s["gap_other_p99"], 3),
                    fmt(s["gap_other_done_p50"], 3),
                    fmt(s["gap_other_done_p99"], 3),
                    fmt(s["gap_all_p50"], 3),
                    fmt(s["gap_all_p99"], 3),
                    fmt(s["wait_p99"], 1),
                    fmt(s["wait_max"], 1),
                ]
            )
            fairness_rows.append(
                [
                    *head,
                    fmt(s["same_process_pct"], 0),
                    f"{s['min_acq']:.0f} / {s['max_acq']:.0f}",
                    fmt(s["worst_spread"], 0),
                    f"{s['starved']:.0f}",
                    fmt(s["requests_per_acq"], 1) if s["requests_per_acq"] else "-",
                    f"{s['lost_updates']:.0f} / {s['owner_overlaps']:.0f} / "
                    f"{s['interval_overlaps']:.0f}",
                    f"{s['errors']:.0f} / {s['hung']:.0f}",
                ]
            )
            where = f"{label(key)} ({TOPOLOGY_LABELS[topo]})"
            for run in runs[(topo, key)]:
                problems.extend(f"{where}: {e}" for e in run.errors[:3])
                if run.hung:
                    problems.append(f"{where}: workers {run.hung} did not finish (hung)")
                if run.violations:
                    problems.append(
                        f"{where}: violations: {run.lost_updates} lost updates, "
                        f"{run.owner_overlaps} owner-key overlaps, "
                        f"{run.interval_overlaps} overlapping intervals"
                    )
    text = (
        f"### 2. {args.workers} processes contending on one lock "
        f"({args.contended_rounds} interleaved round(s) x {args.duration:g} s each, "
        f"{' and '.join(TOPOLOGY_LABELS[t] for t in targets)}; load at the end {load()})"
        "\n\nLatency (ms):\n\n"
        + table(
            [
                "implementation",
                "topology",
                "acq/s",
                "handoff→other p50",
                "p99",
                "same, from release return: p50",
                "p99",
                "handoff→any p50",
                "p99",
                "wait p99",
                "wait max",
            ],
            latency_rows,
        )
        + "\n\nFairness and correctness:\n\n"
        + table(
            [
                "implementation",
                "topology",
                "same-process handoffs %",
                "min / max acq per process",
                "spread %",
                "starved",
                "lock requests/acq",
                "violations: lost updates / owner / overlap",
                "errors / hung",
            ],
            fairness_rows,
        )
        + "\n\n`handoff`: from the holder *calling* release() to the next holder's acquire() "
        "returning (`from release return`: from release() returning instead); `→other` "
        "= the next holder is another process, `→any` = all consecutive acquisitions. "
        "`wait`: acquire() call to return. `same-process handoffs`: share of handoffs where "
        "the releasing process took the lock again. `min / max acq per process`, `spread` "
        "= (busiest - idlest) / busiest and `starved` (processes with no acquisition in "
        "the window) are from the worst round. `lock requests/acq`: requests the lock "
        "clients sent (acquire/release, polls, waits, wake-ups) per acquisition. "
        "Violations are counted three ways: lost counter updates, owner key already set "
        "on entry, holding intervals that overlap on CLOCK_MONOTONIC. `n/a`: the "
        "implementation cannot run on that topology (one acquire+release of a free lock, "
        "called as its documentation shows, failed before the scenario; the reason follows)."
    )
    if problems:
        text += "\n\nProblems:\n\n" + "\n".join(
            "- " + p.replace("\n", "\n  ") for p in problems[:20]
        )
    report.add(text)

    for topo in targets:
        on = TOPOLOGY_LABELS[topo]
        if "distlock" not in summaries[topo] or "distlock-fair" not in summaries[topo]:
            checks.append(f"FAIL: {on}: our lock could not run")
            continue
        d, f = summaries[topo]["distlock"], summaries[topo]["distlock-fair"]
        for name, s in (("fair=False", d), ("fair=True", f)):
            checks.append(
                f"{'PASS' if s['gap_other_p50'] < 0.5 else 'FAIL'}: {on}, {name}: handoff to "
                f"another process p50 {s['gap_other_p50']:.3f} ms from release() called "
                f"({s['gap_other_done_p50']:.3f} ms from release() returned; target < 0.5 ms)"
            )
            checks.append(
                f"{'PASS' if s['gap_other_p99'] < 2 else 'FAIL'}: {on}, {name}: handoff to "
                f"another process p99 {s['gap_other_p99']:.3f} ms from release() called "
                f"({s['gap_other_done_p99']:.3f} ms from release() returned; target < 2 ms)"
            )
            checks.append(
                f"{'PASS' if s['violations'] == 0 else 'FAIL'}: {on}, {name}: mutual-exclusion "
                f"violations: {s['violations']:.0f} (target 0)"
            )
        checks.append(
            f"{'PASS' if d['starved'] == 0 else 'FAIL'}: {on}, fair=False: starved processes: "
            f"{d['starved']:.0f} (target 0; fewest acquisitions by one process: "
            f"{d['min_acq']:.0f})"
        )
        checks.append(
            f"{'PASS' if f['worst_spread'] < 20 else 'FAIL'}: {on}, fair=True: busiest vs "
            f"idlest process differ by {f['worst_spread']:.1f}% (target < 20%)"
        )
    return summaries


# -- 3. crash -----------------------------------------------------------------------------


def run_crash(
    ctx: Any,
    targets: dict[str, Target],
    runnable: Runnable,
    report: Report,
    args: argparse.Namespace,
    checks: list[str],
) -> dict[tuple[str, str], crash.Result]:
    entries = [(k, targets[t]) for t in targets for k in CONTENDED if runnable[t][k] is None]
    print(f"  crashed holder: {args.trials} trials x {len(entries)} implementations/topologies")
    results = crash.run(ctx, entries, trials=args.trials, lease=args.lease)
    rows = []
    problems = []
    for topo in targets:
        for key in CONTENDED:
            head = [label(key), TOPOLOGY_LABELS[topo]]
            why = runnable[topo][key]
            if why is not None:
                rows.append([*head, _na(why), *["n/a"] * 4])
                continue
            r = results[(topo, key)]
            s = r.summary()
            rows.append(
                [
                    *head,
                    f"{len(r.lateness_ms)}/{args.trials}",
                    fmt(s["median"], 1),
                    fmt(s["max"], 1),
                    fmt(s["holder_call_max"], 2),
                    str(r.early),
                ]
            )
            problems.extend(f"{label(key)} ({TOPOLOGY_LABELS[topo]}): {e}" for e in r.errors)
    text = (
        f"### 3. Holder SIGKILLed while holding ({args.lease:g} s lease, renewal off; "
        f"waiter already blocked; load at the end {load()})\n\n"
        + table(
            [
                "implementation",
                "topology",
                "trials",
                "late p50 ms",
                "late max ms",
                "holder call ms (max)",
                "early (violations)",
            ],
            rows,
        )
        + "\n\n`late`: waiter's acquire() returning minus the lease end, where the lease "
        "end is counted from the moment the holder *sent* its acquire (an upper bound: "
        "the lock was set at most `holder call` later). `n/a`: see scenario 2."
    )
    if problems:
        text += "\n\nProblems:\n\n" + "\n".join("- " + p for p in problems[:20])
    report.add(text)
    for topo in targets:
        on = TOPOLOGY_LABELS[topo]
        if (topo, "distlock") not in results:
            checks.append(f"FAIL: {on}: our lock could not run")
            continue
        r = results[(topo, "distlock")]
        s = r.summary()
        checks.append(
            f"{'PASS' if s['max'] < 5 else 'FAIL'}: {on}, crashed holder: waiter acquires "
            f"{s['median']:.1f} ms (median), {s['max']:.1f} ms (max) after the lease ends "
            "(target < 5 ms)"
        )
        checks.append(
            f"{'PASS' if r.early == 0 else 'FAIL'}: {on}, crashed holder: no waiter acquired "
            f"before the lease ended ({r.early})"
        )
    return results


# -- the summary (the README's table) -----------------------------------------------------

SUMMARY_COLUMNS = [
    # heading, sync key, async key
    ("floor (SET NX PX + Lua CAD)", "floor", "afloor"),
    ("**django-distlock**", "distlock", "adistlock"),
    ("auto_renew=False", "distlock-norenew", "adistlock-norenew"),
    ("fair=True", "distlock-fair", None),
    ("redis-py `Lock`", "redis-py", "aredis-py"),
    ("python-redis-lock", "python-redis-lock", None),
    ("pottery `Redlock`", "pottery", None),
]


def _bold(key: str | None, text: str) -> str:
    return f"**{text}**" if key in ("distlock", "adistlock") and text else text


def summary_table(
    unc: Uncontended,
    cont: dict[str, dict[str, dict[str, float]]] | None,
    crashed: dict[tuple[str, str], crash.Result] | None,
    runnable: Runnable,
) -> str:
    """The README's table: one column per implementation, one row per measure."""
    rows: list[list[str]] = []
    notes: dict[str, int] = {}

    def na(topo: str, key: str) -> str:
        reason = f"{label(key)} on a {TOPOLOGY_LABELS[topo]}: {runnable[topo][key]}"
        notes.setdefault(reason, len(notes) + 1)
        return f"n/a ({notes[reason]})"

    for api, index in (("sync", 1), ("async", 2)):
        for pin, results in unc.items():
            row = [f"uncontended µs/cycle p50 (x floor), {api}, {PLACEMENT_LABELS[pin]}"]
            for column in SUMMARY_COLUMNS:
                key = column[index]
                if key is None or key not in results:
                    row.append("")
                    continue
                ratio = uncontended.ratios(results, key)[1]
                row.append(_bold(key, f"{fmt(results[key].p(50), 0)} ({ratio:.2f})"))
            rows.append(row)
    if unc:
        results = unc.get("split") or next(iter(unc.values()))
        row = ["round trips per cycle (sync / async)"]
        for _, sync_key, async_key in SUMMARY_COLUMNS:
            parts = [
                f"{results[k].requests / results[k].cycles:.0f}"
                for k in (sync_key, async_key)
                if k is not None and k in results
            ]
            row.append(_bold(sync_key, " / ".join(parts)))
        rows.append(row)

    def contended_row(title: str, topo: str, cell: Any) -> None:
        row = [title, ""]
        for _, key, _ in SUMMARY_COLUMNS[1:]:
            if key == "distlock-norenew":
                row.append("")
            elif runnable.get(topo, {}).get(key) is not None:
                row.append(na(topo, key))
            elif cont is not None and key in cont.get(topo, {}):
                row.append(_bold(key, cell(cont[topo][key])))
            else:
                row.append("")
        rows.append(row)

    def spread(v: float) -> str:
        return f"{v:.0f}%" if v >= 1 else f"{v:.1f}%"

    for topo in cont or {}:
        on = "" if topo == "single" else ", 3-primary cluster"
        contended_row(
            f"8 processes{on}: handoff to another process p50, from release() returned",
            topo,
            lambda s: f"{s['gap_other_done_p50']:.2f} ms",
        )
        contended_row("same, p99", topo, lambda s: f"{s['gap_other_done_p99']:.2f} ms")
        contended_row(
            f"8 processes{on}: longest wait", topo, lambda s: f"{s['wait_max'] / 1000:.2f} s"
        )
        contended_row(
            f"8 processes{on}: busiest vs idlest process", topo, lambda s: spread(s["worst_spread"])
        )
        contended_row(
            f"8 processes{on}: mutual-exclusion violations",
            topo,
            lambda s: f"{s['violations']:.0f}",
        )
    if crashed is not None:
        for topo in dict.fromkeys(t for t, _ in crashed):
            on = "" if topo == "single" else ", 3-primary cluster"
            row = [f"SIGKILLed holder{on}: waiter gets the lock after lease end, p50", ""]
            for _, key, _ in SUMMARY_COLUMNS[1:]:
                if key == "distlock-norenew":
                    row.append("")
                elif runnable.get(topo, {}).get(key) is not None:
                    row.append(na(topo, key))
                elif (topo, key) in crashed:
                    row.append(_bold(key, f"{crashed[(topo, key)].summary()['median']:.1f} ms"))
                else:
                    row.append("")
            rows.append(row)
    text = table(["", *(c[0] for c in SUMMARY_COLUMNS)], rows)
    if notes:
        text += "\n\n" + "\n".join(f"({n}) {reason}" for reason, n in notes.items())
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short run (about 2 minutes)")
    parser.add_argument("--only", choices=SCENARIOS, action="append", help="run only these")
    parser.add_argument("--output", type=Path, default=HERE / "results.md")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument(
        "--pin",
        choices=PLACEMENTS,
        action="append",
        help="CPU placement of the uncontended case (repeatable; default: all three in "
        "turn): client and server on two CPUs, both on one CPU, or left to the scheduler",
    )
    parser.add_argument(
        "--topology",
        choices=(*TOPOLOGIES, "both"),
        default="both",
        help="where the contended and crashed-holder scenarios run: one server, a local "
        "3-primary cluster, or both (default)",
    )
    args = parser.parse_args(argv)
    quick = args.quick
    args.pins = args.pin or list(PLACEMENTS)
    # Many short rounds rather than a few long ones: a noisy VM (the scheduler moving
    # the client and the server between CPUs, neighbours stealing time) changes its
    # speed over tenths of a second, and the shorter the rounds, the more alike the
    # conditions of the implementations compared within one round.
    args.rounds = 10 if quick else 40
    args.cycles = 150 if quick else 250
    args.warmup = 100 if quick else 300
    args.contended_rounds = 1 if quick else 2
    args.duration = 3.0 if quick else 8.0
    args.trials = 3 if quick else 5
    args.lease = 1.0
    scenarios = args.only or list(SCENARIOS)
    topologies = list(TOPOLOGIES) if args.topology == "both" else [args.topology]
    if not {"contended", "crash"} & set(scenarios):
        topologies = ["single"]
    missing = [k for k, m in PEER_MODULES.items() if importlib.util.find_spec(m) is None]
    UNCONTENDED[:] = [k for k in UNCONTENDED if k not in missing]
    CONTENDED[:] = [k for k in CONTENDED if k not in missing]

    # forkserver: each worker starts from a clean, pre-imported process (no inherited
    # connections, no CPU pinning: the server is started after the pinning is undone).
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(
        [
            "impls",
            "contended",
            "crash",
            "redis",
            "redis.cluster",
            "django_distlock.engine",
            "redis_lock",
            "pottery",
        ]
    )

    # If anything hangs, say where (every thread's stack on stderr) instead of just waiting.
    faulthandler.dump_traceback_later(600 if quick else 1800, exit=False)
    started = time.monotonic()
    digest = engine_digest()
    report = Report()
    checks: list[str] = []
    unc: Uncontended = {}
    cont = None
    crashed = None
    runnable: Runnable = {}
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(bench_server())
        report.add(
            f"## django-distlock benchmark{' (--quick)' if quick else ''}\n\n"
            + machine_info(server, topologies)
            + (
                f"\n- Skipped (not installed; pip install -e '.[bench]'): {', '.join(missing)}"
                if missing
                else ""
            )
        )
        try:
            if "uncontended" in scenarios:
                unc = run_uncontended(server, report, args, checks)
            server.client().flushall()
            targets = {"single": Target.single(server.port)} if "single" in topologies else {}
            if "cluster" in topologies:
                print("  starting a 3-primary cluster", flush=True)
                cluster = stack.enter_context(bench_cluster())
                targets["cluster"] = Target.cluster([node.port for node in cluster.nodes])
            for topo, target in targets.items():
                runnable[topo] = {
                    key: None if topo == "single" else impls.unusable_reason(key, target)
                    for key in CONTENDED
                }
            if "contended" in scenarios:
                cont = run_contended(ctx, targets, runnable, report, args, checks)
            server.client().flushall()
            if "crash" in scenarios:
                crashed = run_crash(ctx, targets, runnable, report, args, checks)
        finally:
            elapsed = time.monotonic() - started
            if engine_digest() != digest:
                checks.append(
                    "WARNING: django_distlock's source changed during the run; the scenarios "
                    "may have measured different versions. Run again."
                )
            report.add(
                "### Targets (django-distlock)\n\n"
                + "\n".join(f"- {c}" for c in checks)
                + f"\n\nTotal run time: {elapsed:.0f} s; load average at the end: {load()}."
            )
            if unc or cont or crashed:
                report.add(
                    "### Summary (the table in the project README)\n\n"
                    + summary_table(unc, cont, crashed, runnable)
                    + "\n\nUncontended cells: p50 µs per acquire+release cycle over all "
                    "rounds and, in brackets, the median over rounds of the ratio of p50s to "
                    "the floor of the same API in the same round (means and the ratios to "
                    "redis-py's `Lock`: tables 1) (sync: `redis.Redis`; async: "
                    "the floor with `redis.asyncio`, `await lock.aacquire()/arelease()`, "
                    "`redis.asyncio.Redis().lock()`). Other rows as in tables 2 and 3."
                )
            report.write(args.output)
    print(f"written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
