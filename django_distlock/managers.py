"""``HeldLock.objects``: the locks held right now, read live from Redis.

A Django face over the engine's :class:`~django_distlock.engine.Listing`:
nothing here touches the database or Redis itself. A :class:`HeldLockQuerySet` looks
like a Django queryset (lazy, chainable, sliceable) and is evaluated by the listing::

    HeldLock.objects.filter(name__startswith="invoice:").order_by("-acquired_at")[:50]
    HeldLock.objects.get(name="invoice:42").release(force=True, by=request.user)

There is one row per hold: an exclusive lock has one, a shared or limited lock one per
holder (``mode``, ``limit`` and ``holders`` say which kind and how full it is), so
``get(name=...)`` of a lock held by two shared holders raises
``MultipleObjectsReturned``; ``filter(name=...)`` lists them.

A page of a listing costs two round trips, whatever the size of the keyspace (see the
listing). Force releases are recorded by the recorder the app installs at start-up
(:func:`record_force_releases_with`), the events layer's.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from django.core.exceptions import FieldError
from django.db import models

from .connections import get_backend
from .engine import Listing, LockQuery, LockRecord, force_release

if TYPE_CHECKING:
    from .models import HeldLock

__all__ = [
    "HeldLockManager",
    "HeldLockQuerySet",
    "lock_server_eviction_policy",
    "operator_label",
    "owner_label",
    "record_force_releases_with",
    "release_held_lock",
]

REPR_OUTPUT_SIZE = 20

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_NAME_FIELDS = ("name", "pk")
_LOOKUPS = ("exact", "startswith", "contains", "in")
_ORDER_FIELDS = ("name", "acquired_at", "ttl")
_SUPPORTED = "name, name__startswith, name__contains and name__in (pk works as name)"

Filter = tuple[str, Any]
"""A name lookup: ``(lookup, value)``; the value is a frozenset for ``in``."""

_recorder: Callable[..., None] | None = None


def owner_label(host: str, pid: int | None, thread: str) -> str:
    """``host:pid thread``: the process and thread or task that holds a lock (or that an
    event is about), the one way the admin, the commands and the logs name it.

    >>> owner_label("web-3", 4242, "MainThread")
    'web-3:4242 MainThread'
    """
    return f"{host or '-'}:{'-' if pid is None else pid} {thread or '-'}"


def operator_label(by: Any) -> str:
    """Who force-released a lock, as its holder is told (``LockLost``, ``on_lost``):
    ``user 'alice'`` for a user, a string as is, ``""`` (an operator) for ``None``.

    >>> operator_label("manage.py distlock release on web-3")
    'manage.py distlock release on web-3'
    """
    if by is None:
        return ""
    if isinstance(by, str):
        return by
    get_username = getattr(by, "get_username", None)
    return f"user {get_username()!r}" if callable(get_username) else str(by)


def record_force_releases_with(recorder: Callable[..., None] | None) -> None:
    """Have ``recorder(held_lock, user, released=bool)`` called after every force
    release (the app installs the events layer's ``record_force_release``)."""
    global _recorder
    _recorder = recorder


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
        "mode": record.mode,
        "limit": record.limit,
        "holders": record.holders,
    }
    # Positional arguments in field order take the model's fast path (a listing of all
    # 10,000 locks builds 10,000 instances).
    held = model(*[values[field.attname] for field in model._meta.concrete_fields])
    held._state.adding = False
    return held


class HeldLockQuerySet:
    """The holds of the locks matching some name lookups, in some order, read from Redis
    when evaluated (iteration, ``len()``, ``count()``, ``get()``, ``first()``,
    ``exists()``, indexing). Chainable like a Django ``QuerySet``, but it is not one.

    >>> qs = HeldLock.objects.filter(name__startswith="invoice:")   # doctest: +SKIP
    >>> qs.count(), [lock.name for lock in qs.order_by("-ttl")[:10]] # doctest: +SKIP

    One row per hold (the holds of one shared or limited lock are next to each other in
    name order, by token). ``count()`` counts the listing indexes; iteration skips the
    holds released between reading the indexes and reading their values (a few
    milliseconds), so a page can be shorter than ``count()`` promised by the holds
    released meanwhile.
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

    def _query(self) -> LockQuery:
        return LockQuery(
            filters=self._filters, ordering=self._ordering, low=self._low, high=self._high
        )

    def _records(self, limit: int | None = None) -> list[LockRecord]:
        """The locks of this queryset, in order (the first ``limit`` ones if given)."""
        return Listing(get_backend()).records(self._query(), limit=limit)

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
        """How many holds match, from the listing indexes alone (one round trip, however
        many locks are held). Once the queryset was evaluated: how many it holds."""
        if self._result_cache is not None:
            return len(self._result_cache)
        return Listing(get_backend()).count(self._query())

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
            page = Listing(get_backend()).page(clone._query(), limit=2)
            found = [_instance(self.model, record) for record in page.records]
            matching = page.matched
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
    return Listing(get_backend()).eviction_policy()


def release_held_lock(held: HeldLock, *, force: bool = False, by: Any = None) -> bool:
    """Break ``held``: end that hold if the lock still has the token it was read with,
    and wake a waiter. Returns ``True`` if it released it, ``False`` if the hold had
    been released or the lock changed hands since it was read (nothing is touched then).
    For a shared or limited lock only that hold ends; the other holders keep theirs.

    This takes a lock away from a process that believes it holds it, so it refuses to
    run without ``force=True``. That process is told at once (``lock.lost``,
    ``lock_lost``, ``LockLost`` on leaving ``with``), with a reason that names ``by``
    (:func:`operator_label`). A ``force_released`` event records ``by`` (a user) when
    it released the hold; one that found nothing to release records no event (the
    history says only what happened), and the recorder still sends
    ``lock_force_released`` with ``released=False``. ``HeldLock.release(force=True,
    by=user)`` calls this.

    >>> release_held_lock(HeldLock.objects.get(name="job"), force=True, by=user)  # doctest: +SKIP
    True
    """
    if force is not True:
        raise ValueError(
            f"releasing held lock {held.name!r} takes it away from the process holding "
            "it; operators must pass force=True"
        )
    if not held.token:
        raise ValueError(f"held lock {held.name!r} was not read from Redis (it has no token)")
    released = force_release(
        get_backend(), held.name, held.token, held.mode or None, by=operator_label(by)
    )
    if _recorder is not None:
        _recorder(held, by, released=released)
    return released
