"""The engine's ``Listing`` (and its second read, ``snapshot``) on a Redis Cluster: one row
per hold whatever node each bucket lives on (``HeldLock.objects`` on one server, which
reads through the same listing: ``tests/test_managers.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from django_distlock.engine import Backend, Lock, force_release
from django_distlock.engine.listing.query import Listing, LockQuery
from tests.support.topologies import ClusterSetup

PREFIX = "listing-test:"


@pytest.fixture
def cluster_backend(cluster_setup: ClusterSetup) -> Iterator[Backend]:
    cluster_setup.flushall()
    backend = Backend(cluster=cluster_setup.urls, prefix=PREFIX, auto_renew=False)
    try:
        yield backend
    finally:
        backend.close()


def test_a_cluster_listing_has_a_row_per_hold_on_every_node(cluster_backend):
    exclusive = [Lock(f"job:{n}", backend=cluster_backend, timeout=90) for n in range(40)]
    readers = [Lock("catalog", backend=cluster_backend, shared=True) for _ in range(3)]
    slots = [Lock(f"export:{n % 20}", backend=cluster_backend, limit=2) for n in range(40)]
    locks = [*exclusive, *readers, *slots]
    for lock in locks:
        assert lock.acquire(blocking=False)
    try:
        listing = Listing(cluster_backend)
        records = listing.records()
        assert len(records) == listing.count() == 83
        assert {(r.name, r.token) for r in records} == {(lock.name, lock.token) for lock in locks}
        assert {r.token: r.fence for r in records} == {lock.token: lock.fence for lock in locks}
        modes = {r.name: (r.mode, r.limit, r.holders) for r in records}
        assert modes["job:7"] == ("exclusive", None, 1)
        assert modes["catalog"] == ("shared", None, 3)
        assert modes["export:3"] == ("limited", 2, 2)
        # Lookups, windows and orders apply to rows, across nodes.
        exports = LockQuery(filters=(("startswith", "export:1"),))
        assert listing.count(exports) == 22  # export:1 and export:10..19, two holds each
        page = listing.page(LockQuery(filters=(("in", frozenset({"catalog", "job:3"})),)))
        assert [r.name for r in page.records] == ["catalog"] * 3 + ["job:3"]
        assert page.matched == 4
        newest = listing.records(LockQuery(ordering=("-acquired_at",), high=2))
        assert [r.token for r in newest] == [slots[-1].token, slots[-2].token]
        longest = listing.records(LockQuery(ordering=("-ttl",), high=40))
        assert {r.name for r in longest} == {lock.name for lock in exclusive}
        # Force release of one hold, found by its token alone.
        assert force_release(cluster_backend, "catalog", readers[1].token) is True
        assert listing.count(LockQuery(filters=(("exact", "catalog"),))) == 2
        assert readers[0].owned()
        assert not readers[1].owned()
    finally:
        for lock in locks:
            if lock.held:
                lock.release()
