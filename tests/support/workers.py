"""Subprocess entry points for the multi-process engine tests.

``python -m tests.support.workers hold PORT NAME LEASE`` takes the lock (auto-renewed),
prints ``acquired FENCE`` and sleeps until killed.

``python -m tests.support.workers count PORT NAME ITERATIONS FAIR`` prints ``ready``,
waits for an item on the ``start`` list, then ITERATIONS times, under the lock, reads
the ``counter`` key, appends its fence to the ``fences`` list and writes counter + 1
(a read-modify-write that loses increments unless the lock excludes everybody else).
"""

from __future__ import annotations

import sys
import time

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_distlock.engine import Backend, Lock


def _backend(port: str) -> Backend:
    client = redis.Redis(host="127.0.0.1", port=int(port), retry=Retry(NoBackoff(), 0))
    return Backend(client)


def hold(port: str, name: str, lease: str) -> None:
    lock = Lock(name, backend=_backend(port), timeout=float(lease), auto_renew=True)
    lock.acquire()
    print(f"acquired {lock.fence}", flush=True)
    time.sleep(3600)


def count(port: str, name: str, iterations: str, fair: str) -> None:
    backend = _backend(port)
    client = backend.client
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
