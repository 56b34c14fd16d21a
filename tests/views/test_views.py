"""``lock_view`` and ``LockViewMixin`` through Django's test clients, against real Redis:
holding, waiting, leaving, and what decoration does (names: ``test_guard.py``;
the 423 and 503 answers: ``test_responses.py``)."""

from __future__ import annotations

import json
import threading

import pytest
from asgiref.sync import sync_to_async
from django.http import HttpResponse
from django.test import Client
from django.utils.decorators import method_decorator
from django.views import View

from django_distlock import LockLost, distlock
from django_distlock.views import (
    LockViewMixin,
    lock_view,
)
from tests.support import view_urls
from tests.support.engine import blocked_clients, keys_of, lock_key, wait_until
from tests.support.view_urls import FLAVOUR_IDS, FLAVOURS, assert_locked_response

pytestmark = [pytest.mark.urls("tests.support.view_urls"), pytest.mark.usefixtures("redis_client")]


def lock_key_exists(redis_client, name: str) -> bool:
    return bool(redis_client.exists(lock_key(name)))


def assert_released(redis_client, name: str) -> None:
    assert not lock_key_exists(redis_client, name)
    assert redis_client.zscore(keys_of(name).index, name) is None


# -- holding the lock ------------------------------------------------------------------


@pytest.mark.parametrize(("flavour", "context"), FLAVOURS, ids=FLAVOUR_IDS)
def test_sync_client_view_runs_under_its_lock(client, redis_client, flavour, context):
    response = client.get(f"/{flavour}/42/")
    assert response.status_code == 200
    assert response.json() == {"held": {"invoice:42": context}}
    assert_released(redis_client, "invoice:42")


@pytest.mark.parametrize(("flavour", "context"), FLAVOURS, ids=FLAVOUR_IDS)
async def test_async_client_view_runs_under_its_lock(async_client, redis_client, flavour, context):
    response = await async_client.get(f"/{flavour}/42/")
    assert response.status_code == 200
    assert response.json() == {"held": {"invoice:42": context}}
    assert_released(redis_client, "invoice:42")


@pytest.mark.parametrize(("flavour", "context"), FLAVOURS, ids=FLAVOUR_IDS)
def test_busy_lock_answers_423_with_retry_after_from_the_holder(
    client, redis_client, flavour, context
):
    with distlock("invoice:42", timeout=30):
        response = client.get(f"/{flavour}/42/")
        other = client.get(f"/{flavour}/43/")
    assert_locked_response(response, "invoice:42", low=28, high=30)
    assert other.status_code == 200  # another object is not blocked
    assert_released(redis_client, "invoice:43")


@pytest.mark.parametrize(("flavour", "context"), FLAVOURS, ids=FLAVOUR_IDS)
async def test_busy_lock_answers_423_to_async_client(async_client, redis_client, flavour, context):
    async with distlock("invoice:42", timeout=30) as lock:
        response = await async_client.get(f"/{flavour}/42/")
        assert await lock.aowned()  # the refused request did not touch the holder's lock
    assert_locked_response(response, "invoice:42", low=28, high=30)


# -- waiting -----------------------------------------------------------------------------


def _hold_until_a_request_waits(redis_client, name: str, held: threading.Event) -> None:
    with distlock(name, timeout=30):
        held.set()
        wait_until(lambda: blocked_clients(redis_client) >= 1)


def test_waiting_view_gets_the_lock_when_the_holder_releases(client, redis_client):
    held = threading.Event()
    holder = threading.Thread(
        target=_hold_until_a_request_waits, args=(redis_client, "invoice:42", held)
    )
    holder.start()
    try:
        assert held.wait(10)
        response = client.get("/wait/42/")
    finally:
        holder.join(10)
    assert response.status_code == 200
    assert response.json() == {"held": {"invoice:42": "tests.support.view_urls.wait_pay"}}
    assert_released(redis_client, "invoice:42")


async def test_waiting_async_view_gets_the_lock_when_the_holder_releases(
    async_client, redis_client
):
    held = threading.Event()
    holder = threading.Thread(
        target=_hold_until_a_request_waits, args=(redis_client, "invoice:42", held)
    )
    holder.start()
    try:
        assert held.wait(10)
        response = await async_client.get("/await/42/")
    finally:
        holder.join(10)
    assert response.status_code == 200
    assert response.json() == {"held": {"invoice:42": "tests.support.view_urls.await_pay"}}


def test_wait_that_times_out_answers_423(client, redis_client):
    with distlock("invoice:42", timeout=30):
        response = client.get("/short-wait/42/")
    assert_locked_response(response, "invoice:42", low=28, high=30)


