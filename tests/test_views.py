"""``lock_view`` and ``LockViewMixin`` through Django's test clients, against real Redis."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator

import pytest
from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.http import Http404, HttpResponse
from django.test import Client, override_settings
from django.urls import resolve
from django.utils.decorators import method_decorator
from django.views import View

from django_distlock import LockLost, distlock
from django_distlock.engine import MAX_NAME_LENGTH
from django_distlock.engine.keys import index_key
from django_distlock.views import (
    UNAVAILABLE_RETRY_AFTER,
    LockViewMixin,
    lock_view,
    locked_response,
)
from tests.support import view_urls
from tests.support.engine import blocked_clients, closed_port, wait_until

pytestmark = pytest.mark.urls("tests.support.view_urls")

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


@pytest.fixture(autouse=True)
def _clean(redis_client) -> Iterator[None]:
    view_urls.busy_calls.clear()
    yield
    view_urls.busy_calls.clear()


def lock_key_exists(redis_client, name: str) -> bool:
    return bool(redis_client.exists(f"distlock:{{{name}}}"))


def assert_released(redis_client, name: str) -> None:
    assert not lock_key_exists(redis_client, name)
    assert redis_client.zscore(index_key("distlock:"), name) is None


def assert_locked_response(response, name: str, *, low: int, high: int) -> None:
    assert response.status_code == 423
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert low <= int(response["Retry-After"]) <= high
    assert repr(name) in response.content.decode()


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


def test_retry_after_is_at_least_one_second(client, redis_client):
    with distlock("invoice:42", timeout=0.3):
        response = client.get("/pay/42/")
    assert_locked_response(response, "invoice:42", low=1, high=1)


def test_locked_response_without_a_known_ttl_says_one_second():
    response = locked_response(None, "x", None)  # type: ignore[arg-type]
    assert response.status_code == 423
    assert response["Retry-After"] == "1"
    response = locked_response(None, "x", 2.01)  # type: ignore[arg-type]
    assert response["Retry-After"] == "3"


def test_locked_response_body_is_plain_text_not_html(rf, redis_client):
    name = "invoice:<script>"

    @lock_view(name)
    def view(request):
        raise AssertionError("must not run")

    with distlock(name):
        response = view(rf.get("/"))
    assert response["Content-Type"].startswith("text/plain")
    assert "<script>" in response.content.decode()  # verbatim, never HTML


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


# -- names -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_template_from_request_user(client, redis_client, django_user_model):
    user = django_user_model.objects.create_user("ada", password="x")
    client.force_login(user)
    response = client.get("/cart/")
    assert response.json() == {"held": {f"cart:{user.pk}": "tests.support.view_urls.cart"}}
    with distlock(f"cart:{user.pk}"):
        assert client.get("/cart/").status_code == 423
    other = django_user_model.objects.create_user("bob", password="x")
    client.force_login(other)
    with distlock(f"cart:{user.pk}"):
        assert client.get("/cart/").status_code == 200


def test_callable_name(client, redis_client):
    response = client.get("/callable/7/")
    assert response.json() == {"held": {"callable:GET:7": "tests.support.view_urls.by_callable"}}
    with distlock("callable:GET:7"):
        assert client.get("/callable/7/").status_code == 423


def test_mixin_lock_name_method(client, redis_client):
    response = client.get("/mixin-callable/7/")
    assert response.json() == {
        "held": {"mixin:GET:7": "tests.support.view_urls.CallableNameMixinView"}
    }


def test_positional_url_arguments_fill_numbered_fields(rf, redis_client):
    @lock_view("pos:{0}")
    def view(request, *args):
        return HttpResponse(json.dumps(view_urls.held_locks()))

    response = view(rf.get("/"), "abc")
    assert list(json.loads(response.content)) == ["pos:abc"]


def test_template_field_the_view_cannot_receive_fails_at_decoration():
    def view(request, invoice_id):
        raise AssertionError("unreachable")

    with pytest.raises(ImproperlyConfigured, match=r"\{pk\}.*no argument 'pk'") as info:
        lock_view("invoice:{pk}")(view)
    assert "tests.test_views" in str(info.value)


def test_missing_url_kwarg_is_improperly_configured_naming_field_and_view(client, redis_client):
    with pytest.raises(ImproperlyConfigured) as info:
        client.get("/missing-kwarg/42/")
    message = str(info.value)
    assert "{missing}" in message
    assert "tests.support.view_urls.MissingKwargView" in message
    assert "invoice_id" in message  # what the URL did give


def test_missing_request_attribute_is_improperly_configured(client, redis_client):
    with pytest.raises(ImproperlyConfigured, match=r"\{request\.nothing_here\}.*missing_attri"):
        client.get("/missing-attribute/")


TEXT_FLAVOURS = [*view_urls.TEXT_VIEWS, "user-doc"]


@pytest.fixture
def closed_redis_url() -> str:
    """A URL nobody listens on: a view that reached Redis there would answer 503."""
    return f"redis://127.0.0.1:{closed_port()}/0"


HOSTILE_URL_VALUES = {"600-chars": "x" * 600, "nul": "a%00b", "nul-only": "%00"}


@pytest.mark.parametrize("value", HOSTILE_URL_VALUES.values(), ids=HOSTILE_URL_VALUES.keys())
@pytest.mark.parametrize("flavour", TEXT_FLAVOURS)
def test_url_value_that_cannot_be_in_a_lock_name_answers_404(
    client, closed_redis_url, flavour, value
):
    with override_settings(DISTLOCK={"EVENTS": "off", "URL": closed_redis_url}):
        response = client.get(f"/text/{flavour}/{value}/")
    assert response.status_code == 404


@pytest.mark.parametrize("value", HOSTILE_URL_VALUES.values(), ids=HOSTILE_URL_VALUES.keys())
@pytest.mark.parametrize("flavour", TEXT_FLAVOURS)
async def test_url_value_that_cannot_be_in_a_lock_name_answers_404_to_async_client(
    async_client, closed_redis_url, flavour, value
):
    with override_settings(DISTLOCK={"EVENTS": "off", "URL": closed_redis_url}):
        response = await async_client.get(f"/text/{flavour}/{value}/")
    assert response.status_code == 404


@pytest.mark.parametrize("flavour", ["pay", "cbv", "mixin", "mixin-callable", "callable"])
def test_url_value_not_encodable_as_utf8_raises_http404(rf, closed_redis_url, flavour):
    # A WSGI/ASGI path cannot carry a lone surrogate; a view called directly can.
    view = resolve(f"/text/{flavour}/x/").func
    with (
        override_settings(DISTLOCK={"EVENTS": "off", "URL": closed_redis_url}),
        pytest.raises(Http404, match="lock name"),
    ):
        view(rf.get("/"), invoice_id="lone\ud800")


def test_longest_url_value_that_fits_still_locks(client, redis_client):
    value = "x" * (MAX_NAME_LENGTH - len("invoice:"))
    response = client.get(f"/text/pay/{value}/")
    assert response.json() == {"held": {f"invoice:{value}": "tests.support.view_urls.pay"}}


def test_invalid_template_and_options_fail_at_decoration():
    with pytest.raises(ImproperlyConfigured, match="not a valid template"):
        lock_view("invoice:{")
    with pytest.raises(TypeError, match="str template or a callable"):
        lock_view(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="blocking_timeout must be zero or positive"):
        lock_view("x", blocking_timeout=-1)
    with pytest.raises(TypeError, match="blocking_timeout must be a number"):
        lock_view("x", blocking_timeout=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout must be positive"):
        lock_view("x", timeout=0)
    with pytest.raises(ValueError, match="timeout must be at most"):
        lock_view("x", timeout=1e16)
    with pytest.raises(ValueError, match="blocking_timeout must be at most"):
        lock_view("x", blocking_timeout=10**400)
    with pytest.raises(TypeError, match="on_busy must be callable"):
        lock_view("x", on_busy="tests.support.view_urls.teapot_on_busy")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="fail_open must be a bool"):
        lock_view("x", fail_open=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="lock_view decorates views"):
        lock_view("x")("not a view")  # type: ignore[type-var]


def test_mixin_without_lock_name_is_improperly_configured(client, redis_client):
    with pytest.raises(ImproperlyConfigured, match=r"NamelessMixinView.*no lock_name"):
        client.get("/mixin-nameless/")


# -- busy responses ----------------------------------------------------------------------


def test_on_busy_per_view(client, redis_client):
    with distlock("invoice:42", timeout=30):
        response = client.get("/teapot/42/")
    assert response.status_code == 418
    [(who, name, retry_after)] = view_urls.busy_calls
    assert (who, name) == ("teapot", "invoice:42")
    assert 28 < retry_after <= 30


async def test_async_on_busy_for_async_view(async_client, redis_client):
    async with distlock("invoice:42", timeout=30):
        response = await async_client.get("/async-teapot/42/")
    assert response.status_code == 429
    assert [call[:2] for call in view_urls.busy_calls] == [("async", "invoice:42")]


@pytest.mark.parametrize("flavour", FLAVOUR_IDS)
def test_on_busy_from_settings(client, redis_client, flavour):
    on_busy = {"EVENTS": "off", "VIEW_ON_BUSY": "tests.support.view_urls.settings_on_busy"}
    with override_settings(DISTLOCK=on_busy), distlock("invoice:42", timeout=30):
        response = client.get(f"/{flavour}/42/")
    assert response.status_code == 409
    assert response.content == b"settings busy invoice:42"


def test_per_view_on_busy_beats_settings(client, redis_client):
    on_busy = {"EVENTS": "off", "VIEW_ON_BUSY": "tests.support.view_urls.settings_on_busy"}
    with override_settings(DISTLOCK=on_busy), distlock("invoice:42"):
        assert client.get("/teapot/42/").status_code == 418
        assert client.get("/mixin-teapot/42/").status_code == 418
    assert [call[0] for call in view_urls.busy_calls] == ["teapot", "teapot"]


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("tests.support.view_urls.nowhere", "cannot be imported"),
        ("tests.support.view_urls.not_callable_on_busy", "not a callable"),
    ],
)
def test_broken_on_busy_setting_is_improperly_configured(client, redis_client, path, message):
    with (
        override_settings(DISTLOCK={"EVENTS": "off", "VIEW_ON_BUSY": path}),
        distlock("invoice:42"),
        pytest.raises(ImproperlyConfigured, match=message),
    ):
        client.get("/pay/42/")


# -- Redis down --------------------------------------------------------------------------


@pytest.fixture
def dead_redis_url(private_redis) -> str:
    url = private_redis.url
    private_redis.stop()
    return url


@pytest.mark.parametrize("flavour", FLAVOUR_IDS)
def test_backend_down_answers_503(client, dead_redis_url, flavour, caplog):
    with override_settings(DISTLOCK={"EVENTS": "off", "URL": dead_redis_url}):
        response = client.get(f"/{flavour}/42/")
    assert response.status_code == 503
    assert response["Retry-After"] == str(UNAVAILABLE_RETRY_AFTER)
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert any("answering 503" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("flavour", FLAVOUR_IDS)
async def test_backend_down_answers_503_to_async_client(async_client, dead_redis_url, flavour):
    with override_settings(DISTLOCK={"EVENTS": "off", "URL": dead_redis_url}):
        response = await async_client.get(f"/{flavour}/42/")
    assert response.status_code == 503


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/unavailable-hook/42/", b"maintenance for invoice:42"),
        ("/aunavailable-hook/42/", b"async maintenance for invoice:42"),
        ("/mixin-unavailable/42/", b"mixin maintenance for invoice:42"),
    ],
)
async def test_on_unavailable_answers_when_redis_is_down(async_client, dead_redis_url, path, body):
    with override_settings(DISTLOCK={"EVENTS": "off", "URL": dead_redis_url}):
        response = await async_client.get(path)
    assert response.status_code == 418
    assert response.content == body


def test_view_on_unavailable_setting(client, dead_redis_url):
    setting = {
        "EVENTS": "off",
        "URL": dead_redis_url,
        "VIEW_ON_UNAVAILABLE": "tests.support.view_urls.maintenance",
    }
    with override_settings(DISTLOCK=setting):
        response = client.get("/pay/42/")
        assert response.status_code == 418
        assert response.content == b"maintenance for invoice:42"
        # A per-view hook beats the setting.
        assert client.get("/mixin-unavailable/42/").content == b"mixin maintenance for invoice:42"


def test_on_unavailable_must_be_callable():
    with pytest.raises(TypeError, match="on_unavailable must be callable"):
        lock_view("x", on_unavailable="tests.support.view_urls.maintenance")  # type: ignore[arg-type]


def test_fail_open_runs_the_view_unguarded_and_logs(client, dead_redis_url, caplog):
    with (
        override_settings(DISTLOCK={"EVENTS": "off", "URL": dead_redis_url}),
        caplog.at_level(logging.WARNING),
    ):
        response = client.get("/fail-open/42/")
    assert response.status_code == 200
    assert response.json() == {"held": None, "ran": True}  # it ran, and Redis was down
    [record] = [r for r in caplog.records if r.name == "django_distlock.views"]
    assert record.levelno == logging.WARNING
    assert "without lock 'invoice:42'" in record.getMessage()
    assert "tests.support.view_urls.fail_open" in record.getMessage()


async def test_fail_open_async_view(async_client, dead_redis_url):
    with override_settings(DISTLOCK={"EVENTS": "off", "URL": dead_redis_url}):
        response = await async_client.get("/afail-open/42/")
    assert response.json() == {"held": None, "ran": True}


@pytest.mark.parametrize("flavour", FLAVOUR_IDS)
def test_fail_open_setting(client, dead_redis_url, flavour):
    with override_settings(
        DISTLOCK={"EVENTS": "off", "URL": dead_redis_url, "VIEW_FAIL_OPEN": True}
    ):
        assert client.get(f"/{flavour}/42/").status_code == 200
        assert client.get("/fail-closed/42/").status_code == 503  # per view beats settings


def test_fail_open_still_locks_while_redis_is_up(client, redis_client):
    with distlock("invoice:42"):
        assert client.get("/fail-open/42/").status_code == 423
    response = client.get("/fail-open/42/")
    assert response.json() == {
        "held": {"invoice:42": "tests.support.view_urls.fail_open"},
        "ran": True,
    }


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
        "plain": "tests.test_views.test_lock_view_on_as_view_uses_the_class_path.<locals>.Plain"
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
            return HttpResponse(str(redis_client.pttl("distlock:{opts}")))

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
    assert body["fence"] == int(redis_client.get("distlock:{invoice:42}:fence"))
