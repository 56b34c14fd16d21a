"""``django_distlock.views.responses``: what a guarded view answers instead of running: 423
while its lock is busy, 503 while Redis is down, or the ``on_busy``/``on_unavailable``
callables of the view or the settings."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_distlock import distlock
from django_distlock.views import (
    UNAVAILABLE_RETRY_AFTER,
    lock_view,
    locked_response,
)
from tests.support import view_urls
from tests.support.view_urls import FLAVOUR_IDS, assert_locked_response

pytestmark = [pytest.mark.urls("tests.support.view_urls"), pytest.mark.usefixtures("redis_client")]


@pytest.fixture(autouse=True)
def _clean(redis_client) -> Iterator[None]:
    view_urls.busy_calls.clear()
    yield
    view_urls.busy_calls.clear()


# -- busy ----------------------------------------------------------------------------------


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


# -- busy responses of the view or the settings --------------------------------------------


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


# -- Redis down ----------------------------------------------------------------------------


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
