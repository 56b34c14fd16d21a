"""``HeldLock.objects``: the locks held right now, read live from Redis.

Nothing here touches the database. A :class:`HeldLockQuerySet` looks like a Django
queryset (lazy, chainable, sliceable) but is evaluated against Redis::

    HeldLock.objects.filter(name__startswith="invoice:").order_by("-acquired_at")[:50]
    HeldLock.objects.get(name="invoice:42").release(force=True, by=request.user)

A page of a listing costs two round trips, whatever the size of the keyspace:

1. The prefix's listing index (a sorted set: member = lock name, score = lease end in
   server ms) is pruned of the entries whose lease is over, by a script, and its names
   are read by a ``ZRANGE`` pipelined after it. They come in lease-end order, which is
   TTL order; name lookups and the name order are applied to them in Python.
2. One pipeline reads the values of the page's locks (``MGET``) and their lease ends
   (``ZMSCORE``); a lock released between the two reads is left out.

Ordering by ``acquired_at`` needs every matching lock's value: one more pipeline of
``MGET`` chunks of :data:`MGET_CHUNK` keys. ``KEYS`` and ``SCAN`` are never used, and
only keys under the configured prefix are ever read.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from django.core.exceptions import FieldError
from django.db import models
from redis.exceptions import NoScriptError

from .connections import get_backend
from .engine.core import Call
from .engine.eviction import unsafe_eviction_policy
from .engine.io import BACKEND_ERRORS, SyncDriver, unavailable
from .engine.keys import LockKeys, index_key, lock_key, validate_name
from .engine.listing import (
    LIST_INDEX,
    LockRecord,
    decode,
    lock_value_acquired_at_us,
    parse_lock_value,
    score_ms,
)
from .engine.scripts import RELEASE

if TYPE_CHECKING:
    from .engine import Backend
    from .models import HeldLock

__all__ = [
    "MGET_CHUNK",
    "HeldLockManager",
    "HeldLockQuerySet",
    "lock_server_eviction_policy",
    "release_held_lock",
]

MGET_CHUNK = 1000
"""Keys read per ``MGET`` or ``ZMSCORE`` (the chunks of one read go in one pipeline)."""

REPR_OUTPUT_SIZE = 20

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_NAME_FIELDS = ("name", "pk")
_LOOKUPS = ("exact", "startswith", "contains", "in")
_ORDER_FIELDS = ("name", "acquired_at", "ttl")
_SUPPORTED = "name, name__startswith, name__contains and name__in (pk works as name)"

Raw = bytes | str
"""A name or value as the client returned it. Names stay raw until shown: UTF-8 bytes
sort and match like the names they encode."""

Filter = tuple[str, Any]
"""A name lookup: ``(lookup, value)``; the value is a frozenset for ``in``."""


def _parse_lookup(key: str, value: Any) -> Filter:
    field, _, lookup = key.partition("__")
    lookup = lookup or "exact"
    if field not in _NAME_FIELDS or lookup not in _LOOKUPS:
        raise FieldError(f"HeldLock.objects.filter() got {key!r}; it supports {_SUPPORTED}")
    if lookup == "in":
        if isinstance(value, str | bytes) or not isinstance(value, Iterable):
            raise TypeError(f"{key} must be an iterable of str, not {type(value).__name__}")
        names = frozenset(value)
        for name in names:
            if not isinstance(name, str):
                raise TypeError(f"{key} must contain str values, not {type(name).__name__}")
        return lookup, names
    if not isinstance(value, str):
        raise TypeError(f"{key} must be a str, not {type(value).__name__}")
    return lookup, value


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


def _exact_names(filters: Sequence[Filter]) -> frozenset[str] | None:
    """The only names ``filters`` can match, when an exact or ``in`` lookup bounds them
    (the index is then probed for those names instead of read whole)."""
    names: frozenset[str] | None = None
    for lookup, value in filters:
        if lookup in ("exact", "in"):
            bound = frozenset((value,)) if lookup == "exact" else value
            names = bound if names is None else names & bound
    return None if names is None else frozenset(filter(_encodable, names))


def _parse_ordering(field: Any) -> str:
    if not isinstance(field, str):
        raise TypeError(f"order_by() takes field names, not {type(field).__name__}")
    bare = field.removeprefix("-")
    if bare == "pk":
        field = field.replace("pk", "name")
        bare = "name"
    if bare not in _ORDER_FIELDS:
        raise FieldError(
            f"Cannot order HeldLock by {field!r}: choose from name, acquired_at and ttl "
            "(prefixed with '-' for descending order)"
        )
    return field


def _sort_rows(rows: list[tuple[Any, ...]], ordering: Sequence[str]) -> None:
    """Sort ``(name, lease_end, acquired_at_us)`` rows in place by ``ordering``.

    Ties are broken by name, in the direction of the first field, so that
    ``order_by("-f")`` is exactly the reverse of ``order_by("f")``.
    """
    columns = {"name": 0, "ttl": 1, "acquired_at": 2}
    fields = list(ordering)
    if not any(field.removeprefix("-") == "name" for field in fields):
        fields.append("-name" if fields[0].startswith("-") else "name")
    for field in reversed(fields):  # stable sorts, last key first
        column = columns[field.removeprefix("-")]
        rows.sort(key=lambda row, column=column: row[column], reverse=field.startswith("-"))


class _Listing:
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
        client = self.backend.client
        prefix = self.backend.prefix
        index = index_key(prefix)
        chunks = [names[i : i + MGET_CHUNK] for i in range(0, len(names), MGET_CHUNK)]
        try:
            pipeline = client.pipeline(transaction=False)
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


def _instance(model: type[HeldLock], record: LockRecord) -> HeldLock:
    values = {
        "name": record.name,
        "host": record.host,
        "pid": record.pid,
        "thread": record.thread,
        "context": record.context,
        "fence": record.fence,
        "acquired_at": _EPOCH + dt.timedelta(microseconds=record.acquired_at_us),
        "lease": record.lease,
        "ttl": record.ttl,
        "auto_renew": record.auto_renew,
        "token": record.token,
    }
    # Positional arguments in field order take the model's fast path (a listing of all
    # 10,000 locks builds 10,000 instances).
    held = model(*[values[field.attname] for field in model._meta.concrete_fields])
    held._state.adding = False
    return held


class HeldLockQuerySet:
    """The held locks matching some name lookups, in some order, read from Redis when
    evaluated (iteration, ``len()``, ``count()``, ``get()``, ``first()``, ``exists()``,
    indexing). Chainable like a Django ``QuerySet``, but it is not one.

    >>> qs = HeldLock.objects.filter(name__startswith="invoice:")   # doctest: +SKIP
    >>> qs.count(), [lock.name for lock in qs.order_by("-ttl")[:10]] # doctest: +SKIP

    ``count()`` counts the listing index; iteration skips the locks released between
    reading the index and reading their values (a few milliseconds), so a page can be
    shorter than ``count()`` promised by the locks released meanwhile.
    """

    def __init__(
        self,
        model: type[HeldLock],
        *,
        filters: tuple[Filter, ...] = (),
        ordering: tuple[str, ...] = ("name",),
        low: int = 0,
        high: int | None = None,
    ) -> None:
        self.model = model
        self._filters = filters
        self._ordering = ordering
        self._low = low
        self._high = high
        self._result_cache: list[HeldLock] | None = None

    def __repr__(self) -> str:
        data: list[Any] = list(self[: REPR_OUTPUT_SIZE + 1])
        if len(data) > REPR_OUTPUT_SIZE:
            data[-1] = "...(remaining elements truncated)..."
        return f"<{type(self).__name__} {data!r}>"

    # -- chaining -------------------------------------------------------------------

    def _clone(self, **changes: Any) -> HeldLockQuerySet:
        options = {
            "filters": self._filters,
            "ordering": self._ordering,
            "low": self._low,
            "high": self._high,
            **changes,
        }
        return type(self)(self.model, **options)

    @property
    def _sliced(self) -> bool:
        return self._low != 0 or self._high is not None

    @property
    def ordered(self) -> bool:
        """Always true: listings have a deterministic order (by name unless told)."""
        return True

    def all(self) -> HeldLockQuerySet:
        """A fresh copy (evaluating it reads Redis again)."""
        return self._clone()

    def filter(self, **lookups: Any) -> HeldLockQuerySet:
        """Locks whose name matches every lookup: ``name``/``name__exact``,
        ``name__startswith``, ``name__contains``, ``name__in`` (``pk`` is ``name``).

        Values are compared as plain strings: ``*``, ``?``, ``[`` and regex characters
        match themselves. Any other lookup raises ``FieldError``.
        """
        if self._sliced:
            raise TypeError("Cannot filter a query once a slice has been taken.")
        parsed = tuple(_parse_lookup(key, value) for key, value in lookups.items())
        return self._clone(filters=self._filters + parsed)

    def order_by(self, *fields: str) -> HeldLockQuerySet:
        """Order by ``name``, ``acquired_at`` or ``ttl`` (``-`` for descending); ties
        are broken by name, so ``order_by("-f")`` is the exact reverse of
        ``order_by("f")``. ``order_by()`` restores the default, by name."""
        if self._sliced:
            raise TypeError("Cannot reorder a query once a slice has been taken.")
        ordering = tuple(_parse_ordering(field) for field in fields) or ("name",)
        return self._clone(ordering=ordering)

    def __getitem__(self, k: int | slice) -> Any:
        if not isinstance(k, int | slice):
            raise TypeError(f"HeldLockQuerySet indices must be integers or slices, not {k!r}")
        if (isinstance(k, int) and k < 0) or (
            isinstance(k, slice)
            and ((k.start is not None and k.start < 0) or (k.stop is not None and k.stop < 0))
        ):
            raise ValueError("Negative indexing is not supported.")
        if self._result_cache is not None:
            return self._result_cache[k]
        if isinstance(k, slice):
            clone = self._limited(k.start, k.stop)
            return list(clone)[:: k.step] if k.step else clone
        clone = self._limited(k, k + 1)
        clone._fetch_all()
        assert clone._result_cache is not None
        if not clone._result_cache:
            raise IndexError("HeldLockQuerySet index out of range")
        return clone._result_cache[0]

    def _limited(self, start: int | None, stop: int | None) -> HeldLockQuerySet:
        # Same arithmetic as Django's Query.set_limits: slices of slices compose.
        low, high = self._low, self._high
        if stop is not None:
            high = min(high, low + stop) if high is not None else low + stop
        if start is not None:
            low = min(high, low + start) if high is not None else low + start
        return self._clone(low=low, high=high)

    # -- evaluation -----------------------------------------------------------------

    def _read_index(self) -> _Listing:
        """The matching names, from one read of the index (one round trip)."""
        backend = get_backend()
        index = index_key(backend.prefix)
        exact = _exact_names(self._filters)
        if exact is not None:
            if not exact:
                return _Listing(backend, 0, [], in_lease_end_order=False, lease_ends={})
            call = Call(LIST_INDEX, (index,), ("=", *sorted(exact)))
            now_ms, flat = SyncDriver(backend, None).call(call)
            names = list(flat[0::2])
            ends = dict(zip(names, map(score_ms, flat[1::2]), strict=True))
            listing = _Listing(
                backend, int(now_ms), names, in_lease_end_order=False, lease_ends=ends
            )
        else:
            now_ms, names = self._prune_and_read(backend, index)
            listing = _Listing(backend, now_ms, names, in_lease_end_order=True)
        listing.names = _filtered(listing.names, self._filters)
        return listing

    @staticmethod
    def _prune_and_read(backend: Backend, index: str) -> tuple[int, list[Raw]]:
        # The names are read by a plain ZRANGE after the pruning script, in the same
        # pipeline: a Lua reply of 10,000 names costs several times more.
        client = backend.client
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

    def _ordered_names(self, listing: _Listing) -> list[Raw]:
        """The matching names in this queryset's order (vanished locks may be left out
        when the order needed their values)."""
        ordering = self._ordering
        first = ordering[0]
        descending = first.startswith("-")
        names = listing.names
        if first.removeprefix("-") == "name":
            return sorted(names, reverse=descending)
        if ordering in (("ttl",), ("-ttl",)) and listing.in_lease_end_order:
            return names[::-1] if descending else names
        fields = {field.removeprefix("-") for field in ordering}
        ends = listing.lease_ends_of(names) if "ttl" in fields else [0] * len(names)
        if "acquired_at" in fields:
            # Only the acquisition time is decoded here; the page is parsed later.
            acquired = list(map(lock_value_acquired_at_us, listing.values_of(names)))
        else:
            acquired = [0] * len(names)
        rows = [
            row
            for row in zip(names, ends, acquired, strict=True)
            if row[1] is not None and row[2] is not None
        ]
        _sort_rows(rows, ordering)
        return [row[0] for row in rows]

    def _records(self, limit: int | None = None) -> list[LockRecord]:
        """The locks of this queryset, in order (the first ``limit`` ones if given)."""
        listing = self._read_index()
        window = self._ordered_names(listing)[self._low : self._high]
        if limit is None:
            return listing.records(window)
        return listing.first_records(window, limit)

    def _fetch_all(self) -> None:
        if self._result_cache is None:
            self._result_cache = [_instance(self.model, record) for record in self._records()]

    def __iter__(self) -> Iterator[HeldLock]:
        self._fetch_all()
        assert self._result_cache is not None
        return iter(self._result_cache)

    def __len__(self) -> int:
        self._fetch_all()
        assert self._result_cache is not None
        return len(self._result_cache)

    def __bool__(self) -> bool:
        if self._result_cache is not None:
            return bool(self._result_cache)
        return self.exists()

    def count(self) -> int:
        """How many locks match, from the listing index alone (one round trip, however
        many locks are held). Once the queryset was evaluated: how many it holds."""
        if self._result_cache is not None:
            return len(self._result_cache)
        if self._filters:
            total = len(self._read_index().names)
        else:
            backend = get_backend()
            call = Call(LIST_INDEX, (index_key(backend.prefix),), ("#",))
            total = int(SyncDriver(backend, None).call(call)[1])
        if self._high is not None:
            total = min(total, self._high)
        return max(total - self._low, 0)

    def exists(self) -> bool:
        """True if at least one lock matches."""
        return self.first() is not None

    def first(self) -> HeldLock | None:
        """The first matching lock in this queryset's order, or ``None``."""
        if self._result_cache is not None:
            return self._result_cache[0] if self._result_cache else None
        records = self._records(limit=1)
        return _instance(self.model, records[0]) if records else None

    def get(self, **lookups: Any) -> HeldLock:
        """The one lock matching ``lookups`` (usually ``name=...``); raises
        ``HeldLock.DoesNotExist`` or ``HeldLock.MultipleObjectsReturned``."""
        clone = self.filter(**lookups) if lookups else self
        if clone._sliced:
            found = list(clone)
            matching = len(found)
        else:
            listing = clone._read_index()
            records = listing.first_records(listing.names, 2)
            found = [_instance(self.model, record) for record in records]
            matching = len(listing.names)
        if not found:
            raise self.model.DoesNotExist(
                f"{self.model._meta.object_name} matching query does not exist."
            )
        if len(found) > 1:
            raise self.model.MultipleObjectsReturned(
                f"get() returned more than one {self.model._meta.object_name} -- "
                f"it returned {matching}!"
            )
        return found[0]


