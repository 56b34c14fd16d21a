"""The ``DISTLOCK`` setting: one dict, read through :func:`get_config`.

The value is cached and re-read whenever ``DISTLOCK`` or ``CACHES`` change (for example
under ``override_settings``: ``AppConfig.ready()`` connects :func:`reset_config`), so
nothing is read at import time.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from .engine.keys import MAX_SECONDS, validate_prefix, validate_seconds

__all__ = [
    "DEFAULTS",
    "EVENT_MODES",
    "HOOKS",
    "Config",
    "configured_hook",
    "get_config",
    "reset_config",
]

EVENT_MODES = ("async", "sync", "off")

# Events may be kept longer than a lock may last (MAX_SECONDS); still bounded, so that
# "now minus the retention" stays a datetime.
MAX_EVENT_RETENTION = 100 * MAX_SECONDS

DEFAULTS: dict[str, Any] = {
    "CACHE": "default",
    "URL": None,
    "KEY_PREFIX": "distlock:",
    "TIMEOUT": 30.0,
    "AUTO_RENEW": True,
    "EVENTS": "async",
    "EVENT_RETENTION": 30 * 24 * 3600,
    "VIEW_ON_BUSY": None,
    "VIEW_ON_UNAVAILABLE": None,
    "VIEW_FAIL_OPEN": False,
}
"""Every key of ``DISTLOCK`` and its default:

``CACHE``: alias of the django-redis cache whose Redis holds the locks.
``URL``: a ``redis://`` URL to use instead of ``CACHE``.
``KEY_PREFIX``: every key this package writes starts with it.
``TIMEOUT``: default lease in seconds (renewed while held when ``AUTO_RENEW``), at most
``MAX_SECONDS`` (one year).
``AUTO_RENEW``: default of ``distlock(auto_renew=...)``.
``EVENTS``: how lock events are recorded: ``"async"``, ``"sync"`` or ``"off"``.
``EVENT_RETENTION``: seconds lock events are kept (at most 100 years).
``VIEW_ON_BUSY``: dotted path of ``on_busy(request, name, retry_after)`` for views.
``VIEW_ON_UNAVAILABLE``: dotted path of ``on_unavailable(request, name)`` for views
(answers when Redis is down; default: 503).
``VIEW_FAIL_OPEN``: run guarded views anyway when Redis is down (default: 503).
"""


@dataclass(frozen=True)
class Config:
    """The validated ``DISTLOCK`` setting."""

    cache: str
    url: str | None
    key_prefix: str
    timeout: float
    auto_renew: bool
    events: str
    event_retention: float
    view_on_busy: str | None
    view_on_unavailable: str | None
    view_fail_open: bool


def _setting_error(key: str, problem: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"DISTLOCK[{key!r}] {problem}")


def _build(raw: Any) -> Config:
    if not isinstance(raw, dict):
        raise ImproperlyConfigured(f"DISTLOCK must be a dict, not {type(raw).__name__}")
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        raise ImproperlyConfigured(
            f"DISTLOCK has unknown keys {unknown}; known keys are {sorted(DEFAULTS)}"
        )
    values = {**DEFAULTS, **raw}
    for key in ("CACHE",):
        if not isinstance(values[key], str) or not values[key]:
            raise _setting_error(key, "must be a non-empty str (a CACHES alias)")
    for key in ("URL", "VIEW_ON_BUSY", "VIEW_ON_UNAVAILABLE"):
        if values[key] is not None and (not isinstance(values[key], str) or not values[key]):
            raise _setting_error(key, "must be a non-empty str or None")
    for key in ("AUTO_RENEW", "VIEW_FAIL_OPEN"):
        if not isinstance(values[key], bool):
            raise _setting_error(key, "must be True or False")
    if values["EVENTS"] not in EVENT_MODES:
        raise _setting_error("EVENTS", f"must be one of {', '.join(map(repr, EVENT_MODES))}")
    try:
        prefix = validate_prefix(values["KEY_PREFIX"])
        timeout = validate_seconds(values["TIMEOUT"], "TIMEOUT")
        retention = validate_seconds(
            values["EVENT_RETENTION"], "EVENT_RETENTION", maximum=MAX_EVENT_RETENTION
        )
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(f"DISTLOCK: {exc}") from None
    return Config(
        cache=values["CACHE"],
        url=values["URL"],
        key_prefix=prefix,
        timeout=timeout,
        auto_renew=values["AUTO_RENEW"],
        events=values["EVENTS"],
        event_retention=retention,
        view_on_busy=values["VIEW_ON_BUSY"],
        view_on_unavailable=values["VIEW_ON_UNAVAILABLE"],
        view_fail_open=values["VIEW_FAIL_OPEN"],
    )


@functools.cache
def get_config() -> Config:
    """The current ``DISTLOCK`` setting, validated (``ImproperlyConfigured`` if not)."""
    return _build(getattr(settings, "DISTLOCK", {}))


def reset_config() -> None:
    """Forget the cached setting (``AppConfig.ready()`` connects this to
    ``setting_changed`` for ``DISTLOCK`` and ``CACHES``)."""
    get_config.cache_clear()


HOOKS: dict[str, tuple[str, int]] = {
    "VIEW_ON_BUSY": ("on_busy(request, name, retry_after)", 3),
    "VIEW_ON_UNAVAILABLE": ("on_unavailable(request, name)", 2),
}
"""The settings that name a callable: how it is called, and with how many arguments."""


def configured_hook(key: str) -> Callable[..., Any] | None:
    """The callable whose dotted path ``DISTLOCK[key]`` holds (``None`` when unset),
    read now so that ``override_settings`` applies; ``ImproperlyConfigured`` saying what
    is wrong when it cannot be imported or called as the setting requires."""
    path = getattr(get_config(), key.lower())
    return None if path is None else _hook(key, path)


@functools.cache
def _hook(key: str, path: str) -> Callable[..., Any]:
    call, arity = HOOKS[key]
    where = f"DISTLOCK[{key!r}] is {path!r}"
    try:
        hook = import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(f"{where}, which cannot be imported: {exc}") from exc
    if not callable(hook):
        raise ImproperlyConfigured(f"{where}, which is a {type(hook).__name__}, not a callable")
    try:
        inspect.signature(hook).bind(*(None, "name", 1.0)[:arity])
    except TypeError as exc:
        raise ImproperlyConfigured(f"{where}, which cannot be called as {call}: {exc}") from None
    except ValueError:  # no signature to inspect (some builtins): trust it
        pass
    return hook  # type: ignore[no-any-return]
