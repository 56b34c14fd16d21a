"""System checks: ``manage.py check`` reports each misconfiguration with its id and hint."""

from __future__ import annotations

import contextlib

import pytest
import redis
from django.core.cache import cache
from django.core.checks import Error, Warning, registry, run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_distlock import LockLost, distlock
from django_distlock.checks import check_eviction_policy, check_redis_answers, check_settings
from tests.support import REPO_ROOT
from tests.support.engine import lock_key

LOCMEM = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}


def distlock_messages(*, deploy: bool = False) -> list:
    """The problems ``check --tag distlock`` reports (not the I001 topology info, see
    tests/checks/test_servers.py)."""
    messages = run_checks(tags=["distlock"], include_deployment_checks=deploy)
    return [message for message in messages if message.id != "django_distlock.I001"]


def ids(messages) -> list[str]:
    return [message.id for message in messages]


def test_check_command_passes_for_the_test_settings(redis_server):
    call_command("check")
    call_command("check", "--tag", "distlock", fail_level="WARNING")
    assert distlock_messages() == []
    assert distlock_messages(deploy=True) == []


def test_checks_are_registered_with_tags_and_deploy_only_ping():
    normal = registry.registry.get_checks(include_deployment_checks=False)
    everything = registry.registry.get_checks(include_deployment_checks=True)
    assert check_settings in normal
    assert check_redis_answers not in normal
    assert check_redis_answers in everything
    assert check_eviction_policy not in normal
    assert check_eviction_policy in everything
    assert "distlock" in check_settings.tags
    assert "distlock" in check_redis_answers.tags
    assert "distlock" in check_eviction_policy.tags


# -- E001 --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message", "hint"),
    [
        ([], "DISTLOCK must be a dict, not list", "Set DISTLOCK to a dict"),
        ({"TIMEOUTS": 3}, "unknown key 'TIMEOUTS'", "Did you mean 'TIMEOUT'?"),
        ({"ZZZ": 3}, "unknown key 'ZZZ'", "the known keys are AUTO_RENEW, CACHE"),
        ({"CACHE": ""}, "DISTLOCK['CACHE'] must be a non-empty str", "alias of a django-redis"),
        ({"URL": 5}, "DISTLOCK['URL'] must be a non-empty str or None", "redis:// URL"),
        ({"KEY_PREFIX": ""}, "prefix must not be empty", "non-empty str without"),
        ({"KEY_PREFIX": "a{b}"}, "prefix must not contain", "non-empty str without"),
        ({"TIMEOUT": 0}, "TIMEOUT must be positive", "positive number of seconds"),
        ({"TIMEOUT": "30"}, "TIMEOUT must be a number", "positive number of seconds"),
        ({"TIMEOUT": 1e16}, "TIMEOUT must be at most 31536000 seconds", "at most one year"),
        ({"AUTO_RENEW": "yes"}, "DISTLOCK['AUTO_RENEW'] must be True or False", "True or False"),
        ({"EVENTS": "later"}, "DISTLOCK['EVENTS'] must be one of", "'async', 'sync', 'off'"),
        ({"EVENT_RETENTION": -1}, "EVENT_RETENTION must be positive", "30 days"),
        ({"EVENT_RETENTION": 1e16}, "EVENT_RETENTION must be at most", "at most 100 years"),
        ({"VIEW_ON_BUSY": 3}, "VIEW_ON_BUSY'] must be a non-empty str", "dotted path"),
        ({"VIEW_FAIL_OPEN": 1}, "VIEW_FAIL_OPEN'] must be True or False", "True or False"),
    ],
)
def test_e001_invalid_setting(value, message, hint):
    with override_settings(DISTLOCK=value):
        [error] = distlock_messages()
    assert isinstance(error, Error)
    assert error.id == "django_distlock.E001"
    assert message in error.msg
    assert hint in error.hint


def test_e001_reports_every_problem_at_once():
    bad = {"TIMEOUT": 0, "EVENTS": "later", "TIMEOUTS": 1, "CACHE": "default"}
    with override_settings(DISTLOCK=bad):
        errors = distlock_messages()
    assert ids(errors) == ["django_distlock.E001"] * 3
    text = " | ".join(error.msg for error in errors)
    assert "TIMEOUTS" in text
    assert "TIMEOUT must be positive" in text
    assert "EVENTS" in text


def test_e001_is_an_error_for_the_check_command():
    with (
        override_settings(DISTLOCK={"EVENTS": "later"}),
        pytest.raises(SystemCheckError, match=r"django_distlock\.E001"),
    ):
        call_command("check")


# -- E002, E003 --------------------------------------------------------------------------


def test_e002_cache_alias_missing():
    with override_settings(DISTLOCK={"CACHE": "locks"}):
        [error] = distlock_messages()
    assert error.id == "django_distlock.E002"
    assert "DISTLOCK['CACHE'] is 'locks', but CACHES has no such alias" in error.msg
    assert "aliases: 'default'" in error.msg
    assert "DISTLOCK['URL']" in error.hint


