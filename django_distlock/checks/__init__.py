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
``django_distlock.W003``  a lock server has connected replicas but ``MIN_REPLICAS`` is 0,
                          so no acquire waits for a replica and a failover can hand a
                          held lock to a second holder (``check --deploy`` only)
======================  ==============================================================

The checks live by what they look at: :mod:`.settings` (E001-E006: the setting, the cache
it names, the view hooks, the metrics libraries), :mod:`.servers` (I001, W001-W003: the
lock servers of the topology, ``check --deploy`` only) and :mod:`.celery` (E007).
"""

from __future__ import annotations

from django.core.checks import Tags, register

from .celery import check_celery_tasks
from .servers import (
    PING_TIMEOUT,
    check_eviction_policy,
    check_lock_servers,
    check_redis_answers,
    check_replica_acknowledgement,
)
from .settings import check_settings

__all__ = [
    "PING_TIMEOUT",
    "TAG",
    "check_celery_tasks",
    "check_eviction_policy",
    "check_lock_servers",
    "check_redis_answers",
    "check_replica_acknowledgement",
    "check_settings",
    "register_checks",
]

TAG = "distlock"
"""Run only these checks with ``manage.py check --tag distlock``."""


def register_checks() -> None:
    """Register the checks (``AppConfig.ready()`` calls this once)."""
    register(check_settings, TAG, Tags.caches)
    register(check_celery_tasks, TAG)
    register(check_lock_servers, TAG, Tags.caches, deploy=True)
    register(check_redis_answers, TAG, Tags.caches, deploy=True)
    register(check_eviction_policy, TAG, Tags.caches, deploy=True)
    register(check_replica_acknowledgement, TAG, Tags.caches, deploy=True)
