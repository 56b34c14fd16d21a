"""``LockEvent``: what happened to locks (a table). ``HeldLock``: the locks held right now,
read live from Redis (an unmanaged model with no table, for the ORM-style API and the
admin)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from .engine.keys import MAX_NAME_LENGTH
from .heldlocks import HeldLockManager, release_held_lock

__all__ = ["HeldLock", "LockEvent"]


def owner_label(host: str, pid: int | None, thread: str) -> str:
    """``host:pid thread``: a process and its thread or task, the same on every page."""
    return f"{host or '-'}:{'-' if pid is None else pid} {thread or '-'}"


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
        return f"{self.name} {self.kind} at {self.at:%Y-%m-%d %H:%M:%S}"

    @property
    def owner(self) -> str:
        """``host:pid thread`` of the process the event is about."""
        return owner_label(self.host, self.pid, self.thread)


class HeldLock(models.Model):
    """A lock held right now. Instances come from Redis through ``HeldLock.objects``
    (never from the database: the model has no table)."""

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

    objects = HeldLockManager()

    class Meta:
        managed = False
        verbose_name = _("held lock")
        verbose_name_plural = _("held locks")
        default_permissions = ("view",)
        permissions = (("force_release_heldlock", _("Can force-release a held lock")),)

    def __str__(self) -> str:
        return self.name

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

    def release(self, force: bool = False, by: Any = None) -> bool:
        """Force-release this lock (``force=True`` is required): a compare-and-delete on
        the token it was read with, so a lock that changed hands since is not touched.
        Returns whether it was released; records a ``force_released`` event with ``by``
        (the operator) and sends ``lock_force_released``. The evicted holder finds out
        through its watchdog (``lock.lost``, ``on_lost``, ``LockLost``)."""
        return release_held_lock(self, force=force, by=by)
