"""Models written with ``fenced_update()`` in the fencing tests."""

from __future__ import annotations

from django.db import models

from django_distlock.fencing import FencedQuerySet, FenceField


class Invoice(models.Model):
    """A row that holders of ``invoice:<number>`` write."""

    number = models.CharField(max_length=20, unique=True)
    status = models.CharField(max_length=20, default="new")
    amount = models.IntegerField(default=0)
    fence = FenceField()

    objects = FencedQuerySet.as_manager()

    def __str__(self) -> str:
        return self.number


class Note(models.Model):
    """No FenceField: ``fenced_update()`` must refuse it."""

    text = models.TextField()

    objects = FencedQuerySet.as_manager()

    def __str__(self) -> str:
        return self.text


class TwoFences(models.Model):
    """Two FenceFields: ``fenced_update()`` cannot tell which to use."""

    first = FenceField()
    second = FenceField()

    objects = FencedQuerySet.as_manager()

    def __str__(self) -> str:
        return f"{self.first}/{self.second}"