# -- leaving -----------------------------------------------------------------------------


def test_lock_is_released_after_the_view_raises(client, redis_client):
    with pytest.raises(view_urls.ViewFailed) as info:
        client.get("/failing/42/")
    assert json.loads(str(info.value)) == {"invoice:42": "tests.support.view_urls.failing"}
    assert_released(redis_client, "invoice:42")
    assert client.get("/pay/42/").status_code == 200


async def test_lock_is_released_after_the_async_view_raises(async_client, redis_client):
    with pytest.raises(view_urls.ViewFailed) as info:
        await async_client.get("/afailing/42/")
    assert json.loads(str(info.value)) == {"invoice:42": "tests.support.view_urls.afailing"}
    assert_released(redis_client, "invoice:42")


def test_lock_lost_during_the_view_propagates(client, redis_client):
    with pytest.raises(LockLost, match="invoice:42"):
        client.get("/losing/42/")
    assert Client(raise_request_exception=False).get("/losing/42/").status_code == 500


@pytest.mark.django_db(transaction=True)
def test_lock_lost_rolls_back_the_view_under_atomic_requests(redis_client, monkeypatch):
    from django.contrib.auth.models import Group
    from django.db import connection

    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)
    client = Client(raise_request_exception=False)
    assert client.get("/writing/1/").status_code == 200
    assert client.get("/writing/2/?steal=1").status_code == 500
    assert list(Group.objects.values_list("name", flat=True)) == ["paid-1"]


async def test_lock_lost_during_the_async_view_propagates(async_client, redis_client):
    with pytest.raises(LockLost, match="invoice:42"):
        await async_client.get("/alosing/42/")


# -- decoration details ------------------------------------------------------------------


def test_async_wrapper_is_chosen_at_decoration_time():
    from asgiref.sync import iscoroutinefunction

    assert iscoroutinefunction(view_urls.apay)
    assert not iscoroutinefunction(view_urls.pay)
    assert iscoroutinefunction(view_urls.AsyncPayView.as_view())
    assert iscoroutinefunction(view_urls.AsyncPayMixinView.as_view())
    assert view_urls.pay.__name__ == "pay"
    assert view_urls.pay.__wrapped__.__module__ == "tests.support.view_urls"


def test_lock_view_on_as_view_uses_the_class_path(rf, redis_client):
    class Plain(View):
        def get(self, request):
            return HttpResponse(json.dumps(view_urls.held_locks()))

    view = lock_view("plain")(Plain.as_view())
    response = view(rf.get("/"))
    assert json.loads(response.content) == {
        "plain": "tests.views.test_views.test_lock_view_on_as_view_uses_the_class_path"
        ".<locals>.Plain"
    }


async def test_lock_view_on_async_as_view_holds_the_lock_across_the_handler(async_rf, redis_client):
    class Plain(View):
        async def get(self, request):
            return HttpResponse(json.dumps(await view_urls.aheld_locks()))

    view = lock_view("aplain")(Plain.as_view())
    request = async_rf.get("/")
    response = await view(request)
    assert list(json.loads(response.content)) == ["aplain"]


def test_method_decorator_on_inherited_dispatch_labels_the_subclass(rf, redis_client):
    @method_decorator(lock_view("inherited"), name="dispatch")
    class Child(View):
        def get(self, request):
            return HttpResponse(json.dumps(view_urls.held_locks()))

    response = Child.as_view()(rf.get("/"))
    (context,) = json.loads(response.content).values()
    assert context.endswith(".Child")
    assert "django.views" not in context


def test_a_view_path_too_long_for_a_context_label_is_cut_to_fit(rf, redis_client):
    long = "Nested." * 40

    def pay(request):
        return HttpResponse(json.dumps(view_urls.held_locks()))

    pay.__qualname__ = long + "pay"

    class Pay(LockViewMixin, View):
        lock_name = "long-path"

        def get(self, request):
            return pay(request)

    Pay.__qualname__ = long + "Pay"
    for view, path in [(lock_view("long-path")(pay), pay), (Pay.as_view(), Pay)]:
        response = view(rf.get("/"))
        assert response.status_code == 200
        (context,) = json.loads(response.content).values()
        assert context == f"{__name__}.{path.__qualname__}"[:255]


