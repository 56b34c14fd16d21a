"""``django_distlock.views.guard``: lock names filled from the request (templates, callables,
``lock_name`` methods) and refused when they cannot be, and ``fail_open`` while Redis is
down."""

from __future__ import annotations

import json
import logging

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.http import Http404, HttpResponse
from django.test import override_settings
from django.urls import resolve

from django_distlock import distlock
from django_distlock.engine import MAX_NAME_LENGTH
from django_distlock.views import (
    lock_view,
)
from tests.support import view_urls
from tests.support.engine import closed_port
from tests.support.view_urls import FLAVOUR_IDS

pytestmark = [pytest.mark.urls("tests.support.view_urls"), pytest.mark.usefixtures("redis_client")]


# -- names ---------------------------------------------------------------------------------


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
    assert "tests.views.test_guard" in str(info.value)


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


# -- fail open while Redis is down ---------------------------------------------------------


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
