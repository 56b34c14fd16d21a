"""django-distlock benchmark: this engine side by side with redis-py's Lock,
python-redis-lock and pottery's Redlock, against one private server.

    .venv/bin/python bench/run.py            # full run, about 3-5 minutes
    .venv/bin/python bench/run.py --quick    # about a minute

Prints Markdown tables and writes them to bench/results.md. See bench/README.md.
"""

from __future__ import annotations

import argparse
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
from server import bench_server  # noqa: E402
from stats import fmt, table  # noqa: E402

from tests.support.redis_servers import RedisServer  # noqa: E402

UNCONTENDED = [
    "floor",
    "distlock",
    "distlock-norenew",
    "distlock-fair",
    "redis-py",
    "python-redis-lock",
    "pottery",
]
CONTENDED = ["distlock", "distlock-fair", "redis-py", "python-redis-lock", "pottery"]
SCENARIOS = ("uncontended", "contended", "crash")
PEER_MODULES = {"python-redis-lock": "redis_lock", "pottery": "pottery"}


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


def machine_info(server: RedisServer) -> str:
    v = impls.versions()
    return "\n".join(
        [
            f"- Date: {time.strftime('%Y-%m-%d %H:%M %Z')}; django-distlock {git_commit()} "
            f"(source digest {engine_digest()})",
            f"- CPU: {cpu_model()}; {os.cpu_count()} logical CPUs "
            f"(usable: {sorted(os.sched_getaffinity(0))}); {platform.system()} "
            f"{platform.release()}",
            f"- Python {platform.python_version()}; redis-py {v['redis']} "
            f"(hiredis {v['hiredis']}); python-redis-lock {v['python-redis-lock']}; "
            f"pottery {v['pottery']}",
            f"- Server: {server.version()} ({Path(server.binary).name}), loopback TCP, "
            "no persistence",
        ]
    )


class Report:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def add(self, text: str) -> None:
        print(text, flush=True)
        print(flush=True)
        self.parts.append(text)

    def write(self, path: Path) -> None:
        path.write_text("\n\n".join(self.parts) + "\n")


def run_uncontended(
    server: RedisServer, report: Report, args: argparse.Namespace, checks: list[str]
) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    pin = args.pin if len(cpus) >= 2 or args.pin != "split" else "same"
    if pin != "none":
        client_cpu, server_cpu = cpus[0], cpus[1] if pin == "split" else cpus[0]
        os.sched_setaffinity(0, {client_cpu})
        server.pin({server_cpu})
    try:
        results = uncontended.run(
            server.port,
            UNCONTENDED,
            rounds=args.rounds,
            cycles=args.cycles,
            warmup=args.warmup,
        )
    finally:
        if pin != "none":
            os.sched_setaffinity(0, set(cpus))
            server.pin(set(cpus))
    rows = []
    for key in UNCONTENDED:
        r = results[key]
        by_mean, by_p50 = uncontended.ratios(results, key)
        rows.append(
            [
                label(key),
                fmt(r.ops_per_s, 0),
                fmt(r.p(50), 0),
                fmt(r.p(99), 0),
                fmt(by_mean, 2),
                fmt(by_p50, 2),
                fmt(r.requests / r.cycles, 2),
                fmt(r.server_commands / r.cycles, 1),
                fmt(r.client_cpu_ns / r.cycles / 1000, 0),
                fmt(r.server_cpu_s / r.cycles * 1e6, 0),
            ]
        )
    where = {
        "split": f"client pinned to CPU {cpus[0]}, server to CPU {cpus[-1]}",
        "same": f"client and server both pinned to CPU {cpus[0]}",
        "none": "not pinned",
    }[pin]
    report.add(
        f"### 1. Uncontended acquire+release (one process, {args.rounds} interleaved rounds "
        f"x {args.cycles} cycles per implementation; {where})\n\n"
        + table(
            [
                "implementation",
                "ops/s",
                "p50 µs",
                "p99 µs",
                "x floor (mean)",
                "x floor (p50)",
                "round trips/cycle",
                "server cmds/cycle",
                "client CPU µs/cycle",
                "server CPU µs/cycle",
            ],
            rows,
        )
        + "\n\n`x floor`: median over rounds of this implementation's cycle time divided by "
        "the floor's in the same round. `round trips/cycle`: requests the client wrote "
        "(counted in the connection). `server cmds/cycle`: `INFO commandstats` calls, "
        "including the commands run inside Lua scripts. CPU: process CPU time of the "
        "benchmark process (all its threads) and of the server (INFO cpu), per cycle."
    )
    by_mean, by_p50 = uncontended.ratios(results, "distlock")
    others = ", ".join(
        f"{label(key)}: {m:.2f}x / {p:.2f}x"
        for key in ("distlock-norenew", "distlock-fair")
        for m, p in [uncontended.ratios(results, key)]
    )
    checks.append(
        f"{'PASS' if max(by_mean, by_p50) <= 1.15 else 'FAIL'}: uncontended acquire+release "
        f"takes {by_mean:.2f}x (mean) / {by_p50:.2f}x (p50) the two-round-trip floor "
        f"(target <= 1.15x for both; {others})"
    )


