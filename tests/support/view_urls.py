"""Guarded views and their URLs for the view tests (``tests/views/test_views.py``,
``tests/views/test_guard.py``, ``tests/views/test_responses.py``).

Every guarded view answers with the locks held while it ran (name -> context label),
read from Redis, so tests see what the guard really held.
"""

from __future__ import annotations

import json
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth.models import Group
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.utils.decorators import method_decorator
from django.views import View

from django_distlock.connections import get_backend
from django_distlock.engine import LockBackendUnavailable, LockKeys
from django_distlock.engine.listing.query import Listing
from django_distlock.locks import distlock
from django_distlock.views import LockViewMixin, lock_view

busy_calls: list[tuple[str, str, float | None]] = []


def held_locks() -> dict[str, str] | None:
    """The locks held right now, name -> context label (None when Redis is down)."""
    try:
        return {record.name: record.context for record in Listing(get_backend()).records()}
    except LockBackendUnavailable:
        return None


async def aheld_locks() -> dict[str, str] | None:
    """Async twin of :func:`held_locks` (the listing is sync: run it off the loop)."""
    return await sync_to_async(held_locks, thread_sensitive=False)()


def _held(**extra: Any) -> JsonResponse:
    return JsonResponse({"held": held_locks(), **extra})


async def _aheld(**extra: Any) -> JsonResponse:
    return JsonResponse({"held": await aheld_locks(), **extra})


def teapot_on_busy(request: HttpRequest, name: str, retry_after: float | None) -> HttpResponse:
    busy_calls.append(("teapot", name, retry_after))
    return HttpResponse("teapot", status=418)


def settings_on_busy(request: HttpRequest, name: str, retry_after: float | None) -> HttpResponse:
    busy_calls.append(("settings", name, retry_after))
    return HttpResponse(f"settings busy {name}", status=409)


async def async_on_busy(request: HttpRequest, name: str, retry_after: float | None) -> HttpResponse:
    busy_calls.append(("async", name, retry_after))
    return HttpResponse("async busy", status=429)


not_callable_on_busy = "not a function"


@lock_view("invoice:{invoice_id}")
def pay(request: HttpRequest, invoice_id: int) -> JsonResponse:
    return _held()


@lock_view("invoice:{invoice_id}")
async def apay(request: HttpRequest, invoice_id: int) -> JsonResponse:
    return await _aheld()


@method_decorator(lock_view("invoice:{invoice_id}"), name="dispatch")
class PayView(View):
    def get(self, request: HttpRequest, invoice_id: int) -> JsonResponse:
        return _held()


@method_decorator(lock_view("invoice:{invoice_id}"), name="dispatch")
class AsyncPayView(View):
    async def get(self, request: HttpRequest, invoice_id: int) -> JsonResponse:
        return await _aheld()


class PayMixinView(LockViewMixin, View):
    lock_name = "invoice:{invoice_id}"

    def get(self, request: HttpRequest, invoice_id: int) -> JsonResponse:
        return _held()


class AsyncPayMixinView(LockViewMixin, View):
    lock_name = "invoice:{invoice_id}"

    async def get(self, request: HttpRequest, invoice_id: int) -> JsonResponse:
        return await _aheld()


class TeapotMixinView(PayMixinView):
    def lock_busy(self, request: HttpRequest, name: str, retry_after: float | None) -> Any:
        return teapot_on_busy(request, name, retry_after)


class CallableNameMixinView(LockViewMixin, View):
    def lock_name(self, request: HttpRequest, invoice_id: int) -> str:
        return f"mixin:{request.method}:{invoice_id}"

    def get(self, request: HttpRequest, invoice_id: int) -> JsonResponse:
        return _held()


class NamelessMixinView(LockViewMixin, View):
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("unreachable")


@lock_view("invoice:{invoice_id}", blocking_timeout=30)
def wait_pay(request: HttpRequest, invoice_id: int) -> JsonResponse:
    return _held()


@lock_view("invoice:{invoice_id}", blocking_timeout=30)
async def await_pay(request: HttpRequest, invoice_id: int) -> JsonResponse:
    return await _aheld()


@lock_view("invoice:{invoice_id}", blocking_timeout=0.05)
def short_wait_pay(request: HttpRequest, invoice_id: int) -> JsonResponse:
    return _held()


@lock_view("cart:{request.user.pk}")
def cart(request: HttpRequest) -> JsonResponse:
    return _held()


@lock_view(lambda request, invoice_id: f"callable:{request.method}:{invoice_id}")
def by_callable(request: HttpRequest, invoice_id: int) -> JsonResponse:
    return _held()


@lock_view("invoice:{invoice_id}", on_busy=teapot_on_busy)
def teapot(request: HttpRequest, invoice_id: int) -> JsonResponse:
    return _held()


@lock_view("invoice:{invoice_id}", on_busy=async_on_busy)
async def async_teapot(request: HttpRequest, invoice_id: int) -> JsonResponse:
    return await _aheld()


