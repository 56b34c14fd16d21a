"""Pay an invoice from a page: a guarded view (``lock_view``) plus a fenced write.

``lock_view`` does not hand its lock to the view, so each pay view is guarded by
``pay:<pk>`` (a second click gets a friendly 423 page) and writes the status under
``distlock("invoice:<pk>")`` with ``fenced_update``: every writer of an invoice row takes
that lock, so its fence orders their writes.
"""

from __future__ import annotations

import asyncio
import os
import time

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from django_distlock import distlock, lock_view
from django_distlock.views import locked_response

from .models import Invoice

# How long a payment "talks to the gateway" while holding the lock.
PAY_SECONDS = float(os.environ.get("DEMO_PAY_SECONDS", "4"))


def busy_page(request: HttpRequest, name: str, retry_after: float | None) -> HttpResponse:
    """``on_busy`` for the pay views: an HTML 423 page, with the default Retry-After."""
    response = render(
        request, "invoices/busy.html", {"name": name, "retry_after": retry_after}, status=423
    )
    response["Retry-After"] = locked_response(request, name, retry_after)["Retry-After"]
    return response


def _paid(request: HttpRequest, pk: int, fence: int, mode: str) -> HttpResponse:
    invoice = Invoice.objects.get(pk=pk)
    return render(request, "invoices/paid.html", {"invoice": invoice, "fence": fence, "mode": mode})


@require_POST
@lock_view("pay:{pk}", timeout=10, on_busy=busy_page)
def pay(request: HttpRequest, pk: int) -> HttpResponse:
    """Sync view: guarded by ``pay:<pk>``, fenced write under ``invoice:<pk>``."""
    get_object_or_404(Invoice, pk=pk)
    time.sleep(PAY_SECONDS)  # the payment gateway is slow
    with distlock(f"invoice:{pk}", context="testproject.invoices.views.pay") as lock:
        Invoice.objects.filter(pk=pk).fenced_update(lock, status="paid")
        fence = lock.fence
    return _paid(request, pk, fence, "sync")


async def _apaid(request: HttpRequest, pk: int, fence: int, mode: str) -> HttpResponse:
    invoice = await Invoice.objects.aget(pk=pk)
    return render(request, "invoices/paid.html", {"invoice": invoice, "fence": fence, "mode": mode})


@require_POST
@lock_view("pay:{pk}", timeout=10, on_busy=busy_page)
async def apay(request: HttpRequest, pk: int) -> HttpResponse:
    """The async twin of :func:`pay` (same lock names, so they exclude each other)."""
    if not await Invoice.objects.filter(pk=pk).aexists():
        return HttpResponse("no such invoice", status=404, content_type="text/plain")
    await asyncio.sleep(PAY_SECONDS)
    async with distlock(f"invoice:{pk}", context="testproject.invoices.views.apay") as lock:
        await Invoice.objects.filter(pk=pk).afenced_update(lock, status="paid")
        fence = lock.fence
    return await _apaid(request, pk, fence, "async")


@require_POST
def reset(request: HttpRequest) -> HttpResponse:
    """Mark every invoice open again (a plain update: it keeps the stored fences)."""
    Invoice.objects.update(status="open")
    return redirect("index")
