"""The topology settings (``SENTINELS``, ``SENTINEL_SERVICE``, ``SENTINEL_KWARGS``,
``CLUSTER``, ``MIN_REPLICAS``, ``REPLICA_TIMEOUT``): their defaults, and each bad value or
combination refused by ``get_config()`` and reported as E001. What
:func:`lock_servers` reads from them is in ``tests/test_connections.py``."""

from __future__ import annotations

import pytest
from django.core.checks import Error, run_checks
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_distlock.settings import DEFAULTS, WHERE_KEYS, get_config

SENTINELS = [("10.0.0.1", 26379), ("10.0.0.2", 26379)]
SEEDS = ["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"]


def e001(distlock: dict) -> list:
    with override_settings(DISTLOCK=distlock):
        errors = run_checks(tags=["distlock"])
    assert errors, f"no error for {distlock}"
    assert all(isinstance(error, Error) for error in errors)
    assert {error.id for error in errors} == {"django_distlock.E001"}
    return errors


def test_defaults():
    assert DEFAULTS["SENTINELS"] is None
    assert DEFAULTS["CLUSTER"] is None
    assert DEFAULTS["MIN_REPLICAS"] == "auto"
    assert DEFAULTS["REPLICA_TIMEOUT"] == 0.1
    with override_settings(DISTLOCK={}):
        config = get_config()
    assert (config.sentinels, config.sentinel_service, config.cluster) == (None, None, None)
    assert (config.min_replicas, config.replica_timeout) == ("auto", 0.1)


@pytest.mark.parametrize("value", ["auto", 0, 1, 64])
def test_min_replicas_takes_auto_or_a_count(value):
    with override_settings(DISTLOCK={"MIN_REPLICAS": value}):
        assert get_config().min_replicas == value
        assert run_checks(tags=["distlock"]) == []


# -- validation: one key at a time -----------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message", "hint"),
    [
        ({"SENTINELS": []}, "non-empty list of (host, port) pairs", "[('10.0.0.1', 26379)"),
        ({"SENTINELS": "10.0.0.1:26379"}, "non-empty list of (host, port)", "SENTINEL_SERVICE"),
        ({"SENTINELS": [("10.0.0.1",)]}, "got ('10.0.0.1',)", "(host, port)"),
        ({"SENTINELS": [("10.0.0.1", "26379")]}, "got the port '26379'", "(host, port)"),
        ({"SENTINELS": [("10.0.0.1", 70000)]}, "got the port 70000", "(host, port)"),
        ({"SENTINELS": [("", 26379)]}, "got the host ''", "(host, port)"),
        ({"SENTINEL_SERVICE": ""}, "SENTINEL_SERVICE'] must be a non-empty str", "'mymaster'"),
        ({"SENTINEL_SERVICE": "http://x/0"}, "must be a redis:// or rediss://", "mymaster"),
        ({"SENTINEL_KWARGS": "pw"}, "must be a dict of connection options", "{'password'"),
        ({"CLUSTER": "redis://10.0.0.1:7000"}, "non-empty list of seed node URLs", "seed node"),
        ({"CLUSTER": []}, "non-empty list of seed node URLs", "seed node"),
        ({"CLUSTER": ["10.0.0.1:7000"]}, "must be a redis:// or rediss://", "seed node"),
        ({"CLUSTER": ["unix:///tmp/redis.sock"]}, "must be a redis://", "seed node"),
        ({"CLUSTER": ["redis://"]}, "names no host", "seed node"),
        ({"MIN_REPLICAS": -1}, "MIN_REPLICAS must be between 0 and 64, not -1", "'auto'"),
        ({"MIN_REPLICAS": 1.5}, "MIN_REPLICAS must be 'auto' or an int, not float", "from 0"),
        ({"MIN_REPLICAS": True}, "MIN_REPLICAS must be 'auto' or an int, not bool", "from 0"),
        ({"MIN_REPLICAS": None}, "MIN_REPLICAS must be 'auto' or an int, not NoneType", "'auto'"),
        ({"MIN_REPLICAS": 65}, "MIN_REPLICAS must be between 0 and 64", "from 0"),
        ({"MIN_REPLICAS": "AUTO"}, "MIN_REPLICAS must be 'auto' or an int from 0 to 64", "'auto'"),
        ({"MIN_REPLICAS": "1"}, "MIN_REPLICAS must be 'auto' or an int from 0 to 64, not '1'", "0"),
        ({"REPLICA_TIMEOUT": 0}, "REPLICA_TIMEOUT must be positive", "e.g. 0.1"),
        ({"REPLICA_TIMEOUT": "0.1"}, "REPLICA_TIMEOUT must be a number", "e.g. 0.1"),
    ],
)
def test_bad_values_are_e001_with_a_hint(value, message, hint):
    with override_settings(DISTLOCK=value), pytest.raises(ImproperlyConfigured, match="DISTLOCK"):
        get_config()
    [key] = value
    [error] = [error for error in e001(value) if key in error.msg]
    assert message in error.msg
    assert hint in error.hint


# -- validation: keys that go together ---------------------------------------------------


@pytest.mark.parametrize(
    "where",
    [
        {"URL": "redis://10.0.0.1:6379/0", "CLUSTER": SEEDS},
        {"URL": "redis://10.0.0.1:6379/0", "SENTINELS": SENTINELS, "SENTINEL_SERVICE": "m"},
        {"CLUSTER": SEEDS, "SENTINELS": SENTINELS, "SENTINEL_SERVICE": "m"},
    ],
)
def test_at_most_one_place_says_where_locks_live(where):
    with override_settings(DISTLOCK=where), pytest.raises(ImproperlyConfigured) as raised:
        get_config()
    named = [key for key in WHERE_KEYS if key in where]
    assert f"DISTLOCK sets {' and '.join(named)}" in str(raised.value)
    assert "at most one of URL, SENTINELS, CLUSTER" in str(raised.value)
    [error] = e001(where)
    assert error.msg == str(raised.value)
    assert "URL for one server" in error.hint
    assert "CLUSTER for a Redis Cluster" in error.hint


def test_sentinels_need_a_service():
    [error] = e001({"SENTINELS": SENTINELS})
    assert error.msg == "DISTLOCK['SENTINELS'] is set, but DISTLOCK['SENTINEL_SERVICE'] is not"
    assert "e.g. 'mymaster'" in error.hint


@pytest.mark.parametrize(
    ("key", "value"), [("SENTINEL_SERVICE", "mymaster"), ("SENTINEL_KWARGS", {"password": "x"})]
)
def test_sentinel_settings_without_sentinels(key, value):
    [error] = e001({key: value})
    assert error.msg == f"DISTLOCK[{key!r}] is set, but DISTLOCK['SENTINELS'] is not"
    assert "SentinelClient takes its Sentinel settings from its own OPTIONS" in error.hint
