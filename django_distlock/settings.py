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

import redis.connection
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from .engine import MAX_SECONDS, validate_prefix, validate_replicas, validate_seconds
from .telemetry import BACKENDS
from .telemetry.readings import LABEL_MODES

__all__ = [
    "DEFAULTS",
    "EVENT_MODES",
    "HOOKS",
    "WHERE_KEYS",
    "Config",
    "SettingError",
    "as_redis_url",
    "configured_hook",
    "get_config",
    "reset_config",
    "validate_setting",
]

EVENT_MODES = ("async", "sync", "off")

# Events may be kept longer than a lock may last (MAX_SECONDS); still bounded, so that
# "now minus the retention" stays a datetime.
MAX_EVENT_RETENTION = 100 * MAX_SECONDS

DEFAULTS: dict[str, Any] = {
    "CACHE": "default",
    "URL": None,
    "SENTINELS": None,
    "SENTINEL_SERVICE": None,
    "SENTINEL_KWARGS": None,
    "CLUSTER": None,
    "MIN_REPLICAS": "auto",
    "REPLICA_TIMEOUT": 0.1,
    "KEY_PREFIX": "distlock:",
    "TIMEOUT": 30.0,
    "AUTO_RENEW": True,
    "EVENTS": "async",
    "EVENT_RETENTION": 30 * 24 * 3600,
    "VIEW_ON_BUSY": None,
    "VIEW_ON_UNAVAILABLE": None,
    "VIEW_FAIL_OPEN": False,
    "METRICS": None,
    "METRICS_LABEL": "template",
}
"""Every key of ``DISTLOCK`` and its default:

``CACHE``: alias of the django-redis or django-valkey cache whose Redis holds the locks
(a single server, a Sentinel ``SentinelClient`` alias, or a django-valkey cluster cache).
``URL``: a ``redis://`` URL to use instead of ``CACHE``.
``SENTINELS``: ``[(host, port), ...]`` of the Sentinels that name the lock server's
primary (instead of ``CACHE``); needs ``SENTINEL_SERVICE``.
``SENTINEL_SERVICE``: the service name the Sentinels monitor (``"mymaster"``), or a
``redis://`` URL whose host is that name and which carries the primary's credentials, db,
TLS (``rediss://``) and timeouts (``"redis://:secret@mymaster/0?socket_timeout=2"``).
``SENTINEL_KWARGS``: options for the connections to the Sentinels themselves
(``{"password": ...}``); default: the socket timeouts of ``SENTINEL_SERVICE``.
``CLUSTER``: seed node URLs of a Redis/Valkey Cluster (``["redis://10.0.0.1:7000", ...]``;
credentials, TLS and timeouts from the first), instead of ``CACHE``.
``MIN_REPLICAS``: default of ``distlock(min_replicas=...)``: replicas that must acknowledge
an acquire (``WAIT``) for it to count; ``"auto"`` (the default): one where the lock's
primary reports a connected replica, none where it reports none; 0: never wait.
``REPLICA_TIMEOUT``: seconds an acquire waits for those acknowledgements.
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
``METRICS``: the metrics backends fed from lock events: ``"prometheus"``, ``"otel"``, a
list of both, or ``None`` (off).
``METRICS_LABEL``: what the metrics' ``lock`` label holds: ``"template"`` (the name
template, else the name up to its first ``:``), ``"prefix"`` (up to the first ``:``) or
``"none"`` (empty).
"""


WHERE_KEYS = ("URL", "SENTINELS", "CLUSTER")
"""The settings that say where locks live instead of ``CACHE``: at most one may be set."""

# Valkey's URL schemes (what django-valkey users write) and the redis-py scheme of each.
_VALKEY_SCHEMES = {"valkey": "redis", "valkeys": "rediss"}


