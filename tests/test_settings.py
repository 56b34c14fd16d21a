"""The ``DISTLOCK`` setting and its accessor."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_distlock.settings import DEFAULTS, get_config


def test_defaults_when_unset():
    with override_settings(DISTLOCK={}):
        config = get_config()
    assert config.cache == "default"
    assert config.url is None
    assert config.key_prefix == "distlock:"
    assert config.timeout == 30.0
    assert config.auto_renew is True
    assert config.events == "async"
    assert config.view_fail_open is False


def test_every_key_is_documented_next_to_its_default():
    import inspect

    import django_distlock.settings as module

    source = inspect.getsource(module)
    for key in DEFAULTS:
        assert f"``{key}``:" in source, key


def test_follows_override_settings():
    with override_settings(DISTLOCK={"TIMEOUT": 7, "KEY_PREFIX": "app:"}):
        assert get_config().timeout == 7.0
        assert get_config().key_prefix == "app:"
    assert get_config().timeout == 30.0


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([], "DISTLOCK must be a dict"),
        ({"TIMEOUTS": 3}, "unknown keys"),
        ({"CACHE": ""}, "CACHE"),
        ({"CACHE": 3}, "CACHE"),
        ({"URL": ""}, "URL"),
        ({"KEY_PREFIX": ""}, "prefix must not be empty"),
        ({"KEY_PREFIX": "a{b}"}, "prefix must not contain"),
        ({"KEY_PREFIX": 5}, "prefix must be a str"),
        ({"TIMEOUT": 0}, "TIMEOUT must be positive"),
        ({"TIMEOUT": float("nan")}, "TIMEOUT must be finite"),
        ({"TIMEOUT": "30"}, "TIMEOUT must be a number"),
        ({"TIMEOUT": True}, "TIMEOUT must be a number"),
        ({"TIMEOUT": 1e16}, "TIMEOUT must be at most 31536000 seconds"),
        ({"TIMEOUT": 10**400}, "TIMEOUT must be at most 31536000 seconds"),
        ({"AUTO_RENEW": "yes"}, "AUTO_RENEW"),
        ({"EVENTS": "later"}, "EVENTS"),
        ({"EVENT_RETENTION": -1}, "EVENT_RETENTION must be positive"),
        ({"EVENT_RETENTION": 1e16}, "EVENT_RETENTION must be at most"),
        ({"VIEW_FAIL_OPEN": 1}, "VIEW_FAIL_OPEN"),
    ],
)
def test_bad_values_are_improperly_configured(value, message):
    with override_settings(DISTLOCK=value), pytest.raises(ImproperlyConfigured, match=message):
        get_config()


def test_event_retention_may_be_longer_than_a_lock_duration():
    # MAX_SECONDS bounds leases and waits; keeping events for years is a fair wish.
    with override_settings(DISTLOCK={"EVENT_RETENTION": 5 * 365 * 24 * 3600}):
        assert get_config().event_retention == 5 * 365 * 24 * 3600
