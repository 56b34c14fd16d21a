"""Subprocess entry points for the multi-process engine tests.

TARGET is a topology as :meth:`tests.support.probe.Topology.target` spells it
(``single:PORT``, ``sentinel:HOST:PORT,.../SERVICE`` or ``cluster:URL,...``).

``python -m tests.support.workers hold TARGET NAME LEASE`` takes the lock (auto-renewed),
prints ``acquired FENCE`` and sleeps until killed.

``python -m tests.support.workers count TARGET NAME ITERATIONS FAIR`` prints ``ready``,
waits for an item on the ``start`` list, then ITERATIONS times, under the lock, reads
the ``counter`` key, appends its fence to the ``fences`` list and writes counter + 1
(a read-modify-write that loses increments unless the lock excludes everybody else).
On a cluster those three keys may live on other primaries than the lock's.
"""

from __future__ import annotations

import sys
import time

from django_distlock.engine import Lock
from tests.support.probe import backend_for_target, probe_for_target


def hold(target: str, name: str, lease: str) -> None:
    lock = Lock(name, backend=backend_for_target(target), timeout=float(lease), auto_renew=True)
    lock.acquire()
    print(f"acquired {lock.fence}", flush=True)
    time.sleep(3600)


def count(target: str, name: str, iterations: str, fair: str) -> None:
    backend = backend_for_target(target)
    client = probe_for_target(target)
    lock = Lock(name, backend=backend, timeout=10, fair=fair == "1")
    print("ready", flush=True)
    client.blpop(["start"], timeout=60)
    for _ in range(int(iterations)):
        with lock:
            value = int(client.get("counter") or 0)
            client.rpush("fences", lock.fence)
            client.set("counter", value + 1)
    print("done", flush=True)


if __name__ == "__main__":
    command, *arguments = sys.argv[1:]
    {"hold": hold, "count": count}[command](*arguments)