def as_redis_url(url: str) -> str:
    """``url`` with a ``valkey://``/``valkeys://`` scheme spelled as redis-py reads it
    (``redis://``/``rediss://``); other URLs unchanged."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme.lower() in _VALKEY_SCHEMES:
        return f"{_VALKEY_SCHEMES[scheme.lower()]}://{rest}"
    return url


@dataclass(frozen=True)
class Config:
    """The validated ``DISTLOCK`` setting."""

    cache: str
    url: str | None
    sentinels: tuple[tuple[str, int], ...] | None
    sentinel_service: str | None
    sentinel_kwargs: dict[str, Any] | None
    cluster: tuple[str, ...] | None
    min_replicas: int | str
    replica_timeout: float
    key_prefix: str
    timeout: float
    auto_renew: bool
    events: str
    event_retention: float
    view_on_busy: str | None
    view_on_unavailable: str | None
    view_fail_open: bool
    metrics: tuple[str, ...]
    metrics_label: str


class SettingError(ImproperlyConfigured):
    """An invalid ``DISTLOCK``; ``hint`` (when set) says how to fix it, for the system
    check that reports it."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


def _setting_error(key: str, problem: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"DISTLOCK[{key!r}] {problem}")


def _optional_str(key: str, value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise _setting_error(key, "must be a non-empty str or None")
    return value


def _flag(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _setting_error(key, "must be True or False")
    return value


def _url(key: str, value: Any, *, schemes: tuple[str, ...]) -> str:
    spelled = " or ".join(f"{scheme}://" for scheme in schemes)
    if not isinstance(value, str) or not value:
        raise _setting_error(key, f"must be a {spelled} URL, not {value!r}")
    scheme = value.partition("://")[0].lower()
    if "://" not in value or scheme not in schemes:
        raise _setting_error(key, f"must be a {spelled} URL, not {value!r}")
    try:
        options = redis.connection.parse_url(as_redis_url(value))
    except ValueError as exc:
        raise _setting_error(key, f"is not a usable URL ({value!r}): {exc}") from None
    if not options.get("host"):
        raise _setting_error(key, f"names no host: {value!r}")
    return value


def _sentinels(key: str, value: Any) -> tuple[tuple[str, int], ...] | None:
    if value is None:
        return None
    problem = "must be a non-empty list of (host, port) pairs, e.g. [('10.0.0.1', 26379)]"
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple) or not value:
        raise _setting_error(key, problem)
    addresses = []
    for entry in value:
        if not isinstance(entry, list | tuple) or len(entry) != 2:
            raise _setting_error(key, f"{problem}; got {entry!r}")
        host, port = entry
        if not isinstance(host, str) or not host:
            raise _setting_error(key, f"{problem}; got the host {host!r}")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise _setting_error(key, f"{problem}; got the port {port!r}")
        addresses.append((host, port))
    return tuple(addresses)


def _sentinel_service(key: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise _setting_error(key, "must be a non-empty str: the service name, or a redis:// URL")
    if "://" in value:
        return _url(key, value, schemes=("redis", "rediss", "valkey", "valkeys"))
    return value


def _options(key: str, value: Any) -> dict[str, Any] | None:
    if value is not None and (
        not isinstance(value, dict) or not all(isinstance(name, str) for name in value)
    ):
        raise _setting_error(key, "must be a dict of connection options or None")
    return None if value is None else dict(value)


def _cluster(key: str, value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple) or not value:
        raise _setting_error(
            key, "must be a non-empty list of seed node URLs, e.g. ['redis://10.0.0.1:7000']"
        )
    return tuple(_url(key, url, schemes=("redis", "rediss", "valkey", "valkeys")) for url in value)


def _engine_value(check: Callable[[Any, str], Any]) -> Callable[[str, Any], Any]:
    def validate(key: str, value: Any) -> Any:
        try:
            return check(value, key)
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(f"DISTLOCK: {exc}") from None

    return validate


def _cache(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _setting_error(key, "must be a non-empty str (a CACHES alias)")
    return value


def _events(key: str, value: Any) -> str:
    if value not in EVENT_MODES:
        raise _setting_error(key, f"must be one of {', '.join(map(repr, EVENT_MODES))}")
    return str(value)


def _metrics(key: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list | tuple) or not all(
        isinstance(name, str) and name in BACKENDS for name in names
    ):
        choices = " or ".join(map(repr, BACKENDS))
        raise _setting_error(key, f"must be {choices}, a list of them, or None; not {value!r}")
    return tuple(dict.fromkeys(names))


def _metrics_label(key: str, value: Any) -> str:
    if value not in LABEL_MODES:
        raise _setting_error(key, f"must be one of {', '.join(map(repr, LABEL_MODES))}")
    return str(value)


_VALIDATORS: dict[str, Callable[[str, Any], Any]] = {
    "CACHE": _cache,
    "URL": _optional_str,  # an unusable URL is the deploy check W001's to report
    "SENTINELS": _sentinels,
    "SENTINEL_SERVICE": _sentinel_service,
    "SENTINEL_KWARGS": _options,
    "CLUSTER": _cluster,
    "MIN_REPLICAS": _engine_value(validate_replicas),
    "REPLICA_TIMEOUT": _engine_value(validate_seconds),
    "KEY_PREFIX": _engine_value(lambda value, key: validate_prefix(value)),
    "TIMEOUT": _engine_value(validate_seconds),
    "AUTO_RENEW": _flag,
    "EVENTS": _events,
    "EVENT_RETENTION": _engine_value(
        lambda value, key: validate_seconds(value, key, maximum=MAX_EVENT_RETENTION)
    ),
    "VIEW_ON_BUSY": _optional_str,
    "VIEW_ON_UNAVAILABLE": _optional_str,
    "VIEW_FAIL_OPEN": _flag,
    "METRICS": _metrics,
    "METRICS_LABEL": _metrics_label,
}


def validate_setting(key: str, value: Any) -> Any:
    """``DISTLOCK[key]`` checked on its own (``ImproperlyConfigured`` saying what is wrong),
    as :class:`Config` holds it."""
    return _VALIDATORS[key](key, value)


def _check_combination(values: dict[str, Any]) -> None:
    """The rules between keys: one place says where locks live, and Sentinel settings
    come together."""
    where = [key for key in WHERE_KEYS if values[key] is not None]
    if len(where) > 1:
        raise SettingError(
            f"DISTLOCK sets {' and '.join(where)}, but at most one of "
            f"{', '.join(WHERE_KEYS)} may say where locks live",
            hint="Keep the one that points at your lock server: URL for one server, "
            "SENTINELS (with SENTINEL_SERVICE) for a Sentinel-managed primary, CLUSTER for "
            "a Redis Cluster; or remove all three to use the cache DISTLOCK['CACHE'] names.",
        )
    if values["SENTINELS"] is not None and values["SENTINEL_SERVICE"] is None:
        raise SettingError(
            "DISTLOCK['SENTINELS'] is set, but DISTLOCK['SENTINEL_SERVICE'] is not",
            hint="Set DISTLOCK['SENTINEL_SERVICE'] to the name the Sentinels monitor the "
            "lock server's primary under, e.g. 'mymaster'.",
        )
    for key in ("SENTINEL_SERVICE", "SENTINEL_KWARGS"):
        if values[key] is not None and values["SENTINELS"] is None:
            raise SettingError(
                f"DISTLOCK[{key!r}] is set, but DISTLOCK['SENTINELS'] is not",
                hint="Set DISTLOCK['SENTINELS'] to the Sentinels' [(host, port), ...], or "
                f"remove {key} (a CACHE alias with SentinelClient takes its Sentinel "
                "settings from its own OPTIONS).",
            )


def _build(raw: Any) -> Config:
    if not isinstance(raw, dict):
        raise ImproperlyConfigured(f"DISTLOCK must be a dict, not {type(raw).__name__}")
    unknown = sorted(set(raw) - set(DEFAULTS), key=str)
    if unknown:
        raise ImproperlyConfigured(
            f"DISTLOCK has unknown keys {unknown}; known keys are {sorted(DEFAULTS)}"
        )
    values = {key: validate_setting(key, value) for key, value in {**DEFAULTS, **raw}.items()}
    _check_combination(values)
    return Config(**{key.lower(): value for key, value in values.items()})


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
