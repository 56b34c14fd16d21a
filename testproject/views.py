"""Demo views: take a lock from a page and see who holds what."""

from __future__ import annotations

import asyncio
import os
import time

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from django_distlock import LockNotAcquired, distlock
from django_distlock.models import HeldLock
from django_distlock.views import locked_response

# How long /hold/<name>/ keeps its lock.
HOLD_SECONDS = float(os.environ.get("DEMO_HOLD_SECONDS", "5"))


def _held_locks() -> list[dict[str, object]]:
    return [
        {"name": held.name, "ttl": f"{held.ttl:.1f}"} for held in HeldLock.objects.order_by("-ttl")
    ]


def index(request: HttpRequest) -> HttpResponse:
    """The demo's home page: held locks and links that take one."""
    from .invoices.models import Invoice
    from .invoices.views import PAY_SECONDS

    context = {
        "held": _held_locks(),
        "seconds": HOLD_SECONDS,
        "invoices": Invoice.objects.all(),
        "pay_seconds": PAY_SECONDS,
    }
    return render(request, "demo/index.html", context)


def _busy(request: HttpRequest, name: str, busy: LockNotAcquired) -> HttpResponse:
    """An HTML 423 page with the same ``Retry-After`` as ``lock_view``'s default answer
    (the holder's remaining lease, rounded up)."""
    context = {"name": name, "retry_after": busy.retry_after}
    response = render(request, "demo/busy.html", context, status=423)
    lock_name = f"demo:{name}"
    response["Retry-After"] = locked_response(request, lock_name, busy.retry_after)["Retry-After"]
    return response


def hold(request: HttpRequest, name: str) -> HttpResponse:
    """Hold lock ``demo:<name>`` for a few seconds; a second request meanwhile is refused."""
    try:
        with distlock(f"demo:{name}", blocking=False, context="testproject.views.hold") as lock:
            fence = lock.fence
            time.sleep(HOLD_SECONDS)
    except LockNotAcquired as busy:
        return _busy(request, name, busy)
    return render(request, "demo/held.html", {"name": name, "fence": fence, "mode": "sync"})


async def ahold(request: HttpRequest, name: str) -> HttpResponse:
    """The async twin of :func:`hold`."""
    try:
        async with distlock(
            f"demo:{name}", blocking=False, context="testproject.views.ahold"
        ) as lock:
            fence = lock.fence
            await asyncio.sleep(HOLD_SECONDS)
    except LockNotAcquired as busy:
        return _busy(request, name, busy)
    return render(request, "demo/held.html", {"name": name, "fence": fence, "mode": "async"})
