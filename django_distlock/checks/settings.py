"""The checks of the ``DISTLOCK`` setting itself (E001-E006): each key's type and value,
the cache it names, the view hooks, and the libraries of the metrics backends."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error
from django.core.exceptions import ImproperlyConfigured

from ..connections import CacheError, lock_cache
from ..settings import (
    DEFAULTS,
    EVENT_MODES,
    Config,
    configured_hook,
    get_config,
    validate_setting,
)
from ..telemetry import BACKENDS, missing_library

__all__ = ["cache_errors", "check_settings"]

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
    "MIN_REPLICAS": "Use 'auto' (the default: wait for one replica where the primary has "
    "one), or an int from 0 (never wait for replicas) to 64, e.g. 1.",
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


def cache_errors(config: Config) -> list[CheckMessage]:
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
    return cache_errors(config) + _hook_errors() + _metrics_errors(config)