def test_e003_cache_is_not_django_redis():
    with override_settings(CACHES=LOCMEM):
        [error] = distlock_messages()
    assert error.id == "django_distlock.E003"
    assert "CACHES['default'] uses 'django.core.cache.backends.locmem.LocMemCache'" in error.msg
    assert "django_redis.cache.RedisCache" in error.hint
    assert "DISTLOCK['URL']" in error.hint


def test_e003_for_djangos_built_in_redis_cache_is_documented_with_its_fix(redis_server):
    """Django's own ``RedisCache`` is the cache people reach for first: E003 says it is
    not usable, docs/settings.md says so and how to keep it (``URL`` = its ``LOCATION``),
    and that fix passes the checks."""
    built_in = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": redis_server.url,
        }
    }
    with override_settings(CACHES=built_in):
        [error] = distlock_messages()
    assert error.id == "django_distlock.E003"
    assert "'django.core.cache.backends.redis.RedisCache'" in error.msg
    with override_settings(CACHES=built_in, DISTLOCK={"URL": redis_server.url}):
        assert distlock_messages(deploy=True) == []
    docs = " ".join((REPO_ROOT / "docs" / "settings.md").read_text().split())
    assert "`django_distlock.E003`" in docs
    assert "`django.core.cache.backends.redis.RedisCache`" in docs


def test_url_setting_needs_no_django_redis_cache(redis_server):
    with override_settings(CACHES=LOCMEM, DISTLOCK={"URL": redis_server.url, "CACHE": "gone"}):
        assert distlock_messages(deploy=True) == []


def test_another_django_redis_alias_is_fine(redis_server):
    caches = {
        "default": LOCMEM["default"],
        "locks": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_server.url},
    }
    with override_settings(CACHES=caches, DISTLOCK={"CACHE": "locks"}):
        assert distlock_messages(deploy=True) == []


# -- E004 --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("tests.support.view_urls.nowhere", "which cannot be imported"),
        ("no_such_module_distlock.on_busy", "which cannot be imported"),
        ("tests.support.view_urls.not_callable_on_busy", "which is a str, not a callable"),
        (
            "tests.support.view_urls.held_locks",
            "cannot be called as on_busy(request, name, retry_after)",
        ),
    ],
)
def test_e004_view_on_busy_unusable(path, message):
    with override_settings(DISTLOCK={"VIEW_ON_BUSY": path}):
        [error] = distlock_messages()
    assert error.id == "django_distlock.E004"
    assert f"DISTLOCK['VIEW_ON_BUSY'] is {path!r}" in error.msg
    assert message in error.msg
    assert "on_busy(request, name, retry_after)" in error.hint


@pytest.mark.parametrize(
    "path", ["tests.support.view_urls.settings_on_busy", "tests.support.view_urls.async_on_busy"]
)
def test_usable_view_on_busy_passes(path):
    with override_settings(DISTLOCK={"VIEW_ON_BUSY": path}):
        assert distlock_messages() == []


# -- E005 --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("tests.support.view_urls.nowhere", "which cannot be imported"),
        ("tests.support.view_urls.not_callable_on_busy", "which is a str, not a callable"),
        (
            "tests.support.view_urls.settings_on_busy",
            "cannot be called as on_unavailable(request, name)",
        ),
    ],
)
def test_e005_view_on_unavailable_unusable(path, message):
    with override_settings(DISTLOCK={"VIEW_ON_UNAVAILABLE": path}):
        [error] = distlock_messages()
    assert error.id == "django_distlock.E005"
    assert f"DISTLOCK['VIEW_ON_UNAVAILABLE'] is {path!r}" in error.msg
    assert message in error.msg


def test_usable_view_on_unavailable_passes():
    with override_settings(DISTLOCK={"VIEW_ON_UNAVAILABLE": "tests.support.view_urls.maintenance"}):
        assert distlock_messages() == []


# -- W001 --------------------------------------------------------------------------------


def test_w001_only_with_deploy_and_a_dead_server(private_redis):
    url = private_redis.url
    with override_settings(DISTLOCK={"URL": url}):
        assert distlock_messages(deploy=True) == []  # alive
        private_redis.stop()
        assert distlock_messages(deploy=False) == []
        [warning] = distlock_messages(deploy=True)
    assert isinstance(warning, Warning)
    assert warning.id == "django_distlock.W001"
    assert f"Redis at {url!r} does not answer PING" in warning.msg
    assert "ConnectionError" in warning.msg
    assert "503" in warning.hint


def test_w001_through_the_check_command(private_redis):
    with override_settings(DISTLOCK={"URL": private_redis.url}):
        private_redis.stop()
        call_command("check", "--tag", "distlock", fail_level="WARNING")  # not deploy: quiet
        with pytest.raises(SystemCheckError, match=r"django_distlock\.W001"):
            call_command("check", "--deploy", "--tag", "distlock", fail_level="WARNING")


