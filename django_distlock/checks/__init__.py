"""System checks (``manage.py check``) for the ``DISTLOCK`` setting and its Redis.

======================  ==============================================================
``django_distlock.E001``  a ``DISTLOCK`` key has a bad type or value (one error per key),
                          or keys that do not go together (more than one of ``URL``,
                          ``SENTINELS``, ``CLUSTER``; ``SENTINELS`` without
                          ``SENTINEL_SERVICE``)
``django_distlock.E002``  ``DISTLOCK["CACHE"]`` names no alias of ``CACHES``
``django_distlock.E003``  that cache is neither a django-redis nor a django-valkey cache
``django_distlock.E004``  ``DISTLOCK["VIEW_ON_BUSY"]`` does not import, is not callable,
                          or does not take ``(request, name, retry_after)``
``django_distlock.E005``  ``DISTLOCK["VIEW_ON_UNAVAILABLE"]`` does not import, is not
                          callable, or does not take ``(request, name)``
``django_distlock.E006``  ``DISTLOCK["METRICS"]`` enables a backend whose library is not
                          installed (``prometheus_client``, ``opentelemetry-api``)
``django_distlock.E007``  a Celery task asks for ``unique_while_queued`` but its class is
                          not ``LockedTask`` (only where Celery is loaded; a worker also
                          refuses to start with one)
``django_distlock.I001``  where locks live: one server, a Sentinel service, or a Cluster,
                          and which setting says so (``check --deploy`` only)
``django_distlock.W001``  a lock server does not answer ``PING``: the server, the primary
                          the Sentinels name (or no Sentinel names one), or any primary of
                          the Cluster (``check --deploy`` only)
``django_distlock.W002``  a lock server's ``maxmemory-policy`` is not ``noeviction``, so
                          it can evict held locks; every primary is asked (``check
                          --deploy`` only; nothing is said when the policy cannot be read)
======================  ==============================================================

Why this module is long: it is the one place that says what ``manage.py check`` can
report, each id with its message and hint; the deploy checks ask every lock server of a
topology (one server, a Sentinel's primary, each Cluster primary), a function each.
"""

from __future__ import annotations

import difflib
import importlib
import sys
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.sentinel
from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Info, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..connections import (
    CLUSTER,
    SENTINEL,
    SERVER,
    CacheError,
    LockServers,
    lock_cache,
    lock_servers,
    redacted,
)
from ..engine import SAFE_EVICTION_POLICY, unsafe_eviction_policy
from ..settings import (
    DEFAULTS,
    EVENT_MODES,
    Config,
    configured_hook,
    get_config,
    validate_setting,
)
from ..telemetry import BACKENDS, missing_library

