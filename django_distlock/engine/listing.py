"""The locks held right now under a backend's prefix, read from Redis, and breaking one.

A :class:`Listing` answers a :class:`LockQuery` (name lookups, an order, a window) with
:class:`~django_distlock.engine.records.LockRecord` objects. ``HeldLock.objects``, the
admin, the ``distlock`` CLI and the benchmarks all list locks through it.

A page costs two round trips, whatever the size of the keyspace:

1. The prefix's listing index (a sorted set: member = lock name, score = lease end in
   server ms) is pruned of the entries whose lease is over, by a script, and its names
   are read by a ``ZRANGE`` pipelined after it. They come in lease-end order, which is
   TTL order; name lookups and the name order are applied to them here.
2. One pipeline reads the values of the page's locks (``MGET``) and their lease ends
   (``ZMSCORE``); a lock released between the two reads is left out.

Ordering by ``acquired_at`` needs every matching lock's value: one more pipeline of
``MGET`` chunks of :data:`MGET_CHUNK` keys. ``KEYS`` and ``SCAN`` are never used, and
only keys under the prefix are ever read.

>>> listing = Listing(backend)                                          # doctest: +SKIP
>>> [r.name for r in listing.records(LockQuery(filters=(("startswith", "invoice:"),)))]
... # doctest: +SKIP
['invoice:42']
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import NoScriptError

from .backend import Backend
from .core import Call
from .eviction import unsafe_eviction_policy
from .io import BACKEND_ERRORS, SyncDriver, unavailable
from .keys import LockKeys, index_key, lock_key, validate_name
from .records import LockRecord, decode, lock_value_acquired_at_us, parse_lock_value, score_ms
from .scripts import LIST_INDEX, RELEASE

__all__ = ["EVERY_LOCK", "LOOKUPS", "MGET_CHUNK", "ORDER_FIELDS", "Listing", "LockQuery", "Page"]

MGET_CHUNK = 1000
"""Keys read per ``MGET`` or ``ZMSCORE`` (the chunks of one read go in one pipeline)."""

LOOKUPS = ("exact", "startswith", "contains", "in")
"""How a :class:`LockQuery` can match names (plain string operations)."""
ORDER_FIELDS = ("name", "acquired_at", "ttl")
"""What a :class:`LockQuery` can order by (``-`` prefix for descending)."""

Raw = bytes | str
"""A name or value as the client returned it. Names stay raw until shown: UTF-8 bytes
sort and match like the names they encode."""

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
    """What one read found: the records of the window, in order, and how many names the
    index matched (locks released since the index was read are left out of ``records``
    but counted in ``matched``)."""

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
        """:meth:`records` with the number of names the index matched."""
        snapshot = self._read_index(query.filters)
        window = _ordered(snapshot, query.ordering)[query.low : query.high]
        if limit is None:
            records = snapshot.records(window)
        else:
            records = snapshot.first_records(window, limit)
        return Page(records, len(snapshot.names))

    def count(self, query: LockQuery = EVERY_LOCK) -> int:
        """How many locks ``query``'s window holds, from the index alone (one round trip,
        however many locks are held)."""
        if query.filters:
            total = len(self._read_index(query.filters).names)
        else:
            call = Call(LIST_INDEX, (index_key(self.backend.prefix),), ("#",))
            total = int(SyncDriver(self.backend, None).call(call)[1])
        if query.high is not None:
            total = min(total, query.high)
        return max(total - query.low, 0)

    def force_release(self, name: str, token: str) -> bool:
        """Delete lock ``name`` if it still holds ``token`` (the one an operator saw),
        and wake one waiter. ``False`` when it was released or changed hands since:
        nothing is touched then. The evicted holder learns it through its watchdog."""
        name = validate_name(name)
        if not isinstance(token, str) or not token:
            raise ValueError(f"force-releasing {name!r} needs the token it was read with")
        keys = LockKeys.for_name(self.backend.prefix, name)
        liveness_ms = self.backend.tuning.waiter_liveness_ms
        call = Call(RELEASE, keys.all(), (token, name, liveness_ms))
        return int(SyncDriver(self.backend, name).call(call)) == 1

    def eviction_policy(self) -> str | None:
        """The lock server's ``maxmemory-policy`` if it can evict held locks (anything
        but ``noeviction``), else ``None`` (also when it cannot be read): for listings to
        warn operators. One round trip, never raises."""
        return unsafe_eviction_policy(self.backend.client)

    def _read_index(self, filters: Sequence[Filter]) -> _Snapshot:
        """The names matching ``filters``, from one read of the index."""
        backend = self.backend
        index = index_key(backend.prefix)
        exact = _exact_names(filters)
        if exact is not None:
            if not exact:
                return _Snapshot(backend, 0, [], in_lease_end_order=False, lease_ends={})
            call = Call(LIST_INDEX, (index,), ("=", *sorted(exact)))
            now_ms, flat = SyncDriver(backend, None).call(call)
            names = list(flat[0::2])
            ends = dict(zip(names, map(score_ms, flat[1::2]), strict=True))
            snapshot = _Snapshot(
                backend, int(now_ms), names, in_lease_end_order=False, lease_ends=ends
            )
        else:
            now_ms, names = self._prune_and_read(index)
            snapshot = _Snapshot(backend, now_ms, names, in_lease_end_order=True)
        snapshot.names = _filtered(snapshot.names, filters)
        return snapshot

    def _prune_and_read(self, index: str) -> tuple[int, list[Raw]]:
        # The names are read by a plain ZRANGE after the pruning script, in the same
        # pipeline: a Lua reply of 10,000 names costs several times more.
        client = self.backend.client
        try:
            for command in ("EVALSHA", "EVAL"):
                script = LIST_INDEX.sha if command == "EVALSHA" else LIST_INDEX.source
                pipeline = client.pipeline(transaction=False)
                pipeline.execute_command(command, script, 1, index, "-")
                pipeline.execute_command("ZRANGE", index, 0, -1)
                try:
                    (now_ms,), names = pipeline.execute()
                except NoScriptError:
                    continue
                return int(now_ms), list(names)
            raise NoScriptError("the listing script could not be loaded")  # pragma: no cover
        except BACKEND_ERRORS as exc:
            raise unavailable(None, exc) from exc


class _Snapshot:
    """One read of the listing index: the server time and the matching names, raw.

    ``in_lease_end_order``: the names are in lease-end order (ties by name), as the
    index keeps them. ``lease_ends``: the scores, when the read already returned them.
    """

    __slots__ = ("backend", "in_lease_end_order", "lease_ends", "names", "now_ms")

    def __init__(
        self,
        backend: Backend,
        now_ms: int,
        names: list[Raw],
        *,
        in_lease_end_order: bool,
        lease_ends: dict[Raw, int] | None = None,
    ) -> None:
        self.backend = backend
        self.now_ms = now_ms
        self.names = names
        self.in_lease_end_order = in_lease_end_order
        self.lease_ends = lease_ends

    def _read(
        self, names: Sequence[Raw], *, values: bool, scores: bool
    ) -> tuple[list[Raw | None], list[int | None]]:
        """The lock values and/or lease ends of ``names``, ``None`` for the locks gone;
        one round trip."""
        if not names:
            return [], []
        prefix = self.backend.prefix
        index = index_key(prefix)
        chunks = [names[i : i + MGET_CHUNK] for i in range(0, len(names), MGET_CHUNK)]
        try:
            pipeline = self.backend.client.pipeline(transaction=False)
            if values:
                for chunk in chunks:
                    pipeline.mget([lock_key(prefix, decode(name)) for name in chunk])
            if scores:
                for chunk in chunks:
                    pipeline.zmscore(index, list(chunk))
            replies = pipeline.execute()
        except BACKEND_ERRORS as exc:
            raise unavailable(None, exc) from exc
        value_replies = replies[: len(chunks)] if values else []
        score_replies = replies[-len(chunks) :] if scores else []
        read_values = [value for reply in value_replies for value in reply]
        read_scores = [
            None if score is None else score_ms(score) for reply in score_replies for score in reply
        ]
        return read_values, read_scores

    def lease_ends_of(self, names: Sequence[Raw]) -> list[int | None]:
        """The lease ends of ``names`` (``None`` for the locks gone)."""
        if self.lease_ends is not None:
            return [self.lease_ends.get(name) for name in names]
        return self._read(names, values=False, scores=True)[1]

    def values_of(self, names: Sequence[Raw]) -> list[Raw | None]:
        """The lock values of ``names`` (``None`` for the locks gone)."""
        return self._read(names, values=True, scores=False)[0]

    def records(self, names: Sequence[Raw]) -> list[LockRecord]:
        """The locks ``names``, in that order, leaving out the ones gone."""
        if self.lease_ends is not None:
            values = self.values_of(names)
            ends = self.lease_ends_of(names)
        else:
            values, ends = self._read(names, values=True, scores=True)
        records = []
        for name, value, end in zip(names, values, ends, strict=True):
            if end is None:
                continue  # released meanwhile (and maybe taken again since)
            record = parse_lock_value(decode(name), value, end - self.now_ms)
            if record is not None:
                records.append(record)
        return records

    def first_records(self, names: Sequence[Raw], limit: int) -> list[LockRecord]:
        """The first ``limit`` locks of ``names`` that still exist, reading them in
        growing chunks."""
        found: list[LockRecord] = []
        start, step = 0, max(limit, 1)
        while len(found) < limit and start < len(names):
            found += self.records(names[start : start + step])
            start += step
            step = min(step * 4, MGET_CHUNK)
        return found[:limit]


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


def _ordered(snapshot: _Snapshot, ordering: Sequence[str]) -> list[Raw]:
    """The matching names in ``ordering`` (vanished locks may be left out when the order
    needed their values)."""
    first = ordering[0]
    descending = first.startswith("-")
    names = snapshot.names
    if first.removeprefix("-") == "name":
        return sorted(names, reverse=descending)
    if tuple(ordering) in (("ttl",), ("-ttl",)) and snapshot.in_lease_end_order:
        return names[::-1] if descending else names
    fields = {field.removeprefix("-") for field in ordering}
    ends = snapshot.lease_ends_of(names) if "ttl" in fields else [0] * len(names)
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
    """Sort ``(name, lease_end, acquired_at_us)`` rows in place by ``ordering``; ties
    are broken by name, in the direction of the first field."""
    columns = {"name": 0, "ttl": 1, "acquired_at": 2}
    fields = list(ordering)
    if not any(field.removeprefix("-") == "name" for field in fields):
        fields.append("-name" if fields[0].startswith("-") else "name")
    for field in reversed(fields):  # stable sorts, last key first
        column = columns[field.removeprefix("-")]
        rows.sort(key=lambda row, column=column: row[column], reverse=field.startswith("-"))