def test_mixin_options_reach_the_lock(rf, redis_client):
    class Options(LockViewMixin, View):
        lock_name = "opts"
        lock_timeout = 7
        lock_auto_renew = False

        def get(self, request):
            return HttpResponse(str(redis_client.pttl(lock_key("opts"))))

    response = Options.as_view()(rf.get("/"))
    assert 6_000 < int(response.content) <= 7_000


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_method_decorator_on_one_handler_locks_only_that_method(
    async_rf, redis_client, is_async
):
    if is_async:

        class Handlers(View):
            async def get(self, request):
                return HttpResponse(json.dumps(await view_urls.aheld_locks()))

            @method_decorator(lock_view("post-only"))
            async def post(self, request):
                return HttpResponse(json.dumps(await view_urls.aheld_locks()))

        async def call(method):
            return await Handlers.as_view()(getattr(async_rf, method)("/"))

    else:

        class Handlers(View):
            def get(self, request):
                return HttpResponse(json.dumps(view_urls.held_locks()))

            @method_decorator(lock_view("post-only"))
            def post(self, request):
                return HttpResponse(json.dumps(view_urls.held_locks()))

        async def call(method):
            return await sync_to_async(Handlers.as_view())(getattr(async_rf, method)("/"))

    assert json.loads((await call("get")).content) == {}
    (context,) = json.loads((await call("post")).content).values()
    assert context.endswith(".Handlers")
    async with distlock("post-only"):
        assert (await call("get")).status_code == 200
        assert (await call("post")).status_code == 423


@pytest.mark.parametrize("path", ["/reports-lock/42/", "/areports-lock/42/"])
async def test_the_view_sees_its_held_lock_as_request_distlock(async_client, redis_client, path):
    response = await async_client.get(path)
    assert response.status_code == 200
    body = response.json()
    assert body["name"] == "invoice:42"
    assert body["owned"] is True
    assert body["fence"] == int(redis_client.get(keys_of("invoice:42").fence))


# -- kinds: limit, shared, reentrant ----------------------------------------------------


@pytest.mark.parametrize("path", ["/limited/7/", "/alimited/7/", "/mixin-limited/7/"])
async def test_a_limited_view_admits_n_requests_then_answers_423(async_client, path):
    async with distlock("export:7", limit=2, timeout=30):
        response = await async_client.get(path)
        assert response.status_code == 200
        assert response.json()["holds"] == [["export:7", "limited", 2]] * 2
        async with distlock("export:7", limit=2, timeout=20):
            busy = await async_client.get(path)
            other = await async_client.get(path.replace("/7/", "/8/"))
    # Retry-After: the hold whose lease ends first (20 s), not the last one.
    assert_locked_response(busy, "export:7", low=18, high=20)
    assert other.status_code == 200


def test_each_request_of_a_limited_view_has_its_own_hold(client, redis_client):
    first = client.get("/limited/7/").json()
    second = client.get("/limited/7/").json()
    assert second["fence"] > first["fence"]
    assert not redis_client.exists(lock_key("export:7"))
    assert redis_client.zcard(keys_of("export:7").holder_index) == 0


@pytest.mark.parametrize("path", ["/read-catalog/3/", "/mixin-shared/3/"])
def test_shared_views_run_together_and_exclude_an_exclusive_holder(client, path):
    with distlock("catalog:3", shared=True, timeout=30):
        response = client.get(path)
        assert response.status_code == 200
        assert response.json()["holds"] == [["catalog:3", "shared", None]] * 2
        assert_locked_response(client.get("/write-catalog/3/"), "catalog:3", low=28, high=30)
    with distlock("catalog:3", timeout=30):
        assert_locked_response(client.get(path), "catalog:3", low=28, high=30)
    assert client.get("/write-catalog/3/").json()["holds"] == [["catalog:3", "exclusive", None]]


def test_code_in_a_reentrant_view_takes_its_lock_again(client, redis_client):
    response = client.get("/reentrant/5/")
    assert response.status_code == 200
    assert response.json()["holds"] == [["order:5", "exclusive", None]]
    assert not redis_client.exists(lock_key("order:5"))


def test_bad_kind_options_are_refused_when_decorating():
    with pytest.raises(ValueError, match="limit and shared cannot be combined"):
        lock_view("x", limit=2, shared=True)
    with pytest.raises(ValueError, match="limit must be between 1"):
        lock_view("x", limit=0)
    with pytest.raises(TypeError, match="limit must be an int"):
        lock_view("x", limit="2")
    with pytest.raises(TypeError, match="shared must be a bool"):
        lock_view("x", shared="yes")
    with pytest.raises(ValueError, match=r"<locals>\.Both: shared and reentrant cannot"):

        class Both(LockViewMixin, View):
            lock_name = "x"
            lock_shared = True
            lock_reentrant = True
