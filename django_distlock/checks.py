"""System checks (``manage.py check``) for the ``DISTLOCK`` setting and its Redis.

======================  ==============================================================
``django_distlock.E001``  a ``DISTLOCK`` key has a bad type or value (one error per key)
``django_distlock.E002``  ``DISTLOCK["CACHE"]`` names no alias of ``CACHES``
``django_distlock.E003``  that cache is not a django-redis cache
``django_distlock.E004``  ``DISTLOCK["VIEW_ON_BUSY"]`` does not import, is not callable,
                          or does not take ``(request, name, retry_after)``
``django_distlock.E005``  ``DISTLOCK["VIEW_ON_UNAVAILABLE"]`` does not import, is not
                          callable, or does not take ``(request, name)``
``django_distlock.W001``  Redis does not answer ``PING`` (``check --deploy`` only)
``django_distlock.W002``  the lock server's ``maxmemory-policy`` is not ``noeviction``, so
                          it can evict held locks (``check --deploy`` only; nothing is
                          said when the policy cannot be read)
======================  ==============================================================
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from redis.backoff import NoBackoff
from redis.retry import Retry

from .connections import CacheError, lock_cache, redis_options
from .engine.eviction import SAFE_EVICTION_POLICY, unsafe_eviction_policy
from .settings import DEFAULTS, EVENT_MODES, Config, _build, configured_hook, get_config

__all__ = [
    "PING_TIMEOUT",
    "TAG",
    "check_eviction_policy",
    "check_redis_answers",
    "check_settings",
    "register_checks",
]

TAG = "distlock"
"""Run only these checks with ``manage.py check --tag distlock``."""

PING_TIMEOUT = 2.0
"""Seconds the deploy checks wait for Redis to connect and to answer."""

_HINTS = {
    "CACHE": "Set DISTLOCK['CACHE'] to the alias of a django-redis cache in CACHES, "
    "e.g. 'default'.",
    "URL": "Set DISTLOCK['URL'] to a redis:// URL, or remove it to use DISTLOCK['CACHE'].",
    "KEY_PREFIX": "Use a non-empty str without '{', '}' or NUL, e.g. 'distlock:'.",
    "TIMEOUT": "Use a positive number of seconds, at most one year (MAX_SECONDS), e.g. 30.",
    "AUTO_RENEW": "Use True or False.",
    "EVENTS": f"Use one of {', '.join(map(repr, EVENT_MODES))} ('async' is the default).",
    "EVENT_RETENTION": "Use a positive number of seconds, at most 100 years, "
    "e.g. 30 * 24 * 3600 for 30 days.",
    "VIEW_ON_BUSY": "Use the dotted path of a callable on_busy(request, name, retry_after) "
    "that returns a response, or None for the default 423 response.",
    "VIEW_ON_UNAVAILABLE": "Use the dotted path of a callable on_unavailable(request, name) "
    "that returns a response, or None for the default 503 response.",
    "VIEW_FAIL_OPEN": "Use True or False.",
}


def _settings_errors(raw: Any) -> list[CheckMessage]:
    """Every problem of the raw ``DISTLOCK`` value, one error per key."""
    if not isinstance(raw, dict):
        return [
            Error(
                f"DISTLOCK must be a dict, not {type(raw).__name__}",
                hint="Set DISTLOCK to a dict, e.g. DISTLOCK = {'CACHE': 'default'}, "
                "or remove it to use the defaults.",
                id="django_distlock.E001",
            )
        ]
    errors: list[CheckMessage] = []
    for key in sorted(set(raw) - set(DEFAULTS), key=str):
        close = difflib.get_close_matches(str(key), list(DEFAULTS), n=1)
        errors.append(
            Error(
                f"DISTLOCK has an unknown key {key!r}",
                hint=f"Did you mean {close[0]!r}?"
                if close
                else f"Remove it; the known keys are {', '.join(sorted(DEFAULTS))}.",
                id="django_distlock.E001",
            )
        )
    for key in DEFAULTS:
        if key not in raw:
            continue
        try:
            _build({key: raw[key]})
        except ImproperlyConfigured as exc:
            errors.append(Error(str(exc), hint=_HINTS[key], id="django_distlock.E001"))
    return errors


def _cache_errors(config: Config) -> list[CheckMessage]:
    try:
        lock_cache(config)
    except CacheError as exc:
        return [Error(str(exc), hint=exc.hint, id=exc.check_id)]
    return []


# Each settings hook: its DISTLOCK key and check id.
_HOOK_CHECKS = (
    ("VIEW_ON_BUSY", "django_distlock.E004"),
    ("VIEW_ON_UNAVAILABLE", "django_distlock.E005"),
)


def _hook_errors() -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    for key, check_id in _HOOK_CHECKS:
        try:
            configured_hook(key)
        except ImproperlyConfigured as exc:
            errors.append(Error(str(exc), hint=_HINTS[key], id=check_id))
    return errors


def check_settings(app_configs: Sequence[AppConfig] | None, **kwargs: Any) -> list[CheckMessage]:
    """E001-E005: the ``DISTLOCK`` setting, the cache it names and the view hooks."""
    errors = _settings_errors(getattr(settings, "DISTLOCK", {}))
    if errors:
        return errors
    try:
        config = get_config()
    except ImproperlyConfigured as exc:  # a problem no single key shows
        return [
            Error(
                str(exc),
                hint="Fix the DISTLOCK setting; see DEFAULTS in django_distlock.settings.",
                id="django_distlock.E001",
            )
        ]
    return _cache_errors(config) + _hook_errors()


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + netloc))


def _deploy_client(config: Config) -> tuple[str, redis.Redis | None, list[CheckMessage]]:
    """The Redis URL of ``config`` and a client for the deploy checks (short timeouts, no
    retries), or ``None`` and the W001 warning saying why there is none."""
    try:
        url, options = redis_options(config)
    except ImproperlyConfigured as exc:
        if _cache_errors(config):
            return "", None, []  # check_settings reports it
        warning = Warning(
            f"django-distlock has no usable Redis URL: {exc}",
            hint="Set the LOCATION of the cache DISTLOCK['CACHE'] names to a redis:// "
            "URL, or set DISTLOCK['URL'].",
            id="django_distlock.W001",
        )
        return "", None, [warning]
    options.update(
        socket_timeout=PING_TIMEOUT,
        socket_connect_timeout=PING_TIMEOUT,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        return url, redis.Redis.from_url(url, **options), []
    except ValueError as exc:
        warning = Warning(
            f"Redis URL {_redacted(url)!r} of django-distlock is not usable: {exc}",
            hint="Use a redis://, rediss:// or unix:// URL in DISTLOCK['URL'] or in "
            "the LOCATION of the cache DISTLOCK['CACHE'] names.",
            id="django_distlock.W001",
        )
        return url, None, [warning]


def check_redis_answers(
    app_configs: Sequence[AppConfig] | None, **kwargs: Any
) -> list[CheckMessage]:
    """W001 (``check --deploy``): the configured Redis answers ``PING`` within
    :data:`PING_TIMEOUT` seconds. Skipped while the setting itself is invalid."""
    try:
        config = get_config()
    except ImproperlyConfigured:
        return []  # check_settings reports it
    url, client, problems = _deploy_client(config)
    if client is None:
        return problems
    try:
        client.ping()
    except (redis.RedisError, OSError) as exc:
        return [
            Warning(
                f"Redis at {_redacted(url)!r} does not answer PING within "
                f"{PING_TIMEOUT:g} s: {type(exc).__name__}: {exc}",
                hint="Start that Redis server or point DISTLOCK['URL'] (or the cache "
                "DISTLOCK['CACHE'] names) at a running one. Until it answers, guarded "
                "views answer 503 and locks raise LockBackendUnavailable.",
                id="django_distlock.W001",
            )
        ]
    finally:
        client.close()
    return []


def check_eviction_policy(
    app_configs: Sequence[AppConfig] | None, **kwargs: Any
) -> list[CheckMessage]:
    """W002 (``check --deploy``): the lock server's ``maxmemory-policy`` is
    ``noeviction``. Any other policy lets Redis evict a held lock (``volatile-*`` too:
    lock keys have a TTL), and another process then takes it while its holder still runs.
    Says nothing when the policy cannot be read (W001 reports a Redis that does not
    answer)."""
    try:
        config = get_config()
    except ImproperlyConfigured:
        return []  # check_settings reports it
    url, client, _ = _deploy_client(config)
    if client is None:
        return []  # check_redis_answers reports it
    try:
        policy = unsafe_eviction_policy(client.execute_command)
    finally:
        client.close()
    if policy is None:
        return []
    return [
        Warning(
            f"Redis at {_redacted(url)!r} evicts keys when it is full (maxmemory-policy "
            f"{policy}): a held lock can vanish, and another process take it while its "
            "holder still runs",
            hint="Point DISTLOCK['URL'] at a Redis configured with maxmemory-policy "
            f"{SAFE_EVICTION_POLICY} (a server for locks, apart from the cache's), or set "
            f"maxmemory-policy {SAFE_EVICTION_POLICY} on this one if nothing on it relies "
            "on eviction.",
            id="django_distlock.W002",
        )
    ]


def register_checks() -> None:
    """Register the checks (``AppConfig.ready()`` calls this once)."""
    register(check_settings, TAG, Tags.caches)
    register(check_redis_answers, TAG, Tags.caches, deploy=True)
    register(check_eviction_policy, TAG, Tags.caches, deploy=True)
