"""Fair locks: a holder that releases and immediately re-acquires must queue behind the
waiters already there (regression: the queue was invisible to acquire, so fair locks
barged like unfair ones)."""

from __future__ import annotations

import collections
import itertools
import threading
import time

from django_distlock.engine import Backend, Lock


def test_fair_lock_serves_looping_contenders_round_robin(redis_server, redis_client):
    backend = Backend(redis_server.client())
    counts: collections.Counter[int] = collections.Counter()
    order: list[int] = []
    stop = time.monotonic() + 1.5

    def contend(worker: int) -> None:
        lock = Lock("fair:loop", backend=backend, timeout=10, fair=True)
        while time.monotonic() < stop:
            assert lock.acquire(blocking_timeout=5)
            order.append(worker)
            counts[worker] += 1
            lock.release()

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(counts) == 4
    busiest, idlest = max(counts.values()), min(counts.values())
    assert (busiest - idlest) / busiest < 0.2, counts
    repeats = sum(1 for a, b in itertools.pairwise(order) if a == b)
    assert repeats < len(order) * 0.1, f"{repeats} immediate re-acquisitions in {len(order)}"