def test_w001_for_the_cache_location_hides_the_password(redis_server_factory):
    server = redis_server_factory(password="s3cret-pw")
    caches = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": server.url,
        }
    }
    with override_settings(CACHES=caches):
        assert distlock_messages(deploy=True) == []
        server.stop()
        [warning] = distlock_messages(deploy=True)
    assert warning.id == "django_distlock.W001"
    assert "s3cret-pw" not in warning.msg
    assert ":***@127.0.0.1" in warning.msg


def test_w001_wrong_password_is_reported(redis_server_factory):
    server = redis_server_factory(password="right")
    wrong = server.url.replace(":right@", ":wrong@")
    with override_settings(DISTLOCK={"URL": wrong}):
        [warning] = distlock_messages(deploy=True)
    assert warning.id == "django_distlock.W001"
    assert "wrong" not in warning.msg


def test_w001_unusable_url_is_reported():
    with override_settings(DISTLOCK={"URL": "localhost:6379"}):
        [warning] = distlock_messages(deploy=True)
    assert warning.id == "django_distlock.W001"
    assert "not usable" in warning.msg


def test_w001_is_skipped_while_the_setting_is_invalid():
    with override_settings(CACHES=LOCMEM):
        assert ids(distlock_messages(deploy=True)) == ["django_distlock.E003"]


# -- W002 --------------------------------------------------------------------------------

EVICTING = ["--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru"]


def test_an_evicting_cache_server_drops_a_held_lock_and_w002_says_so(redis_server_factory):
    # The default: locks on the cache's Redis, which a cache usually runs with an LRU
    # policy. Cache writes evict the lock key and a second owner takes the lock while the
    # first still believes it holds it.
    server = redis_server_factory(EVICTING)
    caches = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": server.url}}
    client = server.client()
    with override_settings(CACHES=caches, DISTLOCK={"EVENTS": "off"}):
        first = distlock("invoice:42", timeout=60, auto_renew=False)
        assert first.acquire()
        page = b"x" * 10_000
        for batch in range(400):  # at most 40 MB: 20 times maxmemory
            if not client.exists(lock_key("invoice:42")):
                break
            cache.set_many({f"page:{batch}:{number}": page for number in range(10)})
        assert not client.exists(lock_key("invoice:42"))
        second = distlock("invoice:42", blocking=False)
        assert second.acquire()
        assert (first.held, second.held) == (True, True)  # two owners at once
        # The server is still at maxmemory: the release's own eviction may take the second
        # lock too (keys written in the same second tie in LRU age). Either way it ends.
        with contextlib.suppress(LockLost):
            second.release()
        assert not second.held
        [warning] = distlock_messages(deploy=True)
        assert distlock_messages(deploy=False) == []
    client.close()
    assert isinstance(warning, Warning)
    assert warning.id == "django_distlock.W002"
    assert f"Redis at {server.url!r}" in warning.msg
    assert "maxmemory-policy allkeys-lru" in warning.msg
    assert "DISTLOCK['URL']" in warning.hint
    assert "maxmemory-policy noeviction" in warning.hint


@pytest.mark.parametrize("policy", ["volatile-lru", "volatile-ttl", "allkeys-random"])
def test_w002_for_every_policy_but_noeviction(private_redis, policy):
    client = private_redis.client()
    with override_settings(DISTLOCK={"URL": private_redis.url}):
        assert distlock_messages(deploy=True) == []  # noeviction, the server's default
        client.config_set("maxmemory-policy", policy)
        [warning] = distlock_messages(deploy=True)
    client.close()
    assert warning.id == "django_distlock.W002"
    assert f"maxmemory-policy {policy}" in warning.msg


def _user_url(server, username: str, *commands: str) -> str:
    """A URL of ``server`` for a new ACL user allowed everything but ``commands``."""
    client = server.client()
    client.acl_setuser(
        username,
        enabled=True,
        passwords=["+pw"],
        keys=["*"],
        commands=["+@all", *(f"-{command}" for command in commands)],
    )
    client.close()
    return server.url.replace("redis://", f"redis://{username}:pw@", 1)


def test_w002_reads_info_where_config_is_not_allowed(private_redis):
    url = _user_url(private_redis, "app", "config")
    with redis.Redis.from_url(url) as client, pytest.raises(redis.exceptions.NoPermissionError):
        client.config_get("maxmemory-policy")
    private_redis.client().config_set("maxmemory-policy", "allkeys-lru")
    with override_settings(DISTLOCK={"URL": url}):
        [warning] = distlock_messages(deploy=True)
    assert warning.id == "django_distlock.W002"
    assert "maxmemory-policy allkeys-lru" in warning.msg
    assert ":pw@" not in warning.msg


def test_w002_says_nothing_when_the_policy_cannot_be_read(private_redis):
    url = _user_url(private_redis, "app", "config", "info")
    private_redis.client().config_set("maxmemory-policy", "allkeys-lru")
    with override_settings(DISTLOCK={"URL": url}):
        assert distlock_messages(deploy=True) == []


def test_w002_says_nothing_when_redis_is_down(private_redis):
    with override_settings(DISTLOCK={"URL": private_redis.url}):
        private_redis.stop()
        assert ids(distlock_messages(deploy=True)) == ["django_distlock.W001"]