class HeldLockManager(models.Manager):  # type: ignore[type-arg]
    """``HeldLock.objects``: querysets over the locks held right now, read from Redis
    (see :class:`HeldLockQuerySet`); there is no table behind them."""

    def get_queryset(self) -> HeldLockQuerySet:  # type: ignore[override]
        """A :class:`HeldLockQuerySet` over every held lock under the configured prefix."""
        return HeldLockQuerySet(self.model)


def lock_server_eviction_policy() -> str | None:
    """The lock server's ``maxmemory-policy`` if it can evict held locks (anything but
    ``noeviction``), else ``None``, also when it cannot be read. For the listings (the
    admin, ``distlock list``) to warn operators: one round trip, never raises.

    >>> lock_server_eviction_policy()                   # doctest: +SKIP
    'allkeys-lru'
    """
    return unsafe_eviction_policy(get_backend().client)


def release_held_lock(held: HeldLock, *, force: bool = False, by: Any = None) -> bool:
    """Break ``held``: delete the lock if it still holds the token it was read with,
    and wake one waiter. Returns ``True`` if it released it, ``False`` if the lock had
    been released or changed hands since it was read (nothing is touched then).

    This takes a lock away from a process that believes it holds it (its watchdog tells
    it: ``lock.lost``, ``lock_lost``, ``LockLost`` on leaving ``with``), so it refuses to
    run without ``force=True``. A ``force_released`` event records ``by`` (a user).
    ``HeldLock.release(force=True, by=user)`` calls this.

    >>> release_held_lock(HeldLock.objects.get(name="job"), force=True, by=user)  # doctest: +SKIP
    True
    """
    if force is not True:
        raise ValueError(
            f"releasing held lock {held.name!r} takes it away from the process holding "
            "it; operators must pass force=True"
        )
    name = validate_name(held.name)
    if not held.token:
        raise ValueError(f"held lock {name!r} was not read from Redis (it has no token)")
    backend = get_backend()
    keys = LockKeys.for_name(backend.prefix, name)
    call = Call(RELEASE, keys.all(), (held.token, held.name, backend.tuning.waiter_liveness_ms))
    released = int(SyncDriver(backend, held.name).call(call)) == 1
    from .events import record_force_release

    record_force_release(held, by, released=released)
    return released