__all__ = [
    "PING_TIMEOUT",
    "TAG",
    "check_eviction_policy",
    "check_lock_servers",
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
    "SENTINELS": "Use a list of the Sentinels' (host, port), e.g. [('10.0.0.1', 26379), "
    "('10.0.0.2', 26379)], with SENTINEL_SERVICE; or None.",
    "SENTINEL_SERVICE": "Use the name the Sentinels monitor the primary under, e.g. "
    "'mymaster', or a URL with that name as its host, e.g. 'redis://:password@mymaster/0'.",
    "SENTINEL_KWARGS": "Use a dict of connection options for the Sentinels themselves, "
    "e.g. {'password': '...'}, or None.",
    "CLUSTER": "Use a list of seed node URLs of the cluster, e.g. "
    "['redis://10.0.0.1:7000', 'redis://10.0.0.2:7000'], or None.",
    "MIN_REPLICAS": "Use an int from 0 (do not wait for replicas) to 64, e.g. 1.",
    "REPLICA_TIMEOUT": "Use a positive number of seconds, e.g. 0.1.",
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
    "METRICS": "Use 'prometheus', 'otel', a list of both, or None (no metrics, the default).",
    "METRICS_LABEL": "Use 'template' (the default), 'prefix' or 'none'.",
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
            validate_setting(key, raw[key])
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


def _metrics_errors(config: Config) -> list[CheckMessage]:
    missing = [BACKENDS[name] for name in config.metrics if missing_library(name)]
    return [Error(b.problem, hint=b.hint, id="django_distlock.E006") for b in missing]


def check_settings(app_configs: Sequence[AppConfig] | None, **kwargs: Any) -> list[CheckMessage]:
    """E001-E006: the ``DISTLOCK`` setting, the cache it names, the view hooks and the
    metrics backends' libraries."""
    errors = _settings_errors(getattr(settings, "DISTLOCK", {}))
    if errors:
        return errors
    try:
        config = get_config()
    except ImproperlyConfigured as exc:  # a problem no single key shows
        hint = getattr(exc, "hint", None)
        return [
            Error(
                str(exc),
                hint=hint or "Fix the DISTLOCK setting; see DEFAULTS in django_distlock.settings.",
                id="django_distlock.E001",
            )
        ]
    return _cache_errors(config) + _hook_errors() + _metrics_errors(config)


def _deploy_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Connection options for the deploy checks: short timeouts, no retries."""
    return {
        **options,
        "socket_timeout": PING_TIMEOUT,
        "socket_connect_timeout": PING_TIMEOUT,
        "retry": Retry(NoBackoff(), 0),
    }


def _with_address(url: str, host: str, port: int) -> str:
    """``url`` (credentials, TLS, options) pointed at ``host:port``."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{host}:{port}" if userinfo else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


Primary = tuple[str, redis.Redis]
"""A lock server to check: how messages name it, and a client for it."""


def _server_primaries(servers: LockServers) -> tuple[list[Primary], list[CheckMessage]]:
    url = str(servers.url)
    try:
        client = redis.Redis.from_url(url, **_deploy_options(servers.options))
    except ValueError as exc:
        warning = Warning(
            f"Redis URL {redacted(url)!r} of django-distlock is not usable: {exc}",
            hint="Use a redis://, rediss:// or unix:// URL in DISTLOCK['URL'] or in "
            "the LOCATION of the cache DISTLOCK['CACHE'] names.",
            id="django_distlock.W001",
        )
        return [], [warning]
    return [(f"Redis at {redacted(url)!r}", client)], []


def _sentinel_primaries(servers: LockServers) -> tuple[list[Primary], list[CheckMessage]]:
    sentinel = redis.sentinel.Sentinel(
        list(servers.sentinels), sentinel_kwargs=_deploy_options(servers.sentinel_options)
    )
    try:
        host, port = sentinel.discover_master(str(servers.service))
    except (redis.RedisError, OSError) as exc:
        addresses = ", ".join(f"{host}:{port}" for host, port in servers.sentinels)
        warning = Warning(
            f"No Sentinel ({addresses}) names a primary for service {servers.service!r} "
            f"within {PING_TIMEOUT:g} s: {type(exc).__name__}: {exc}",
            hint="Check that the Sentinels run, that they monitor the lock server under "
            "that service name (SENTINEL_SERVICE, or the host of the cache's LOCATION), and "
            "SENTINEL_KWARGS (their password). Until one answers, guarded views answer 503 "
            "and locks raise LockBackendUnavailable.",
            id="django_distlock.W001",
        )
        return [], [warning]
    finally:
        for client in sentinel.sentinels:
            client.close()
    client = redis.Redis(host=host, port=port, **_deploy_options(servers.options))
    label = f"Redis at '{host}:{port}' (the primary of Sentinel service {servers.service!r})"
    return [(label, client)], []


def _cluster_primaries(servers: LockServers) -> tuple[list[Primary], list[CheckMessage]]:
    errors = []
    for seed in servers.seeds:
        try:
            with redis.Redis.from_url(seed, **_deploy_options({})) as client:
                slots = client.execute_command("CLUSTER", "SLOTS")
        except (redis.RedisError, OSError, ValueError) as exc:
            errors.append(f"{redacted(seed)}: {type(exc).__name__}: {exc}")
            continue
        seed_host = urlsplit(seed).hostname or ""
        addresses = dict.fromkeys(
            (_text(entry[2][0]) or seed_host, int(entry[2][1])) for entry in slots
        )
        return [
            (
                f"Redis at '{host}:{port}' (a Redis Cluster primary)",
                redis.Redis.from_url(_with_address(seed, host, port), **_deploy_options({})),
            )
            for host, port in addresses
        ], []
    warning = Warning(
        f"No seed node of the Redis Cluster answers CLUSTER SLOTS within {PING_TIMEOUT:g} s: "
        + "; ".join(errors),
        hint="Check DISTLOCK['CLUSTER'] (or the LOCATION of the cluster cache "
        "DISTLOCK['CACHE'] names): seed node URLs of running cluster nodes.",
        id="django_distlock.W001",
    )
    return [], [warning]


_PRIMARIES = {SERVER: _server_primaries, SENTINEL: _sentinel_primaries, CLUSTER: _cluster_primaries}


def _deploy_primaries(config: Config) -> tuple[list[Primary], list[CheckMessage]]:
    """A client per lock server (short timeouts, no retries): the server, the primary the
    Sentinels name, or every primary of the Cluster; or the W001 warnings saying why
    there is none."""
    try:
        servers = lock_servers(config)
    except ImproperlyConfigured as exc:
        if _cache_errors(config):
            return [], []  # check_settings reports it
        warning = Warning(
            f"django-distlock has no usable Redis URL: {exc}",
            hint="Set the LOCATION of the cache DISTLOCK['CACHE'] names to a redis:// "
            "URL, or set DISTLOCK['URL'].",
            id="django_distlock.W001",
        )
        return [], [warning]
    return _PRIMARIES[servers.kind](servers)


def check_lock_servers(
    app_configs: Sequence[AppConfig] | None, **kwargs: Any
) -> list[CheckMessage]:
    """I001 (``check --deploy``): where locks live, and which setting says so. Skipped
    while the setting is invalid."""
    try:
        config = get_config()
        servers = lock_servers(config)
    except ImproperlyConfigured:
        return []  # check_settings or check_redis_answers reports it
    replicas = ""
    if config.min_replicas:
        replicas = (
            f"; an acquire counts once {config.min_replicas} replica(s) acknowledged it "
            f"within {config.replica_timeout:g} s (MIN_REPLICAS, REPLICA_TIMEOUT)"
        )
    return [
        Info(
            f"django-distlock keeps its locks on {servers.describe()}, "
            f"as {servers.origin} says{replicas}",
            id="django_distlock.I001",
        )
    ]


def check_redis_answers(
    app_configs: Sequence[AppConfig] | None, **kwargs: Any
) -> list[CheckMessage]:
    """W001 (``check --deploy``): every lock server (the server, the Sentinels' primary,
    each Cluster primary) answers ``PING`` within :data:`PING_TIMEOUT` seconds. Skipped
    while the setting itself is invalid."""
    try:
        config = get_config()
    except ImproperlyConfigured:
        return []  # check_settings reports it
    primaries, problems = _deploy_primaries(config)
    for label, client in primaries:
        try:
            client.ping()
        except (redis.RedisError, OSError) as exc:
            problems.append(
                Warning(
                    f"{label} does not answer PING within {PING_TIMEOUT:g} s: "
                    f"{type(exc).__name__}: {exc}",
                    hint="Start that Redis server or point DISTLOCK['URL'] (or the cache "
                    "DISTLOCK['CACHE'] names, or SENTINELS, or CLUSTER) at a running one. "
                    "Until it answers, guarded views answer 503 and locks raise "
                    "LockBackendUnavailable.",
                    id="django_distlock.W001",
                )
            )
        finally:
            client.close()
    return problems


def check_eviction_policy(
    app_configs: Sequence[AppConfig] | None, **kwargs: Any
) -> list[CheckMessage]:
    """W002 (``check --deploy``): every lock server's ``maxmemory-policy`` is
    ``noeviction``. Any other policy lets Redis evict a held lock (``volatile-*`` too:
    lock keys have a TTL), and another process then takes it while its holder still runs.
    Says nothing when a policy cannot be read (W001 reports a Redis that does not
    answer)."""
    try:
        config = get_config()
    except ImproperlyConfigured:
        return []  # check_settings reports it
    primaries, _ = _deploy_primaries(config)  # check_redis_answers reports problems
    warnings: list[CheckMessage] = []
    for label, client in primaries:
        try:
            policy = unsafe_eviction_policy(client.execute_command)
        finally:
            client.close()
        if policy is None:
            continue
        warnings.append(
            Warning(
                f"{label} evicts keys when it is full (maxmemory-policy {policy}): a held "
                "lock can vanish, and another process take it while its holder still runs",
                hint="Point DISTLOCK['URL'] at a Redis configured with maxmemory-policy "
                f"{SAFE_EVICTION_POLICY} (a server for locks, apart from the cache's), or set "
                f"maxmemory-policy {SAFE_EVICTION_POLICY} on this one if nothing on it relies "
                "on eviction (on its replicas too: a promoted replica keeps its own).",
                id="django_distlock.W002",
            )
        )
    return warnings


def check_celery_tasks(
    app_configs: Sequence[AppConfig] | None, **kwargs: Any
) -> list[CheckMessage]:
    """E007: every task of Celery's current app that asks for ``unique_while_queued``
    has the ``LockedTask`` class. Only where Celery is loaded already: a project that uses
    it loads its app with its settings, and a process without Celery must not import it
    for a check (so :mod:`django_distlock.celery` is loaded by name, only then)."""
    if "celery" not in sys.modules:
        return []
    celery_tasks = importlib.import_module("django_distlock.celery")
    return [
        Error(problem, hint=celery_tasks.NEEDS_LOCKED_TASK_HINT, id="django_distlock.E007")
        for problem in celery_tasks.check_current_app()
    ]


def register_checks() -> None:
    """Register the checks (``AppConfig.ready()`` calls this once)."""
    register(check_settings, TAG, Tags.caches)
    register(check_celery_tasks, TAG)
    register(check_lock_servers, TAG, Tags.caches, deploy=True)
    register(check_redis_answers, TAG, Tags.caches, deploy=True)
    register(check_eviction_policy, TAG, Tags.caches, deploy=True)
