"""The engine's ``Listing`` (and its second read, ``snapshot``): on a Redis Cluster, one row
per hold whatever node each bucket lives on (``HeldLock.objects`` on one server, which
reads through the same listing: ``tests/test_managers.py``); on every topology, a window
ordered by TTL reads as far as the window needs and finds what a whole read finds."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from django_distlock.engine import Backend, Lock, LockKeys, force_release
from django_distlock.engine.listing import query as listing_query
from django_distlock.engine.listing.query import Listing, LockQuery, WindowRead
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


def _rows(records):
    return [(record.name, record.token) for record in records]


def _hold(backend: Backend, stack: ExitStack, name: str, **options) -> Lock:
    lock = Lock(name, backend=backend, auto_renew=False, **options)
    assert lock.acquire(blocking=False)
    stack.callback(lambda: lock.held and lock.release())
    return lock


def test_a_window_by_ttl_is_what_a_whole_read_finds(backend, redis_client):
    rng = random.Random(31)
    with ExitStack() as stack:
        # Six locks a bucket on average: more than a first read of a bucket takes.
        for n in range(1500):
            _hold(backend, stack, f"t{n % 7}:job:{n:04}", timeout=rng.choice((30, 60, 90)))
        for n in range(12):
            for _ in range(1 + n % 3):
                _hold(backend, stack, f"t{n % 7}:shared:{n}", shared=True, timeout=60)
            _hold(backend, stack, f"t{n % 7}:slots:{n}", limit=2, timeout=45)
        # Ties: lease ends equal across buckets, which the window must read past.
        tied = [f"t{n % 7}:job:{n:04}" for n in range(0, 1500, 4)]
        end = int(redis_client.zscore(LockKeys.for_name(backend.prefix, tied[0]).index, tied[0]))
        for name in tied:
            redis_client.zadd(LockKeys.for_name(backend.prefix, name).index, {name: end}, xx=True)
        listing = Listing(backend)
        filters_cases = [(), (("startswith", "t3:"),), (("contains", "job:1"),)]
        orderings = [("ttl",), ("-ttl",), ("ttl", "-name"), ("-ttl", "name")]
        checked = 0
        for filters in filters_cases:
            for ordering in orderings:
                whole = _rows(listing.records(LockQuery(filters=filters, ordering=ordering)))
                assert whole, (filters, ordering)
                n = len(whole)
                # Near the far end, without lookups, the window is read from that end.
                for low, high in (
                    (0, 1),
                    (0, 10),
                    (5, 40),
                    (0, n),
                    (250, 400),
                    (n - 10, n),
                    (n - 40, n - 5),
                    (n - 1, n + 5),
                    (n + 2, n + 9),
                ):
                    window = LockQuery(filters=filters, ordering=ordering, low=low, high=high)
                    assert listing_query._by_lease_end(window)
                    assert _rows(listing.records(window)) == whole[low:high], (window, whole)
                    checked += 1
        assert checked == 108


def test_a_window_by_ttl_reads_as_far_as_the_window_needs(backend, monkeypatch):
    read = []
    window = Listing._window

    def counting(self, buckets, direction, wanted, lookups):
        reads = window(self, buckets, direction, wanted, lookups)
        for bucket_read in reads.values():
            read.extend(bucket_read.ends())
        return reads

    monkeypatch.setattr(Listing, "_window", counting)
    with ExitStack() as stack:
        for n in range(2000):
            _hold(backend, stack, f"job:{n}", timeout=60)
        listing = Listing(backend)
        first = listing.records(LockQuery(ordering=("-ttl",), high=10))
        assert [record.name for record in first] == [f"job:{n}" for n in range(1999, 1989, -1)]
        # Four rows a bucket at first, and a few buckets read again: not 2,000.
        assert len(read) < 4 * 256 + 2 * 10 + 200, len(read)
        read.clear()
        # The last page is read from the far end, as the first page is from the near end.
        last = listing.records(LockQuery(ordering=("-ttl",), low=1990, high=2000))
        assert len(last) == 10
        assert len(read) < 4 * 256 + 2 * 10 + 200, len(read)
        read.clear()
        everything = listing.records(LockQuery(ordering=("ttl",), high=5000))
        assert len(everything) == 2000
        assert len(read) == 2000


def test_a_window_read_goes_on_while_its_last_row_could_come_first():
    read = WindowRead(0, b"a\x0010\x00b\x0020", 1, b"", 0)
    assert read.ends() == [10, 20]
    assert read.may_hide_rows_before(None, descending=False)  # the window is not full
    assert read.may_hide_rows_before(20, descending=False)  # a tie may follow
    assert not read.may_hide_rows_before(19, descending=False)
    assert read.may_hide_rows_before(20, descending=True)
    assert not read.may_hide_rows_before(21, descending=True)
    done = WindowRead(0, b"a\x0010", 0, b"s\x00t\x0030", 0)
    assert not done.may_hide_rows_before(None, descending=False)
    holds = WindowRead(0, b"", 0, b"s\x00t\x0030", 1)
    assert holds.ends() == [30]
    assert holds.may_hide_rows_before(30, descending=False)
