"""One read of a prefix's listing indexes, and the second read of a listing: the values
and lease ends of the rows of a page (see :mod:`.listing`, the only user).

A row is a lock name (an exclusive hold) or a shared or limited hold's member of the
holds' index, ``name NUL token``. Exclusive rows are read with ``MGET`` of their lock
keys and ``ZMSCORE`` of the bucket's index, holds with ``HMGET`` of their lock's holders'
hash (and its ``#kind``) and ``ZMSCORE`` of the bucket's holds' index: the keys of one
bucket share a slot, so each node answers one pipeline.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from ..keys import LockKeys, bucket_of, index_key, lock_key
from ..transport.backend import Backend
from ..transport.drivers import SyncDriver
from .records import LockRecord, decode, parse_kind, parse_lock_value, score_ms

__all__ = ["MGET_CHUNK", "Raw", "Snapshot", "add_holds", "answered"]

MGET_CHUNK = 1000
"""Keys read per ``MGET`` or ``ZMSCORE`` (the chunks of one read go in one pipeline)."""

Raw = bytes | str
"""A name or value as the client returned it. Names stay raw until shown: UTF-8 bytes
sort and match like the names they encode. A row of a shared or limited hold is its
index member, ``name NUL token``: it sorts right after the name (NUL is the smallest
character), so a lock's holds stay together, by token."""


def answered(replies: list[Any]) -> list[Any]:
    """``replies``, unless one of them is an error: then that error is raised."""
    for reply in replies:
        if isinstance(reply, BaseException):
            raise reply
    return replies


def add_holds(joined: Raw, holds: dict[Raw, tuple[Raw, Raw]], ends: dict[Raw, int]) -> None:
    """Add the shared and limited holds of one bucket (``name NUL token NUL score ...``,
    as :data:`~django_distlock.engine.scripts.LIST_INDEX` joins them) to ``holds`` (row ->
    name, token) and ``ends``."""
    nul = b"\0" if isinstance(joined, bytes) else "\0"
    flat = joined.split(nul)  # type: ignore[arg-type]
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
        self, rows: Sequence[Raw], *, values: bool, scores: bool
    ) -> tuple[list[Raw | None], list[int | None], list[Raw | None]]:
        """The values and/or remaining leases (ms) of ``rows``, ``None`` for the holds
        gone; one round trip per node (``MGET``, ``HMGET`` and ``ZMSCORE`` per bucket,
        whose keys share a slot). A shared or limited hold's value is its holders' hash
        entry behind its token (the layout of an exclusive lock's value); the third list
        has the ``#kind`` of its lock (``None`` for exclusive holds)."""
        if not rows:
            return [], [], []
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
                if scores:
                    command = ("ZMSCORE", keys.holder_index, *(rows[i] for i in indexes))
                    by_node.setdefault(node, []).append((bucket, ("s", indexes, command)))
        read_values: list[Raw | None] = [None] * len(rows)
        read_ttls: list[int | None] = [None] * len(rows)
        kinds: list[Raw | None] = [None] * len(rows)
        for node, requests in by_node.items():
            replies = answered(driver.pipeline(node, [request[2] for _, request in requests]))
            for (bucket, (kind, chunk, _)), reply in zip(requests, replies, strict=True):
                if kind == "h":
                    _holder_values(rows, holds, chunk, reply, read_values, kinds)
                    continue
                now_ms = self.now_by_bucket.get(bucket)
                for i, item in zip(chunk, reply, strict=True):
                    if kind == "v":
                        read_values[i] = item
                    elif item is not None:
                        end = score_ms(item)
                        read_ttls[i] = end - now_ms if now_ms is not None else 0
        return read_values, read_ttls, kinds

    def values_of(self, rows: Sequence[Raw]) -> list[Raw | None]:
        """The values of ``rows`` (``None`` for the holds gone)."""
        return self._read(rows, values=True, scores=False)[0]

    def records(self, rows: Sequence[Raw]) -> list[LockRecord]:
        """The holds ``rows``, in that order, leaving out the ones gone."""
        values, ttls, kinds = self._read(rows, values=True, scores=True)
        records = []
        counts: Counter[Raw] | None = None
        for row, value, ttl, kind in zip(rows, values, ttls, kinds, strict=True):
            if ttl is None:
                continue  # released meanwhile (and maybe taken again since)
            if kind is None:
                record = parse_lock_value(decode(row), value, ttl)
            else:
                if counts is None:
                    counts = Counter(name for name, _token in self.holds.values())
                name = self.holds[row][0]
                mode, limit = parse_kind(kind)
                record = parse_lock_value(
                    decode(name), value, ttl, mode=mode, limit=limit, holders=counts[name]
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
