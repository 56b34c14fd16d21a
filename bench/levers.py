"""What one protocol lever saves on the server: the lock scripts of two git revisions (or
a variant file), the same uncontended acquire+release cycle, interleaved in one process.

    .venv/bin/python bench/levers.py --base 128e9f3              # that revision vs the tree
    .venv/bin/python bench/levers.py --base HEAD --head variant.py   # a variant of scripts.py

One private server (``bench/server.py``), pinned to the second CPU and this process to the
first (``--pin split``, see bench/README.md). Each side's ``ACQUIRE`` and ``RELEASE`` are
loaded from its ``django_distlock/engine/protocol/scripts.py`` and called with
``EVALSHA`` exactly as a ``Lock(timeout=10)`` calls them on a free lock (its keys, token,
owner metadata, waiter id), ``--cycles`` times a round, the sides' order alternating,
``--rounds`` rounds. Per cycle, the median over rounds: the server's time in the two
scripts (``INFO commandstats`` usec of ``EVALSHA``), its whole CPU (``INFO cpu``, which
also counts reading requests and writing replies) and the commands it ran (those inside
the scripts included), and the median of the per-round ratios head/base. Only the server
is compared: the client sends the same request on both sides.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for path in (str(HERE), str(ROOT)):
    if path not in sys.path:
        sys.path.insert(0, path)

import redis  # noqa: E402
from server import bench_server  # noqa: E402
from stats import median, table  # noqa: E402
from timing import place  # noqa: E402
from uncontended import server_commands, server_cpu, server_script_us  # noqa: E402

from django_distlock.engine import LockKeys  # noqa: E402

SCRIPTS = "django_distlock/engine/protocol/scripts.py"
OWNER = '{"host":"bench-host","pid":12345,"thread":"MainThread","context":"","auto_renew":true}'


def scripts_of(source: str) -> ModuleType:
    """The scripts module of a revision (``git show REV:...``), ``tree`` (this checkout)
    or a file path."""
    if source == "tree":
        text = (ROOT / SCRIPTS).read_text()
    elif Path(source).is_file():
        text = Path(source).read_text()
    else:
        text = subprocess.run(
            ["git", "show", f"{source}:{SCRIPTS}"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    text = text.replace("from .ops import", "from django_distlock.engine.protocol.ops import")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as file:
        file.write(text)
    spec = importlib.util.spec_from_file_location(f"scripts_{abs(hash(source))}", file.name)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    os.unlink(file.name)
    return module


def server_counters(client: redis.Redis) -> tuple[float, float, int]:
    """Script µs, whole CPU µs and commands run so far (the benchmark's own ``INFO`` and
    ``CONFIG RESETSTAT`` left out)."""
    return server_script_us(client), server_cpu(client) * 1e6, server_commands(client)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="git revision or scripts.py variant")
    parser.add_argument("--head", default="tree", help="git revision, variant file or tree")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument(
        "--waiting",
        action="store_true",
        help="one live unfair waiter stays registered: every release wakes it",
    )
    args = parser.parse_args()
    sides = {"base": scripts_of(args.base), "head": scripts_of(args.head)}
    keys = LockKeys.for_name("distlock:", "bench")
    with bench_server() as server:
        placed = place("split", server)
        client = redis.Redis(port=server.port)
        loaded = {
            side: (client.script_load(m.ACQUIRE.source), client.script_load(m.RELEASE.source))
            for side, m in sides.items()
        }
        per: dict[str, dict[str, list[float]]] = {
            s: {"script": [], "cpu": [], "cmds": []} for s in sides
        }
        if args.waiting:
            # Registered as an unfair waiter is, for an hour: every release runs the
            # wake-up and pushes to the shared signal list.
            until_ms = int(client.time()[0]) * 1000 + 3_600_000
            client.zadd(keys.waiters, {"w-other": until_ms})
        for number in range(args.rounds):
            order = list(sides) if number % 2 == 0 else list(reversed(sides))
            for side in order:
                acquire, release = loaded[side]
                before = server_counters(client)
                for _ in range(args.cycles):
                    client.evalsha(
                        acquire, 10, *keys.all("w1"), "tok", 10_000, OWNER, "bench", 60_000,
                        "w1", 3000, "0", "",
                    )  # fmt: skip
                    client.evalsha(release, 10, *keys.all(), "tok", "bench", 3000)
                after = server_counters(client)
                for field, a, b in zip(("script", "cpu", "cmds"), after, before, strict=True):
                    per[side][field].append((a - b) / args.cycles)
        client.close()
    rows = []
    for field, label in (
        ("script", "µs in scripts"),
        ("cpu", "server CPU µs"),
        ("cmds", "commands"),
    ):
        base, head = per["base"][field], per["head"][field]
        ratio = median([h / b for h, b in zip(head, base, strict=True)])
        rows.append([label, f"{median(base):.2f}", f"{median(head):.2f}", f"{ratio:.3f}"])
    cycle = "acquire+release cycle waking a waiter" if args.waiting else "uncontended cycle"
    print(
        f"Per {cycle}, {args.rounds} rounds x {args.cycles} cycles, "
        f"{placed}; base {args.base}, head {args.head}:\n"
    )
    print(table(["per cycle", "base", "head", "head/base (median of rounds)"], rows))


if __name__ == "__main__":
    main()
