"""Storage-side fencing for ORM writes: ``FenceField`` and ``fenced_update()``.

A lease-based lock cannot stop a holder that was paused (GC, swap, a stopped VM) or cut
off from Redis past its lease from writing once it wakes up: by then another process
holds the lock. Fencing makes the *database* refuse such late writes. Every
acquisition gets a fence that is larger than all earlier ones for that lock name; rows
remember the fence of the last write, and a write carrying an older fence is refused::

    class Invoice(models.Model):
        status = models.CharField(max_length=20)
        fence = FenceField()

        objects = FencedQuerySet.as_manager()

    with distlock(f"invoice:{pk}") as lock:
        Invoice.objects.filter(pk=pk).fenced_update(lock, status="paid")
        # raises StaleFence if a newer holder of the lock already wrote this row
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.db import models, transaction
from django.db.models import Max

from .engine import Lock, LockError, LockNotOwned

__all__ = ["FenceField", "FencedQuerySet", "StaleFence"]


class StaleFence(LockError):
    """A newer holder of the lock already wrote the rows: this write was refused and
    nothing was updated.

    ``fence`` is the fence of the refused write, ``stored`` the newest fence found on
    the rows.
    """

    def __init__(self, message: str, *, name: str | None = None, fence: int, stored: int) -> None:
        super().__init__(message, name=name)
        self.fence = fence
        self.stored = stored


class FenceField(models.BigIntegerField):  # type: ignore[type-arg]
    """The fence of the last write to a row (``0``: never written under a lock).

    Add one to a model whose rows are written under a lock, and write them with
    :meth:`FencedQuerySet.fenced_update`; it is set there, so it is not editable in
    forms::

        class Invoice(models.Model):
            fence = FenceField()
            objects = FencedQuerySet.as_manager()
    """

    description = "Fencing token of the last write"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("default", 0)
        kwargs.setdefault("editable", False)
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        name, path, args, kwargs = super().deconstruct()
        if kwargs.get("default") == 0:
            del kwargs["default"]
        # Our default is the opposite of Field's, so only ``editable=True`` is written.
        if self.editable:
            kwargs["editable"] = True
        else:
            kwargs.pop("editable", None)
        return name, path, args, kwargs


def _fence_of(lock_or_fence: Any) -> tuple[int, str | None]:
    if isinstance(lock_or_fence, Lock):
        fence = lock_or_fence.fence
        if fence is None:
            raise LockNotOwned(
                f"fenced_update() needs a held lock: lock {lock_or_fence.name!r} is not held "
                "by this thread or task",
                name=lock_or_fence.name,
            )
        return fence, lock_or_fence.name
    if isinstance(lock_or_fence, int) and not isinstance(lock_or_fence, bool):
        return lock_or_fence, None
    raise TypeError(
        f"fenced_update() takes a held Lock or an int fence, not {type(lock_or_fence).__name__}"
    )


def _fence_field(model: type[models.Model]) -> FenceField:
    fields = [f for f in model._meta.concrete_fields if isinstance(f, FenceField)]
    if len(fields) != 1:
        found = ", ".join(f.name for f in fields) or "none"
        raise TypeError(
            f"fenced_update() needs exactly one FenceField on {model._meta.label}, found {found}"
        )
    return fields[0]


class FencedQuerySet(models.QuerySet):  # type: ignore[type-arg]
    """A queryset with :meth:`fenced_update`; ``FencedQuerySet.as_manager()`` makes
    the model's manager."""

    def fenced_update(self, lock_or_fence: Lock | int, /, **fields: Any) -> int:
        """``update(**fields)`` the rows of this queryset and set their FenceField to
        the fence of ``lock_or_fence`` (a held :class:`~django_distlock.engine.Lock`, or
        an ``int`` fence), unless a row already stores a newer fence: then raise
        :class:`StaleFence` and update nothing. Returns the number of rows updated.

        The fence of the lock is compared with the fences stored in the database, not
        with the lock's liveness: a holder whose lease ran out may still write rows no
        newer holder has written. Runs in one transaction; with concurrent writers the
        row locks taken by the ``UPDATE`` make the check race-free (PostgreSQL at READ
        COMMITTED, SQLite, which serializes writers).

        >>> Invoice.objects.filter(pk=42).fenced_update(lock, status="paid")  # doctest: +SKIP
        1
        """
        fence, name = _fence_of(lock_or_fence)
        return self._fenced_update(fence, name, fields)

    async def afenced_update(self, lock_or_fence: Lock | int, /, **fields: Any) -> int:
        """Async twin of :meth:`fenced_update` (the fence is read in the calling task,
        which is the one holding the lock)."""
        fence, name = _fence_of(lock_or_fence)
        return await sync_to_async(self._fenced_update)(fence, name, fields)

    def _fenced_update(self, fence: int, name: str | None, fields: dict[str, Any]) -> int:
        field = _fence_field(self.model)
        if field.name in fields or field.attname in fields:
            raise TypeError(f"fenced_update() sets {field.name!r} itself; do not pass it")
        queryset = self._chain()
        queryset._for_write = True
        with transaction.atomic(using=queryset.db):
            # Update first, check second: the UPDATE locks every row it writes, so no
            # newer holder can write them until we commit, and a row a newer holder wrote
            # first (even one we waited on) keeps its fence and is found by the check.
            # Raising inside the atomic block rolls the update back.
            updated = queryset.filter(**{f"{field.name}__lte": fence}).update(
                **fields, **{field.name: fence}
            )
            stored = queryset.filter(**{f"{field.name}__gt": fence}).aggregate(
                stored=Max(field.name)
            )["stored"]
            if stored is not None:
                raise StaleFence(
                    f"fenced_update() refused: {self.model._meta.label} rows store fence "
                    f"{stored}, newer than {fence}"
                    + (f" of lock {name!r}" if name else "")
                    + " (a newer holder of the lock wrote them); nothing was updated",
                    name=name,
                    fence=fence,
                    stored=stored,
                )
        return updated