@lock_view("invoice:{invoice_id}", fail_open=True)
def fail_open(request: HttpRequest, invoice_id: int) -> JsonResponse:
    return _held(ran=True)


@lock_view("invoice:{invoice_id}", fail_open=True)
async def afail_open(request: HttpRequest, invoice_id: int) -> JsonResponse:
    return await _aheld(ran=True)


@lock_view("invoice:{invoice_id}", fail_open=False)
def fail_closed(request: HttpRequest, invoice_id: int) -> JsonResponse:
    return _held(ran=True)


def maintenance(request: HttpRequest, name: str) -> HttpResponse:
    return HttpResponse(f"maintenance for {name}", status=418)


async def amaintenance(request: HttpRequest, name: str) -> HttpResponse:
    return HttpResponse(f"async maintenance for {name}", status=418)


@lock_view("invoice:{invoice_id}", on_unavailable=maintenance)
def unavailable_hook(request: HttpRequest, invoice_id: int) -> JsonResponse:
    return _held()


@lock_view("invoice:{invoice_id}", on_unavailable=amaintenance)
async def aunavailable_hook(request: HttpRequest, invoice_id: int) -> JsonResponse:
    return await _aheld()


class UnavailableMixinView(PayMixinView):
    def lock_unavailable(self, request: HttpRequest, name: str) -> HttpResponse:
        return HttpResponse(f"mixin maintenance for {name}", status=418)


@lock_view("doc:{request.user.pk}:{slug}")
def user_doc(request: HttpRequest, slug: str) -> JsonResponse:
    return _held()


@lock_view("invoice:{invoice_id}")
def reports_its_lock(request: HttpRequest, invoice_id: int) -> JsonResponse:
    lock = request.distlock  # type: ignore[attr-defined]
    return JsonResponse({"name": lock.name, "fence": lock.fence, "owned": lock.owned()})


@lock_view("invoice:{invoice_id}")
async def areports_its_lock(request: HttpRequest, invoice_id: int) -> JsonResponse:
    lock = request.distlock  # type: ignore[attr-defined]
    return JsonResponse({"name": lock.name, "fence": lock.fence, "owned": await lock.aowned()})


class ViewFailed(Exception):
    """Raised by the failing views, so the tests can tell it from anything else."""


@lock_view("invoice:{invoice_id}")
def failing(request: HttpRequest, invoice_id: int) -> HttpResponse:
    raise ViewFailed(json.dumps(held_locks()))


@lock_view("invoice:{invoice_id}")
async def afailing(request: HttpRequest, invoice_id: int) -> HttpResponse:
    raise ViewFailed(json.dumps(await aheld_locks()))


def _steal(invoice_id: int) -> None:
    backend = get_backend()
    backend.client.delete(LockKeys.for_name(backend.prefix, f"invoice:{invoice_id}").lock)


@lock_view("invoice:{invoice_id}", auto_renew=False)
def losing(request: HttpRequest, invoice_id: int) -> HttpResponse:
    _steal(invoice_id)  # as an operator's force release would
    return HttpResponse("done")


@lock_view("invoice:{invoice_id}", auto_renew=False)
def writing(request: HttpRequest, invoice_id: int) -> HttpResponse:
    Group.objects.create(name=f"paid-{invoice_id}")
    if request.GET.get("steal"):
        _steal(invoice_id)
    return HttpResponse("paid")


@lock_view("invoice:{invoice_id}", auto_renew=False)
async def alosing(request: HttpRequest, invoice_id: int) -> HttpResponse:
    await sync_to_async(_steal, thread_sensitive=False)(invoice_id)
    return HttpResponse("done")


@method_decorator(lock_view("invoice:{missing}"), name="dispatch")
class MissingKwargView(View):
    def get(self, request: HttpRequest, invoice_id: int) -> HttpResponse:
        return HttpResponse("unreachable")


@lock_view("invoice:{request.nothing_here}")
def missing_attribute(request: HttpRequest) -> HttpResponse:
    return HttpResponse("unreachable")


def _holds(**extra: Any) -> JsonResponse:
    """The holds of the locks held right now (name, mode, limit), for the kind views."""
    records = Listing(get_backend()).records()
    holds = [[record.name, record.mode, record.limit] for record in records]
    return JsonResponse({"holds": holds, **extra})


@lock_view("export:{account_id}", limit=2)
def limited_export(request: HttpRequest, account_id: int) -> JsonResponse:
    return _holds(fence=request.distlock.fence)  # type: ignore[attr-defined]


@lock_view("export:{account_id}", limit=2)
async def alimited_export(request: HttpRequest, account_id: int) -> JsonResponse:
    holds = await sync_to_async(_holds, thread_sensitive=False)(
        fence=request.distlock.fence  # type: ignore[attr-defined]
    )
    return holds


@lock_view("catalog:{pk}", shared=True)
def read_catalog(request: HttpRequest, pk: int) -> JsonResponse:
    return _holds()


