"""``LockEvent``: what happened to locks (a table). ``HeldLock``: the locks held right now,
read live from Redis (an unmanaged model with no table, for the ORM-style API and the
admin)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .engine import EXCLUSIVE, LIMITED, MAX_NAME_LENGTH, SHARED
from .managers import HeldLockManager, owner_label, release_held_lock

__all__ = ["HeldLock", "LockEvent", "Mode"]


class Mode(models.TextChoices):
    """The kinds of hold (``distlock(..., shared=True)``, ``distlock(..., limit=N)``)."""

    EXCLUSIVE = EXCLUSIVE, _("exclusive")
    SHARED = SHARED, _("shared")
    LIMITED = LIMITED, _("limited")


def mode_label(mode: str, limit: int | None, holders: int | None = None) -> str:
    """``exclusive``, ``shared`` or ``limited 2/3`` (``holders`` of ``limit`` slots taken;
    ``limited 3`` when the count is unknown): a hold's kind, the same on every page."""
    if mode == LIMITED and limit is not None:
        return f"{mode} {holders}/{limit}" if holders is not None else f"{mode} {limit}"
    return mode


class LockEvent(models.Model):
    """One event in the life of a lock, recorded by the event writer (``DISTLOCK
    ["EVENTS"]``)."""

    class Kind(models.TextChoices):
        ACQUIRED = "acquired", _("acquired")
        RELEASED = "released", _("released")
        EXTENDED = "extended", _("extended")
        CONTENDED = "contended", _("contended")
        LOST = "lost", _("lost")
        FORCE_RELEASED = "force_released", _("force released")
        NOT_REPLICATED = "not_replicated", _("not replicated")

    name = models.CharField(_("lock name"), max_length=MAX_NAME_LENGTH)
    kind = models.CharField(_("kind"), max_length=16, choices=Kind.choices)
    fence = models.BigIntegerField(_("fence"), null=True, blank=True)
    host = models.CharField(_("host"), max_length=255, blank=True)
    pid = models.IntegerField(_("pid"), null=True, blank=True)
    thread = models.CharField(_("thread or task"), max_length=255, blank=True)
    context = models.CharField(_("context"), max_length=255, blank=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("user"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text=_("Who force-released the lock."),
    )
    waited_ms = models.FloatField(_("waited (ms)"), null=True, blank=True)
    held_ms = models.FloatField(_("held (ms)"), null=True, blank=True)
    reason = models.TextField(_("reason"), blank=True)
    at = models.DateTimeField(_("at"), db_index=True)
    mode = models.CharField(
        _("mode"),
        max_length=16,
        choices=Mode.choices,
        default=Mode.EXCLUSIVE,
        help_text=_("The kind of hold the event is about."),
    )
    limit = models.PositiveIntegerField(
        _("limit"),
        null=True,
        blank=True,
        help_text=_("How many holds the limited lock admits (empty for other kinds)."),
    )

    class Meta:
        verbose_name = _("lock event")
        verbose_name_plural = _("lock events")
        ordering = ("-at", "-id")
        default_permissions = ("view",)
        indexes = (
            models.Index(fields=["name", "-at"], name="distlock_event_name_at"),
            models.Index(fields=["kind", "-at"], name="distlock_event_kind_at"),
            models.Index(fields=["context", "-at"], name="distlock_event_context_at"),
        )

    def __str__(self) -> str:
        return f"{self.name} {self.get_kind_display()} at {self.at_label}"

    @property
    def at_label(self) -> str:
        """``2026-11-20 10:00:00``: when, in the current time zone, to the second (the
        same on every page; Django's default format is twice as wide)."""
        at = timezone.localtime(self.at) if timezone.is_aware(self.at) else self.at
        return f"{at:%Y-%m-%d %H:%M:%S}"

    @property
    def owner(self) -> str:
        """``host:pid thread`` of the process the event is about."""
        return owner_label(self.host, self.pid, self.thread)

    @property
    def mode_label(self) -> str:
        """``exclusive``, ``shared`` or ``limited 3`` (the limit)."""
        return mode_label(self.mode, self.limit)


class HeldLock(models.Model):
    """A hold of a lock, right now. Instances come from Redis through
    ``HeldLock.objects`` (never from the database: the model has no table): one per
    exclusive lock, one per holder of a shared or limited lock (each with its own
    token, fence and lease), so ``name`` (the primary key) is shared by the holds of
    such a lock; two instances are equal when they have the same name and token."""

    name = models.CharField(_("lock name"), max_length=MAX_NAME_LENGTH, primary_key=True)
    host = models.CharField(_("host"), max_length=255)
    pid = models.IntegerField(_("pid"), null=True)
    thread = models.CharField(_("thread or task"), max_length=255)
    context = models.CharField(_("context"), max_length=255)
    fence = models.BigIntegerField(_("fence"))
    acquired_at = models.DateTimeField(_("acquired at"))
    lease = models.FloatField(_("lease (s)"))
    ttl = models.FloatField(_("TTL remaining (s)"))
    auto_renew = models.BooleanField(_("auto-renew"))
    token = models.CharField(_("token"), max_length=64)
    mode = models.CharField(_("mode"), max_length=16, choices=Mode.choices)
    limit = models.PositiveIntegerField(
        _("limit"), null=True, help_text=_("How many holds a limited lock admits.")
    )
    holders = models.PositiveIntegerField(
        _("holders"), help_text=_("How many holds the lock had when it was read.")
    )

    objects = HeldLockManager()

    class Meta:
        managed = False
        verbose_name = _("held lock")
        verbose_name_plural = _("held locks")
        default_permissions = ("view",)
        permissions = (("force_release_heldlock", _("Can force-release a held lock")),)

    def __str__(self) -> str:
        return self.name

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HeldLock):
            return NotImplemented
        return (self.name, self.token) == (other.name, other.token)

    def __hash__(self) -> int:
        return hash((self.name, self.token))

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Held locks live in Redis: take them with ``distlock()``, not by saving."""
        raise TypeError("HeldLock instances are read from Redis and cannot be saved")

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        """Held locks are given back with ``release(force=True)``, not deleted."""
        raise TypeError("use HeldLock.release(force=True, by=user) to break a held lock")

    @property
    def owner(self) -> str:
        """``host:pid thread`` of the process that holds it."""
        return owner_label(self.host, self.pid, self.thread)

    @property
    def mode_label(self) -> str:
        """``exclusive``, ``shared`` or ``limited 2/3`` (holds taken of the limit)."""
        return mode_label(self.mode, self.limit, self.holders)

    def release(self, force: bool = False, by: Any = None) -> bool:
        """Force-release this lock (``force=True`` is required): a compare-and-delete on
        the token it was read with, so a lock that changed hands since is not touched.
        Returns whether it was released; if it was, records a ``force_released`` event
        with ``by`` (the operator); sends ``lock_force_released`` either way. The evicted
        holder finds out through its watchdog (``lock.lost``, ``on_lost``, ``LockLost``).
        For a shared or limited lock only this hold ends: the other holders keep theirs."""
        return release_held_lock(self, force=force, by=by)
