"""The demo's one model: an invoice whose status is written with fenced updates."""

from django.db import models

from django_distlock import FencedQuerySet, FenceField


class Invoice(models.Model):
    number = models.CharField(max_length=20, unique=True)
    amount = models.DecimalField(max_digits=10, decimal_places=2)
    status = models.CharField(max_length=20, default="open")
    fence = FenceField()  # the fence of the last fenced write; 0 until then

    objects = FencedQuerySet.as_manager()

    class Meta:
        ordering = ("number",)

    def __str__(self) -> str:
        return self.number
