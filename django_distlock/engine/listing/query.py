"""The locks held right now under a backend's prefix, read from Redis, and breaking one.

A :class:`Listing` answers a :class:`LockQuery` (name lookups, an order, a window) with
:class:`~.records.LockRecord` objects, one per hold: an exclusive
lock has one, a shared or limited lock one per holder (each with its own token, fence
and lease). ``HeldLock.objects``, the admin, the ``distlock`` CLI and the benchmarks all
list locks through it.

A page costs two round trips per node, whatever the size of the keyspace:

1. Each bucket's listing indexes are read by a script per bucket, the buckets of one
   node pipelined together (an exact or ``in`` lookup reads only its names' buckets):
   the index of exclusive holds (a sorted set: member = lock name, score = lease end in
   server ms; see :data:`~django_distlock.engine.keys.BUCKETS`), pruned of the entries
   whose lease is over, and the live entries of the index of shared and limited holds
   (member = name NUL token), in the same call. A row is a name (an exclusive hold) or
   such a member (a shared or limited hold). Name lookups and the order are applied to
   the rows here.
2. One pipeline per node reads the values of the page's rows (``MGET`` of the lock keys
   and ``HMGET`` of the holders' hashes, per bucket, whose keys share a slot) and their
   lease ends (``ZMSCORE``); a hold released between the two reads is left out.

Ordering by ``acquired_at`` needs every matching row's value: one more such read.
``KEYS`` and ``SCAN`` are never used, and only keys under the prefix are ever read. The
second read and the rows' decoding are :class:`Snapshot`'s.

Breaking a hold is :func:`force_release`: a compare-and-delete on the token an operator
saw, then a notice (the name, the token, who did it) on one channel per key prefix,
``<prefix>force-released``, whose listener in the holder's process
(:mod:`..renewal.watchdog`) tells the holder at once. Who holds one lock now is
:func:`current_holder` (one ``GET`` of its key).

>>> listing = Listing(backend)                                          # doctest: +SKIP
>>> [r.name for r in listing.records(LockQuery(filters=(("startswith", "invoice:"),)))]
... # doctest: +SKIP
['invoice:42']
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..exceptions import LockError
from ..keys import (
    BUCKETS,
    EXCLUSIVE,
    FORCED_CHANNEL,
    LIMITED,
    SHARED,
    LockKeys,
    bucket_of,
    holder_index_keys,
    index_key,
    index_keys,
    lock_key,
    validate_name,
)
from ..protocol.ops import Call
from ..protocol.steps import release_steps
from ..transport.backend import Backend
from ..transport.drivers import SyncDriver
from ..transport.eviction import unsafe_eviction_policy
from ..transport.requests import BACKEND_ERRORS
from .records import (
    LockRecord,
    decode,
    lock_value_acquired_at_us,
    parse_kind,
    parse_lock_value,
    score_ms,
)
from .scripts import LIST_BUCKETS, LIST_INDEX, LIST_WINDOW

__all__ = [
    "EVERY_LOCK",
    "LOOKUPS",
    "MGET_CHUNK",
    "ORDER_FIELDS",
    "Listing",
    "LockQuery",
    "Page",
    "Raw",
    "Snapshot",
    "add_holds",
    "answered",
    "current_holder",
    "force_release",
]


logger = logging.getLogger("django_distlock")


READ_TIMEOUT = 30.0


"""Seconds a listing waits for the answers of one node at most."""


LOOKUPS = ("exact", "startswith", "contains", "in")


"""How a :class:`LockQuery` can match names (plain string operations)."""


ORDER_FIELDS = ("name", "acquired_at", "ttl")


"""What a :class:`LockQuery` can order by (``-`` prefix for descending)."""


Filter = tuple[str, Any]


"""A name lookup: ``(lookup, value)``; the value is a ``frozenset`` for ``in``."""


@dataclass(frozen=True, slots=True)
class LockQuery:
    """Which held locks to read: name lookups (all must match), an order (ties are broken
    by name, so ``-f`` is the exact reverse of ``f``) and a window ``[low:high]``."""

    filters: tuple[Filter, ...] = ()
    ordering: tuple[str, ...] = ("name",)
    low: int = 0
    high: int | None = None

    def __post_init__(self) -> None:
        for lookup, value in self.filters:
            if lookup not in LOOKUPS:
                raise ValueError(f"unknown name lookup {lookup!r}; choose from {LOOKUPS}")
            if lookup == "in" and not isinstance(value, frozenset):
                raise TypeError("an 'in' lookup takes a frozenset of names")
            if lookup != "in" and not isinstance(value, str):
                raise TypeError(f"a {lookup!r} lookup takes a str, not {type(value).__name__}")
        if not self.ordering:
            raise ValueError("a query needs at least one ordering field")
        for field in self.ordering:
            if field.removeprefix("-") not in ORDER_FIELDS:
                raise ValueError(f"cannot order by {field!r}; choose from {ORDER_FIELDS}")

    @property
    def windowed(self) -> bool:
        """True when the query reads a slice rather than every match."""
        return self.low != 0 or self.high is not None


EVERY_LOCK = LockQuery()


"""Every held lock, by name."""


@dataclass(frozen=True, slots=True)
class Page:
    """What one read found: the records of the window, in order, and how many holds the
    indexes matched (holds released since the indexes were read are left out of
    ``records`` but counted in ``matched``)."""

    records: list[LockRecord]
    matched: int


class Listing:
    """Reads the locks held under ``backend``'s prefix (one instance per read or reused;
    it keeps no state between calls)."""

    __slots__ = ("backend",)

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def records(
        self, query: LockQuery = EVERY_LOCK, *, limit: int | None = None
    ) -> list[LockRecord]:
        """The locks of ``query``'s window, in its order (the first ``limit`` of them)."""
        return self.page(query, limit=limit).records

    def page(self, query: LockQuery = EVERY_LOCK, *, limit: int | None = None) -> Page:
        """:meth:`records` with the number of holds the indexes matched."""
        if _by_lease_end(query):
            assert query.high is not None
            low, high = query.low, query.high
            # From the near end a window reads `high` rows, from the far end `total - low`.
            total = None if query.filters or not low else self.count()
            if total is not None and 0 < total - low < high:
                # Fewer rows to read from the far end: read the reverse order from there
                # (the exact reverse: ties go by name in the first field's direction).
                reverse = tuple(f[1:] if f.startswith("-") else f"-{f}" for f in query.ordering)
                snapshot = self._read_window(LockQuery(ordering=reverse), total - low)
                window = _ordered(snapshot, reverse)[max(total - high, 0) : total - low][::-1]
            else:
                snapshot = self._read_window(query, high)
                window = _ordered(snapshot, query.ordering)[low:high]
        else:
            snapshot = self._read_index(query.filters)
            window = _ordered(snapshot, query.ordering)[query.low : query.high]
        if limit is None:
            records = snapshot.records(window)
        else:
            records = snapshot.first_records(window, limit)
        return Page(records, len(snapshot.rows))

    def count(self, query: LockQuery = EVERY_LOCK) -> int:
        """How many holds ``query``'s window has, from the indexes alone (one round trip
        per node, however many locks are held): one per exclusive lock, one per holder of
        a shared or limited lock."""
        if query.filters:
            total = len(self._read_index(query.filters).rows)
        else:
            total = sum(int(read.entries) + int(read.holds) for read in self._every_bucket("#"))
        if query.high is not None:
            total = min(total, query.high)
        return max(total - query.low, 0)

    def eviction_policy(self) -> str | None:
        """The ``maxmemory-policy`` of a lock server that can evict held locks (anything
        but ``noeviction``; the first such primary's), else ``None`` (also when it cannot
        be read): for listings to warn operators. Never raises."""
        driver = self._driver()
        try:
            nodes = self.backend.routes().primaries()
        except (LockError, *BACKEND_ERRORS):
            return None
        for node in nodes:
            policy = unsafe_eviction_policy(functools.partial(_run_on, driver, node))
            if policy is not None:
                return policy
        return None

    def _every_bucket(self, mode: str) -> list[BucketRead]:
        """:data:`LIST_INDEX`'s reply (``mode`` ``*`` or ``#``) for every bucket, in bucket
        order: one script per bucket, pipelined per node, on a cluster; one script for
        them all on a single server (about twice as fast as 256 pipelined calls)."""
        indexes = _bucket_indexes(self.backend.prefix)
        driver = self._driver()
        if self.backend.is_cluster:
            calls = [Call(LIST_INDEX, keys, (mode,)) for keys in indexes]
            return [BucketRead(*reply) for reply in answered(driver.call_many(calls, READ_TIMEOUT))]
        flat = tuple(key for pair in indexes for key in pair)
        now_ms, *per_bucket = driver.call(Call(LIST_BUCKETS, flat, (mode,)))
        return [
            BucketRead(now_ms, *pair)
            for pair in zip(per_bucket[0::2], per_bucket[1::2], strict=True)
        ]

    def _driver(self) -> SyncDriver:
        return SyncDriver(self.backend, None)

    def _read_window(self, query: LockQuery, needed: int) -> Snapshot:
        """The first ``needed`` rows matching ``query`` in its lease-end order (ties
        included), read from each index's near end only (:data:`LIST_WINDOW`): a bucket
        whose last row read could still be among them is read again, further, until none
        is. About ``1.25 x needed + 4 x 256`` rows, however many locks are held."""
        descending = query.ordering[0].startswith("-")
        lookups = tuple(item for lookup in query.filters for item in lookup)
        needed = max(needed, 1)
        # A bucket's share of the window, with a margin: few buckets are read again.
        wanted = max(4, -(-5 * needed // (4 * BUCKETS)) + 2)
        reads: dict[int, WindowRead] = {}
        pending = list(range(BUCKETS))
        while pending:
            reads.update(self._window(pending, "desc" if descending else "asc", wanted, lookups))
            ends = sorted(
                (end for read in reads.values() for end in read.ends()), reverse=descending
            )
            cut = ends[needed - 1] if len(ends) >= needed else None
            pending = [
                bucket
                for bucket, read in reads.items()
                if read.may_hide_rows_before(cut, descending=descending)
            ]
            wanted *= 4
        names, ends_of, holds, now_by_bucket = _gathered(reads.items())
        return Snapshot(self.backend, names + list(holds), ends_of, now_by_bucket, holds)

    def _window(
        self, buckets: list[int], direction: str, wanted: int, lookups: tuple[Any, ...]
    ) -> dict[int, WindowRead]:
        """:data:`LIST_WINDOW`'s reply for ``buckets``: one call per bucket, pipelined per
        node, on a cluster; one call for them all on a single server."""
        indexes = _bucket_indexes(self.backend.prefix)
        args = (direction, wanted, *lookups)
        driver = self._driver()
        if self.backend.is_cluster:
            calls = [Call(LIST_WINDOW, indexes[bucket], args) for bucket in buckets]
            replies = answered(driver.call_many(calls, READ_TIMEOUT))
            return {
                bucket: WindowRead(reply[0], *reply[1:])
                for bucket, reply in zip(buckets, replies, strict=True)
            }
        flat = tuple(key for bucket in buckets for key in indexes[bucket])
        now_ms, *per_bucket = driver.call(Call(LIST_WINDOW, flat, args))
        return {
            bucket: WindowRead(now_ms, *per_bucket[4 * i : 4 * i + 4])
            for i, bucket in enumerate(buckets)
        }

    def _read_index(self, filters: Sequence[Filter]) -> Snapshot:
        """The rows matching ``filters``, with their lease ends, from one read of the
        indexes (one round trip per node)."""
        prefix = self.backend.prefix
        indexes = _bucket_indexes(prefix)
        exact = _exact_names(filters)
        if exact is not None:
            by_bucket: dict[int, list[str]] = {}
            for name in sorted(exact):
                by_bucket.setdefault(bucket_of(name), []).append(name)
            calls = [Call(LIST_INDEX, indexes[b], ("=", *names)) for b, names in by_bucket.items()]
            buckets = list(by_bucket)
        else:
            calls = []
            buckets = list(range(BUCKETS))
        if calls:
            replies = [
                BucketRead(*reply)
                for reply in answered(self._driver().call_many(calls, READ_TIMEOUT))
            ]
        else:
            replies = [] if exact is not None else self._every_bucket("*")
        names, ends, holds, now_by_bucket = _gathered(zip(buckets, replies, strict=True))
        rows = _filtered(names, filters)
        if holds:
            rows += _filtered_holds(holds, filters)
        return Snapshot(self.backend, rows, ends, now_by_bucket, holds)


def _by_lease_end(query: LockQuery) -> bool:
    """Whether ``query`` is a window ordered by TTL first (and then by name or TTL only),
    without a name lookup that bounds the names: :meth:`Listing._read_window` reads it."""
    fields = {field.removeprefix("-") for field in query.ordering}
    return (
        query.high is not None
        and query.ordering[0].removeprefix("-") == "ttl"
        and fields <= {"ttl", "name"}
        and _exact_names(query.filters) is None
    )


def _gathered(
    reads: Iterable[tuple[int, BucketRead | WindowRead]],
) -> tuple[list[Raw], dict[Raw, int], dict[Raw, tuple[Raw, Raw]], dict[int, int]]:
    """The buckets' reads together: the names of the exclusive holds, every row's lease
    end, the shared and limited holds (row -> name, token) and each bucket's clock."""
    names: list[Raw] = []
    ends: dict[Raw, int] = {}
    holds: dict[Raw, tuple[Raw, Raw]] = {}
    now_by_bucket: dict[int, int] = {}
    for bucket, read in reads:
        now_by_bucket[bucket] = int(read.now_ms)
        if read.holds:
            add_holds(read.holds, holds, ends)
        flat = _fields(read.entries)
        names += flat[0::2]
        for name, score in zip(flat[0::2], flat[1::2], strict=True):
            ends[name] = int(score)
    return names, ends, holds, now_by_bucket


def _fields(joined: Raw) -> list[Raw]:
    """The fields of rows the listing scripts joined with NUL (none for ``''``)."""
    if not joined:
        return []
    return joined.split(b"\0" if isinstance(joined, bytes) else "\0")  # type: ignore[arg-type]


@functools.lru_cache(maxsize=16)
def _bucket_indexes(prefix: str) -> tuple[tuple[str, str], ...]:
    """Each bucket's two listing indexes under ``prefix`` (the keys of :data:`LIST_INDEX`),
    built once per prefix: a listing of one name must not build 512 key names."""
    return tuple(zip(index_keys(prefix), holder_index_keys(prefix), strict=True))


def _filtered_holds(holds: dict[Raw, tuple[Raw, Raw]], filters: Sequence[Filter]) -> list[Raw]:
    """The rows of ``holds`` whose lock name matches every one of ``filters`` (never the
    token: ``contains`` must not find a name's letters in a hex token)."""
    if not filters:
        return list(holds)
    matching = set(_filtered(list({name for name, _token in holds.values()}), filters))
    return [row for row, (name, _token) in holds.items() if name in matching]


def _run_on(driver: SyncDriver, node: Any, *command: Any) -> Any:
    """Run one plain command on ``node``; an error reply is raised (redis-py's own)."""
    reply = driver.pipeline(node, [command])[0]
    if isinstance(reply, BaseException):
        raise reply
    return reply


def _filtered(names: list[Raw], filters: Sequence[Filter]) -> list[Raw]:
    """The names matching every one of ``filters``: plain string operations, so glob and
    regex characters in the values are literal. Raw (bytes) names are matched against
    the UTF-8 encoding of the values, which matches exactly the same names."""
    raw = bool(names) and isinstance(names[0], bytes)
    for lookup, value in filters:
        if raw:
            value = frozenset(map(_utf8, value)) if lookup == "in" else _utf8(value)
        if lookup == "exact":
            names = [name for name in names if name == value]
        elif lookup == "startswith":
            names = [name for name in names if name.startswith(value)]
        elif lookup == "contains":
            names = [name for name in names if value in name]
        else:
            names = [name for name in names if name in value]
    return names


def _utf8(value: str) -> bytes:
    # A lone surrogate cannot be in a lock name: encoded anyway, it matches nothing.
    return value.encode("utf-8", "surrogatepass")


def _encodable(name: str) -> bool:
    try:
        name.encode()
    except UnicodeEncodeError:
        return False
    return True


def _exact_names(filters: Iterable[Filter]) -> frozenset[str] | None:
    """The only names ``filters`` can match, when an exact or ``in`` lookup bounds them
    (the index is then probed for those names instead of read whole)."""
    names: frozenset[str] | None = None
    for lookup, value in filters:
        if lookup in ("exact", "in"):
            bound = frozenset((value,)) if lookup == "exact" else value
            names = bound if names is None else names & bound
    return None if names is None else frozenset(filter(_encodable, names))


def _ordered(snapshot: Snapshot, ordering: Sequence[str]) -> list[Raw]:
    """The matching rows in ``ordering`` (vanished holds may be left out when the order
    needed their values)."""
    first = ordering[0]
    names = snapshot.rows
    if first.removeprefix("-") == "name":
        return sorted(names, reverse=first.startswith("-"))
    fields = {field.removeprefix("-") for field in ordering}
    ends = [snapshot.ends.get(name) for name in names] if "ttl" in fields else [0] * len(names)
    if "acquired_at" in fields:
        # Only the acquisition time is decoded here; the page is parsed later.
        acquired = list(map(lock_value_acquired_at_us, snapshot.values_of(names)))
    else:
        acquired = [0] * len(names)
    rows = [
        row
        for row in zip(names, ends, acquired, strict=True)
        if row[1] is not None and row[2] is not None
    ]
    _sort_rows(rows, ordering)
    return [row[0] for row in rows]


def _sort_rows(rows: list[tuple[Any, ...]], ordering: Sequence[str]) -> None:
    """Sort ``(name, lease_end_ms, acquired_at_us)`` rows in place by ``ordering``; ties
    are broken by name, in the direction of the first field."""
    columns = {"name": 0, "ttl": 1, "acquired_at": 2}
    fields = list(ordering)
    if not any(field.removeprefix("-") == "name" for field in fields):
        fields.append("-name" if fields[0].startswith("-") else "name")
    for field in reversed(fields):  # stable sorts, last key first
        column = columns[field.removeprefix("-")]
        rows.sort(key=lambda row, column=column: row[column], reverse=field.startswith("-"))


MGET_CHUNK = 1000


"""Keys read per ``MGET`` or ``ZMSCORE`` (the chunks of one read go in one pipeline)."""


Raw = bytes | str


class BucketRead(NamedTuple):
    """One bucket's indexes, as :data:`LIST_INDEX` (or :data:`LIST_BUCKETS`, per bucket)
    answers them: ``'*'``/``'='`` give the joined rows, ``'#'`` their counts."""

    now_ms: Any
    """The server's clock when it read them."""
    entries: Any
    """Exclusive holds: ``name NUL lease_end NUL ...`` (or how many, for ``'#'``)."""
    holds: Any
    """Shared and limited holds: ``name NUL token NUL lease_end ...`` (or how many)."""


"""A name or value as the client returned it. Names stay raw until shown: UTF-8 bytes
sort and match like the names they encode. A row of a shared or limited hold is its
index member, ``name NUL token``: it sorts right after the name (NUL is the smallest
character), so a lock's holds stay together, by token."""


class WindowRead(NamedTuple):
    """One bucket's indexes as :data:`LIST_WINDOW` answers them: the first matching rows
    of each in lease-end order, and whether more may follow them."""

    now_ms: Any
    """The server's clock when it read them."""
    entries: Any
    """Exclusive holds: ``name NUL lease_end NUL ...``."""
    more: Any
    """1 when the index of exclusive holds may have more matching rows past these."""
    holds: Any
    """Shared and limited holds: ``name NUL token NUL lease_end ...``."""
    more_holds: Any
    """1 when the index of those holds may have more matching rows past these."""

    def ends(self) -> list[int]:
        """The lease ends of every row read."""
        return [int(end) for end in (*_ends(self.entries, 2), *_ends(self.holds, 3))]

    def may_hide_rows_before(self, cut: int | None, *, descending: bool) -> bool:
        """Whether a row this read did not reach could come before the window's last row,
        whose lease end is ``cut`` (``None``: the window is not full yet): an index that
        may have more rows and whose last row read does not come strictly after it."""
        for joined, more, width in ((self.entries, self.more, 2), (self.holds, self.more_holds, 3)):
            if not int(more):
                continue
            if cut is None:
                return True
            last = int(_ends(joined, width)[-1])
            if (last >= cut) if descending else (last <= cut):
                return True
        return False


def _ends(joined: Raw, width: int) -> list[Raw]:
    """The lease ends in ``joined`` rows of ``width`` fields, the last field each."""
    return _fields(joined)[width - 1 :: width]


def answered(replies: list[Any]) -> list[Any]:
    """``replies``, unless one of them is an error: then that error is raised."""
    for reply in replies:
        if isinstance(reply, BaseException):
            raise reply
    return replies


def add_holds(joined: Raw, holds: dict[Raw, tuple[Raw, Raw]], ends: dict[Raw, int]) -> None:
    """Add the shared and limited holds of one bucket (``name NUL token NUL score ...``,
    as :data:`~.scripts.LIST_INDEX` joins them) to ``holds`` (row ->
    name, token) and ``ends``."""
    nul = b"\0" if isinstance(joined, bytes) else "\0"
    flat = _fields(joined)
    for i in range(0, len(flat) - 2, 3):
        name, token = flat[i], flat[i + 1]
        row = name + nul + token  # type: ignore[operator]
        holds[row] = (name, token)
        ends[row] = int(flat[i + 2])


class Snapshot:
    """One read of the listing indexes: the matching rows (raw), their lease ends then
    (server ms: TTL order is lease-end order, and equal lease ends tie whatever moment
    each bucket was read at), each bucket's server clock (ms) at the read, and which
    rows are shared or limited holds (row -> raw name and token)."""

    __slots__ = ("backend", "ends", "holds", "now_by_bucket", "rows")

    def __init__(
        self,
        backend: Backend,
        rows: list[Raw],
        ends: dict[Raw, int],
        now_by_bucket: dict[int, int],
        holds: dict[Raw, tuple[Raw, Raw]],
    ) -> None:
        self.backend = backend
        self.rows = rows
        self.ends = ends
        self.now_by_bucket = now_by_bucket
        self.holds = holds

    def _read(
        self, rows: Sequence[Raw], *, values: bool, scores: bool, holders: bool = False
    ) -> tuple[list[Raw | None], list[int | None], list[Raw | None], list[int]]:
        """The values and/or remaining leases (ms) of ``rows``, ``None`` for the holds
        gone; one round trip per node (``MGET``, ``HMGET`` and ``ZMSCORE`` per bucket,
        whose keys share a slot). A shared or limited hold's value is its holders' hash
        entry behind its token (the layout of an exclusive lock's value); the third list
        has the ``#kind`` of its lock (``None`` for exclusive holds); with ``holders``,
        the fourth how many live holds its lock has (counted in its sorted set of holders:
        a window may have read only some of them), else 1 each."""
        if not rows:
            return [], [], [], []
        prefix = self.backend.prefix
        holds = self.holds
        by_bucket: dict[int, list[int]] = {}
        held_by: dict[int, dict[Raw, list[int]]] = {}  # bucket -> holders' name -> rows
        if holds:
            decoded = [decode(holds[row][0] if row in holds else row) for row in rows]
        else:
            decoded = [decode(row) for row in rows]
        for i, name in enumerate(decoded):
            if holds and rows[i] in holds:
                by_name = held_by.setdefault(bucket_of(name), {})
                by_name.setdefault(holds[rows[i]][0], []).append(i)
            else:
                by_bucket.setdefault(bucket_of(name), []).append(i)
        driver = SyncDriver(self.backend, None)
        routes = self.backend.routes()
        by_node: dict[Any, list[tuple[int, tuple[Any, ...]]]] = {}
        for bucket, indexes in by_bucket.items():
            node = routes.for_key(index_key(prefix, bucket))
            for start in range(0, len(indexes), MGET_CHUNK):
                chunk = indexes[start : start + MGET_CHUNK]
                if values:
                    command = ("MGET", *(lock_key(prefix, decoded[i]) for i in chunk))
                    by_node.setdefault(node, []).append((bucket, ("v", chunk, command)))
                if scores:
                    command = ("ZMSCORE", index_key(prefix, bucket), *(rows[i] for i in chunk))
                    by_node.setdefault(node, []).append((bucket, ("s", chunk, command)))
        for bucket, by_name in held_by.items():
            node = routes.for_key(index_key(prefix, bucket))
            for indexes in by_name.values():
                keys = LockKeys.for_name(prefix, decoded[indexes[0]])
                if values:
                    tokens = (holds[rows[i]][1] for i in indexes)
                    command = ("HMGET", keys.holders, "#kind", *tokens)
                    by_node.setdefault(node, []).append((bucket, ("h", indexes, command)))
                if holders:
                    live = self.now_by_bucket.get(bucket, 0)
                    command = ("ZCOUNT", keys.lock, live, "+inf")
                    by_node.setdefault(node, []).append((bucket, ("c", indexes, command)))
                if scores:
                    command = ("ZMSCORE", keys.holder_index, *(rows[i] for i in indexes))
                    by_node.setdefault(node, []).append((bucket, ("s", indexes, command)))
        read_values: list[Raw | None] = [None] * len(rows)
        read_ttls: list[int | None] = [None] * len(rows)
        kinds: list[Raw | None] = [None] * len(rows)
        counts = [1] * len(rows)
        for node, requests in by_node.items():
            replies = answered(driver.pipeline(node, [request[2] for _, request in requests]))
            for (bucket, (kind, chunk, _)), reply in zip(requests, replies, strict=True):
                if kind == "h":
                    _holder_values(rows, holds, chunk, reply, read_values, kinds)
                    continue
                if kind == "c":
                    for i in chunk:
                        counts[i] = int(reply)
                    continue
                now_ms = self.now_by_bucket.get(bucket)
                for i, item in zip(chunk, reply, strict=True):
                    if kind == "v":
                        read_values[i] = item
                    elif item is not None:
                        end = score_ms(item)
                        read_ttls[i] = end - now_ms if now_ms is not None else 0
        return read_values, read_ttls, kinds, counts

    def values_of(self, rows: Sequence[Raw]) -> list[Raw | None]:
        """The values of ``rows`` (``None`` for the holds gone)."""
        return self._read(rows, values=True, scores=False)[0]

    def records(self, rows: Sequence[Raw]) -> list[LockRecord]:
        """The holds ``rows``, in that order, leaving out the ones gone."""
        values, ttls, kinds, holders = self._read(rows, values=True, scores=True, holders=True)
        records = []
        for row, value, ttl, kind, count in zip(rows, values, ttls, kinds, holders, strict=True):
            if ttl is None:
                continue  # released meanwhile (and maybe taken again since)
            if kind is None:
                record = parse_lock_value(decode(row), value, ttl)
            else:
                name = self.holds[row][0]
                mode, limit = parse_kind(kind)
                record = parse_lock_value(
                    decode(name), value, ttl, mode=mode, limit=limit, holders=count
                )
            if record is not None:
                records.append(record)
        return records

    def first_records(self, rows: Sequence[Raw], limit: int) -> list[LockRecord]:
        """The first ``limit`` holds of ``rows`` that still exist, reading them in
        growing chunks."""
        found: list[LockRecord] = []
        start, step = 0, max(limit, 1)
        while len(found) < limit and start < len(rows):
            found += self.records(rows[start : start + step])
            start += step
            step = min(step * 4, MGET_CHUNK)
        return found[:limit]


def _holder_values(
    rows: Sequence[Raw],
    holds: dict[Raw, tuple[Raw, Raw]],
    indexes: list[int],
    reply: list[Raw | None],
    values: list[Raw | None],
    kinds: list[Raw | None],
) -> None:
    """Fill ``values`` and ``kinds`` of the holds ``indexes`` of one lock from its
    ``HMGET holders #kind token...`` ``reply``: each entry behind its token and a
    newline, which is an exclusive lock's value layout."""
    kind = reply[0]
    for i, entry in zip(indexes, reply[1:], strict=True):
        if entry is None or kind is None:
            continue
        token = holds[rows[i]][1]
        newline = b"\n" if isinstance(entry, bytes) else "\n"
        values[i] = token + newline + entry  # type: ignore[operator]
        kinds[i] = kind


def force_release(
    backend: Backend, name: str, token: str, mode: str | None = None, *, by: str = ""
) -> bool:
    """End the hold of lock ``name`` with ``token`` (the one an operator saw), if it is
    still there, and wake a waiter: the lock itself for an exclusive hold, that holder's
    slot of a shared or limited lock (the other holders keep theirs). ``False`` when it
    was released or changed hands since: nothing is touched then.

    The evicted holder's process is told at once (see the module docstring): its loss
    has cause :attr:`LostCause.FORCED` and a reason naming ``by`` (who force-released
    it, e.g. ``"user 'alice'"``).

    ``mode`` is the hold's (a :class:`~.records.LockRecord`'s ``mode``); unknown
    (``None``), both ways are tried, each a compare-and-delete on the token (two round
    trips at most)."""
    name = validate_name(name)
    if not isinstance(token, str) or not token:
        raise ValueError(f"force-releasing {name!r} needs the token it was read with")
    if mode not in (None, EXCLUSIVE, SHARED, LIMITED):
        raise ValueError(f"mode must be {EXCLUSIVE!r}, {SHARED!r}, {LIMITED!r} or None")
    keys = LockKeys.for_name(backend.prefix, name)
    liveness_ms = backend.tuning.waiter_liveness_ms
    driver = SyncDriver(backend, name)
    if mode is not None:
        released = driver.run(release_steps(keys, token, liveness_ms, mode))
    else:
        # The exclusive script leaves a lock held shared alone, and the holders' script a
        # lock held exclusively: at most one of them can release anything.
        released = driver.run(release_steps(keys, token, liveness_ms, EXCLUSIVE)) or driver.run(
            release_steps(keys, token, liveness_ms, SHARED)
        )
    if released:
        _publish(backend, keys, {"name": name, "token": token, "by": by})
    return bool(released)


def _publish(backend: Backend, keys: LockKeys, notice: dict[str, str]) -> None:
    # The hold is gone already: a notice that cannot be sent only makes its holder learn
    # it at its next renewal, so it is logged, never raised.
    channel = backend.prefix + FORCED_CHANNEL
    try:
        server = backend.routes().for_key(keys.lock)
        deadline = time.monotonic() + backend.tuning.renewal_attempt
        server.request([("PUBLISH", channel, json.dumps(notice))], deadline)
    except Exception as exc:  # noqa: BLE001 - see above
        logger.warning(
            "django-distlock: force-released lock %r, but could not tell its holder at once "
            "(%s); it learns at its next renewal",
            notice["name"],
            exc,
        )


def current_holder(backend: Backend, name: str) -> LockRecord | None:
    """Who holds the exclusive lock ``name`` of ``backend`` now, if anyone (one ``GET``;
    the record's TTL is not read)."""
    key = LockKeys.for_name(backend.prefix, name).lock
    value = SyncDriver(backend, name).execute(key, "GET", key)
    return parse_lock_value(name, value, ttl_ms=0)
