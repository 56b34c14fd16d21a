"""``distlock()``: locks configured from the Django settings."""

from __future__ import annotations

import asyncio
import time

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_distlock import LockBackendUnavailable, LockNotAcquired, distlock
from django_distlock.connections import get_backend
from tests.support.engine import keys_of, lock_key, stored_lock


def _cache(location: str, **options: object) -> dict[str, object]:
    return {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": location,
            "OPTIONS": options,
        }
    }


def test_zero_configuration_uses_the_default_django_redis_cache(redis_client):
    with distlock("invoice:42") as lock:
        assert stored_lock(redis_client, "invoice:42").fence == lock.fence
        assert redis_client.exists(lock_key("invoice:42"))
        assert redis_client.pttl(lock_key("invoice:42")) > 29_000  # default TIMEOUT 30 s
    assert not redis_client.exists(lock_key("invoice:42"))


def test_sync_locks_share_the_django_redis_client(redis_client):
    from django_redis import get_redis_connection

    assert get_backend().client is get_redis_connection("default")


async def test_async_lock_uses_the_same_redis(redis_client):
    async with distlock("invoice:43") as lock:
        assert stored_lock(redis_client, "invoice:43").fence == lock.fence
        assert redis_client.exists(lock_key("invoice:43"))
        assert await lock.aowned()
    assert not redis_client.exists(lock_key("invoice:43"))


def test_settings_changes_apply_to_existing_decorated_functions(redis_client):
    seen: list[list[bytes]] = []

    @distlock("report:{day}")
    def build_report(day: str) -> None:
        seen.append(sorted(k for k in redis_client.keys("*") if b":report:" in k))

    build_report("mon")
    with override_settings(DISTLOCK={"EVENTS": "off", "KEY_PREFIX": "other:", "TIMEOUT": 5}):
        build_report("tue")
    mon, tue = keys_of("report:mon"), keys_of("report:tue", prefix="other:")
    assert seen[0] == sorted([mon.lock.encode(), mon.fence.encode()])
    # The first lock's fence counter outlives its release, by design.
    assert seen[1] == sorted([mon.fence.encode(), tue.lock.encode(), tue.fence.encode()])


def test_timeout_and_auto_renew_defaults_come_from_settings(redis_client):
    with (
        override_settings(DISTLOCK={"EVENTS": "off", "TIMEOUT": 5, "AUTO_RENEW": False}),
        distlock("t") as lock,
    ):
        pttl = redis_client.pttl(lock_key("t"))
        assert 4_000 < pttl <= 5_000
        owner = redis_client.get(lock_key("t")).split(b"\n", 4)[4]
        assert b'"auto_renew":false' in owner
        assert 4 < lock.valid_until - time.time() <= 5


def test_explicit_arguments_beat_settings(redis_client):
    with override_settings(DISTLOCK={"EVENTS": "off", "TIMEOUT": 5}), distlock("t", timeout=60):
        assert redis_client.pttl(lock_key("t")) > 59_000


def test_url_setting_overrides_the_cache(redis_client, private_redis):
    other = private_redis.client()
    with override_settings(DISTLOCK={"EVENTS": "off", "URL": private_redis.url}):
        with distlock("elsewhere"):
            assert other.exists(lock_key("elsewhere"))
            assert not redis_client.exists(lock_key("elsewhere"))

        async def use_async() -> bool:
            async with distlock("elsewhere-async"):
                return bool(other.exists(lock_key("elsewhere-async")))

        assert asyncio.run(use_async())


def test_cache_options_reach_sync_and_async_clients(redis_server_factory):
    server = redis_server_factory(password="s3cret")
    location = f"redis://127.0.0.1:{server.port}/0"
    with override_settings(CACHES=_cache(location, PASSWORD="s3cret", SOCKET_TIMEOUT=2)):
        with distlock("pw") as lock:
            assert lock.owned()

        async def use_async() -> bool:
            async with distlock("pw-async") as lock:
                return await lock.aowned()

        assert asyncio.run(use_async())
    # Without the password our async client is refused. (The sync client is django-redis's
    # own, and django-redis keeps its pools per URL across settings changes.)
    with override_settings(CACHES=_cache(location)), pytest.raises(LockBackendUnavailable):
        asyncio.run(distlock("pw-async").aacquire())


def test_backend_down_is_lock_backend_unavailable(dead_redis_url):
    with override_settings(
        CACHES=_cache(dead_redis_url, SOCKET_CONNECT_TIMEOUT=1, SOCKET_TIMEOUT=1)
    ):
        with pytest.raises(LockBackendUnavailable) as info:
            distlock("down").acquire()
        assert info.value.name == "down"

        async def use_async() -> None:
            async with distlock("down"):
                pass

        with pytest.raises(LockBackendUnavailable):
            asyncio.run(use_async())


def test_busy_lock_raises_lock_not_acquired_with_retry_after(redis_client):
    with distlock("busy", timeout=10):
        with pytest.raises(LockNotAcquired) as info, distlock("busy", blocking=False):
            pass
        assert info.value.name == "busy"
        assert 9 < info.value.retry_after <= 10


@pytest.mark.parametrize(
    ("caches", "distlock_setting", "message"),
    [
        (None, {"CACHE": "missing"}, "no such alias"),
        (
            {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
            {},
            "not a django-redis cache",
        ),
    ],
)
def test_misconfigured_cache_is_reported_clearly(caches, distlock_setting, message):
    overrides: dict[str, object] = {"DISTLOCK": distlock_setting}
    if caches is not None:
        overrides["CACHES"] = caches
    with override_settings(**overrides), pytest.raises(ImproperlyConfigured, match=message):
        distlock("x").acquire()


def test_bad_arguments_fail_before_settings_are_read():
    with override_settings(DISTLOCK={"EVENTS": "bogus"}):
        with pytest.raises(TypeError, match="name must be a str"):
            distlock(42)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="timeout must be positive"):
            distlock("x", timeout=-1)