def run_contended(
    ctx: Any, server: RedisServer, report: Report, args: argparse.Namespace, checks: list[str]
) -> None:
    runs: dict[str, list[contended.Run]] = {key: [] for key in CONTENDED}
    for r in range(args.contended_rounds):
        order = CONTENDED[r % len(CONTENDED) :] + CONTENDED[: r % len(CONTENDED)]
        for key in order:
            print(f"  contended: {key} round {r + 1}/{args.contended_rounds}", flush=True)
            runs[key].append(
                contended.run(
                    ctx,
                    key,
                    server.port,
                    workers=args.workers,
                    duration=args.duration,
                    tag=str(r),
                )
            )
    latency_rows, fairness_rows = [], []
    problems: list[str] = []
    summaries = {}
    for key in CONTENDED:
        s = summaries[key] = contended.summary(runs[key])
        latency_rows.append(
            [
                label(key),
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
                label(key),
                fmt(s["same_process_pct"], 0),
                f"{s['min_acq']:.0f} / {s['max_acq']:.0f}",
                fmt(s["worst_spread"], 0),
                f"{s['starved']:.0f}",
                fmt(s["requests_per_acq"], 1),
                f"{s['lost_updates']:.0f} / {s['owner_overlaps']:.0f} / "
                f"{s['interval_overlaps']:.0f}",
                f"{s['errors']:.0f} / {s['hung']:.0f}",
            ]
        )
        for run in runs[key]:
            problems.extend(f"{label(key)}: {e}" for e in run.errors[:3])
            if run.hung:
                problems.append(f"{label(key)}: workers {run.hung} did not finish (hung)")
            if run.violations:
                problems.append(
                    f"{label(key)}: violations: {run.lost_updates} lost updates, "
                    f"{run.owner_overlaps} owner-key overlaps, "
                    f"{run.interval_overlaps} overlapping intervals"
                )
    text = (
        f"### 2. {args.workers} processes contending on one lock "
        f"({args.contended_rounds} interleaved round(s) x {args.duration:g} s each)\n\n"
        "Latency (ms):\n\n"
        + table(
            [
                "implementation",
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
        "on entry, holding intervals that overlap on CLOCK_MONOTONIC."
    )
    if problems:
        text += "\n\nProblems:\n\n" + "\n".join(
            "- " + p.replace("\n", "\n  ") for p in problems[:20]
        )
    report.add(text)

    d, f = summaries["distlock"], summaries["distlock-fair"]
    for name, s in (("fair=False", d), ("fair=True", f)):
        checks.append(
            f"{'PASS' if s['gap_other_p50'] < 0.5 else 'FAIL'}: {name} handoff to another "
            f"process p50 {s['gap_other_p50']:.3f} ms from release() called "
            f"({s['gap_other_done_p50']:.3f} ms from release() returned; target < 0.5 ms)"
        )
        checks.append(
            f"{'PASS' if s['gap_other_p99'] < 2 else 'FAIL'}: {name} handoff to another "
            f"process p99 {s['gap_other_p99']:.3f} ms from release() called "
            f"({s['gap_other_done_p99']:.3f} ms from release() returned; target < 2 ms)"
        )
        checks.append(
            f"{'PASS' if s['violations'] == 0 else 'FAIL'}: {name} mutual-exclusion "
            f"violations: {s['violations']:.0f} (target 0)"
        )
    checks.append(
        f"{'PASS' if d['starved'] == 0 else 'FAIL'}: fair=False starved processes: "
        f"{d['starved']:.0f} (target 0; fewest acquisitions by one process: "
        f"{d['min_acq']:.0f})"
    )
    checks.append(
        f"{'PASS' if f['worst_spread'] < 20 else 'FAIL'}: fair=True busiest vs idlest "
        f"process differ by {f['worst_spread']:.1f}% (target < 20%)"
    )


def run_crash(
    ctx: Any, server: RedisServer, report: Report, args: argparse.Namespace, checks: list[str]
) -> None:
    print(f"  crashed holder: {args.trials} trials x {len(CONTENDED)} implementations")
    results = crash.run(ctx, CONTENDED, server.port, trials=args.trials, lease=args.lease)
    rows = []
    problems = []
    for key in CONTENDED:
        r = results[key]
        s = r.summary()
        rows.append(
            [
                label(key),
                f"{len(r.lateness_ms)}/{args.trials}",
                fmt(s["median"], 1),
                fmt(s["max"], 1),
                fmt(s["holder_call_max"], 2),
                str(r.early),
            ]
        )
        problems.extend(f"{label(key)}: {e}" for e in r.errors)
    text = (
        f"### 3. Holder SIGKILLed while holding ({args.lease:g} s lease, renewal off; "
        f"waiter already blocked)\n\n"
        + table(
            [
                "implementation",
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
        "the lock was set at most `holder call` later)."
    )
    if problems:
        text += "\n\nProblems:\n\n" + "\n".join("- " + p for p in problems[:20])
    report.add(text)
    s = results["distlock"].summary()
    checks.append(
        f"{'PASS' if s['max'] < 5 else 'FAIL'}: crashed holder: waiter acquires "
        f"{s['median']:.1f} ms (median), {s['max']:.1f} ms (max) after the lease ends "
        "(target < 5 ms)"
    )
    checks.append(
        f"{'PASS' if results['distlock'].early == 0 else 'FAIL'}: crashed holder: no waiter "
        f"acquired before the lease ended ({results['distlock'].early})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short run (about a minute)")
    parser.add_argument("--only", choices=SCENARIOS, action="append", help="run only these")
    parser.add_argument("--output", type=Path, default=HERE / "results.md")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument(
        "--pin",
        choices=("split", "same", "none"),
        default="split",
        help="CPU placement for the uncontended case: client and server on two CPUs "
        "(default), both on one CPU, or left to the scheduler",
    )
    args = parser.parse_args(argv)
    quick = args.quick
    args.rounds = 5 if quick else 10
    args.cycles = 300 if quick else 1000
    args.warmup = 100 if quick else 300
    args.contended_rounds = 1 if quick else 2
    args.duration = 3.0 if quick else 8.0
    args.trials = 3 if quick else 5
    args.lease = 1.0
    scenarios = args.only or list(SCENARIOS)
    missing = [k for k, m in PEER_MODULES.items() if importlib.util.find_spec(m) is None]
    UNCONTENDED[:] = [k for k in UNCONTENDED if k not in missing]
    CONTENDED[:] = [k for k in CONTENDED if k not in missing]

    # forkserver: each worker starts from a clean, pre-imported process (no inherited
    # connections, no CPU pinning: the server is started after the pinning is undone).
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(
        ["impls", "contended", "crash", "redis", "django_distlock.engine", "redis_lock", "pottery"]
    )

    # If anything hangs, say where (every thread's stack on stderr) instead of just waiting.
    faulthandler.dump_traceback_later(300 if quick else 900, exit=False)
    started = time.monotonic()
    digest = engine_digest()
    report = Report()
    checks: list[str] = []
    with bench_server() as server:
        report.add(
            f"## django-distlock benchmark{' (--quick)' if quick else ''}\n\n"
            + machine_info(server)
            + (
                f"\n- Skipped (not installed; pip install -e '.[bench]'): {', '.join(missing)}"
                if missing
                else ""
            )
        )
        try:
            if "uncontended" in scenarios:
                run_uncontended(server, report, args, checks)
            server.client().flushall()
            if "contended" in scenarios:
                run_contended(ctx, server, report, args, checks)
            server.client().flushall()
            if "crash" in scenarios:
                run_crash(ctx, server, report, args, checks)
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
                + f"\n\nTotal run time: {elapsed:.0f} s."
            )
            report.write(args.output)
    print(f"written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