@lock_view("catalog:{pk}")
def write_catalog(request: HttpRequest, pk: int) -> JsonResponse:
    return _holds()


class LimitedMixinView(LockViewMixin, View):
    lock_name = "export:{account_id}"
    lock_limit = 2

    def get(self, request: HttpRequest, account_id: int) -> JsonResponse:
        return _holds()


class SharedMixinView(LockViewMixin, View):
    lock_name = "catalog:{pk}"
    lock_shared = True

    async def get(self, request: HttpRequest, pk: int) -> JsonResponse:
        return await sync_to_async(_holds, thread_sensitive=False)()


@lock_view("order:{pk}", reentrant=True)
def reentrant_order(request: HttpRequest, pk: int) -> JsonResponse:
    with distlock(f"order:{pk}", reentrant=True) as inner:  # a service the view calls
        return _holds(depth_fence=inner.fence)


urlpatterns = [
    path("limited/<int:account_id>/", limited_export),
    path("alimited/<int:account_id>/", alimited_export),
    path("mixin-limited/<int:account_id>/", LimitedMixinView.as_view()),
    path("read-catalog/<int:pk>/", read_catalog),
    path("write-catalog/<int:pk>/", write_catalog),
    path("mixin-shared/<int:pk>/", SharedMixinView.as_view()),
    path("reentrant/<int:pk>/", reentrant_order),
    path("pay/<int:invoice_id>/", pay),
    path("apay/<int:invoice_id>/", apay),
    path("cbv/<int:invoice_id>/", PayView.as_view()),
    path("acbv/<int:invoice_id>/", AsyncPayView.as_view()),
    path("mixin/<int:invoice_id>/", PayMixinView.as_view()),
    path("amixin/<int:invoice_id>/", AsyncPayMixinView.as_view()),
    path("mixin-teapot/<int:invoice_id>/", TeapotMixinView.as_view()),
    path("mixin-callable/<int:invoice_id>/", CallableNameMixinView.as_view()),
    path("mixin-nameless/", NamelessMixinView.as_view()),
    path("wait/<int:invoice_id>/", wait_pay),
    path("await/<int:invoice_id>/", await_pay),
    path("short-wait/<int:invoice_id>/", short_wait_pay),
    path("cart/", cart),
    path("callable/<int:invoice_id>/", by_callable),
    path("teapot/<int:invoice_id>/", teapot),
    path("async-teapot/<int:invoice_id>/", async_teapot),
    path("fail-open/<int:invoice_id>/", fail_open),
    path("afail-open/<int:invoice_id>/", afail_open),
    path("fail-closed/<int:invoice_id>/", fail_closed),
    path("unavailable-hook/<int:invoice_id>/", unavailable_hook),
    path("reports-lock/<int:invoice_id>/", reports_its_lock),
    path("areports-lock/<int:invoice_id>/", areports_its_lock),
    path("aunavailable-hook/<int:invoice_id>/", aunavailable_hook),
    path("mixin-unavailable/<int:invoice_id>/", UnavailableMixinView.as_view()),
    path("failing/<int:invoice_id>/", failing),
    path("afailing/<int:invoice_id>/", afailing),
    path("losing/<int:invoice_id>/", losing),
    path("alosing/<int:invoice_id>/", alosing),
    path("writing/<int:invoice_id>/", writing),
    path("missing-kwarg/<int:invoice_id>/", MissingKwargView.as_view()),
    path("missing-attribute/", missing_attribute),
]

# The guarded views again, on URLs whose value is any text: hostile input for lock names.
TEXT_VIEWS = {
    "pay": pay,
    "apay": apay,
    "cbv": PayView.as_view(),
    "acbv": AsyncPayView.as_view(),
    "mixin": PayMixinView.as_view(),
    "amixin": AsyncPayMixinView.as_view(),
    "mixin-callable": CallableNameMixinView.as_view(),
    "callable": by_callable,
}
urlpatterns += [
    path(f"text/{flavour}/<str:invoice_id>/", view) for flavour, view in TEXT_VIEWS.items()
]
urlpatterns += [path("text/user-doc/<str:slug>/", user_doc)]


# URL prefix -> the dotted path every flavour of guarded view stores as context label.
FLAVOURS = [
    ("pay", "tests.support.view_urls.pay"),
    ("apay", "tests.support.view_urls.apay"),
    ("cbv", "tests.support.view_urls.PayView"),
    ("acbv", "tests.support.view_urls.AsyncPayView"),
    ("mixin", "tests.support.view_urls.PayMixinView"),
    ("amixin", "tests.support.view_urls.AsyncPayMixinView"),
]
FLAVOUR_IDS = [flavour for flavour, _ in FLAVOURS]


def assert_locked_response(response: Any, name: str, *, low: int, high: int) -> None:
    """``response`` is the 423 a busy guarded view answers, with a ``Retry-After`` between
    ``low`` and ``high`` seconds."""
    assert response.status_code == 423
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert low <= int(response["Retry-After"]) <= high
    assert repr(name) in response.content.decode()
