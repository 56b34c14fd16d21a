"""Following a cluster's redirects (``redirect_of``): no server needed, the decisions
are made from the error replies alone."""

from __future__ import annotations

import time

from redis.exceptions import AskError, MovedError, TryAgainError

from django_distlock.engine.topology import (
    MAX_REDIRECTS,
    TRYAGAIN_BUDGET,
    TRYAGAIN_DELAY,
    Cluster,
    ConnectionSource,
    redirect_of,
)

KEY = "distlock:{ee}:lock:invoice:42"


def cluster() -> Cluster:
    return Cluster([("127.0.0.1", 7000)], ConnectionSource(None, None))


def test_ask_during_a_split_slot_is_followed_past_max_redirects_within_the_budget():
    # A migration with a slot's keys split: the source answers ASK, the target TRYAGAIN,
    # in turn. Past MAX_REDIRECTS the ASKs are paced like TRYAGAIN (regression: the lock
    # failed after 16 quick turns, about 0.35 s into a move).
    topology = cluster()
    ask = AskError("9539 127.0.0.1:7001")
    quick = redirect_of(topology, KEY, ask, 0, time.monotonic())
    assert quick is not None
    assert quick.asking
    assert quick.delay == 0.0
    assert quick.node.address == ("127.0.0.1", 7001)
    paced = redirect_of(topology, KEY, ask, MAX_REDIRECTS, time.monotonic())
    assert paced is not None
    assert paced.asking
    assert paced.delay == TRYAGAIN_DELAY
    started_long_ago = time.monotonic() - TRYAGAIN_BUDGET
    assert redirect_of(topology, KEY, ask, MAX_REDIRECTS, started_long_ago) is None
    assert redirect_of(topology, KEY, TryAgainError("TRYAGAIN"), 0, started_long_ago) is None


def test_moved_still_stops_at_max_redirects():
    topology = cluster()
    moved = MovedError("9539 127.0.0.1:7002")  # a subclass of AskError in redis-py
    redirect = redirect_of(topology, KEY, moved, MAX_REDIRECTS - 1, time.monotonic())
    assert redirect is not None
    assert not redirect.asking
    assert redirect.node.address == ("127.0.0.1", 7002)
    assert redirect_of(topology, KEY, moved, MAX_REDIRECTS, time.monotonic()) is None
