"""``DISTLOCK["MIN_REPLICAS"]`` through the Django layer, on a real primary whose replicas
are paused (SIGSTOP: their links stay up, but they acknowledge nothing, so ``WAIT``
times out): guarded views answer 503, locked commands fail, and the ``not_replicated``
event and signal say how many replicas acknowledged."""

from __future__ import annotations

import asyncio
import io
import logging
import re
import threading
import time
from collections.abc import Iterator

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import path, reverse

from django_distlock import LockBackendUnavailable, LockNotReplicated, distlock
from django_distlock.admin.chart import DEFAULT_COLOURS
from django_distlock.connections import get_backend
from django_distlock.engine import Lock
from django_distlock.models import LockEvent
from django_distlock.signals import lock_not_replicated
from django_distlock.views import lock_view
from tests.support.topologies import ReplicatedSetup

pytestmark = pytest.mark.urls(__name__)


@lock_view("invoice:{invoice_id}")
def pay(request: HttpRequest, invoice_id: int) -> HttpResponse:
    return HttpResponse("paid")


@lock_view("invoice:{invoice_id}")
async def apay(request: HttpRequest, invoice_id: int) -> HttpResponse:
    return HttpResponse("paid")


urlpatterns = [
    path("pay/<int:invoice_id>/", pay),
    path("apay/<int:invoice_id>/", apay),
    path("admin/", admin.site.urls),
]

EXPLAINED = "but only 0 of the 1 replicas it needs (min_replicas) acknowledged it within 100 ms"


@pytest.fixture
def replicas_paused(replicated_setup: ReplicatedSetup) -> Iterator[ReplicatedSetup]:
    """Locks on ``replicated_setup`` with ``MIN_REPLICAS=1``; both replicas paused."""
    distlock_setting = {"URL": replicated_setup.primary.url, "MIN_REPLICAS": 1, "EVENTS": "sync"}
    with override_settings(DISTLOCK=distlock_setting):
        with distlock("invoice:1") as lock:  # in sync: one replica is enough
            assert lock.fence
        for index in range(len(replicated_setup.replicas)):
            replicated_setup.pause_replica(index)
        try:
            yield replicated_setup
        finally:
            for replica in replicated_setup.replicas:
                replica.resume()


def test_the_setting_reaches_the_backend(replicated_setup):
    setting = {
        "URL": replicated_setup.primary.url,
        "MIN_REPLICAS": 2,
        "REPLICA_TIMEOUT": 0.5,
        "EVENTS": "off",
    }
    with override_settings(DISTLOCK=setting):
        backend = get_backend()
        assert (backend.min_replicas, backend.replica_timeout) == (2, 0.5)
        with distlock("invoice:2") as lock:  # both replicas acknowledge
            assert lock.fence
        with pytest.raises(LockNotReplicated, match="only 2 of the 3 replicas") as raised:
            distlock("invoice:2", min_replicas=3).acquire()  # per lock: more than there are
        assert (raised.value.acknowledged, raised.value.required) == (2, 3)


@pytest.mark.django_db(transaction=True)  # the async view records from another thread
@pytest.mark.parametrize("view", ["pay", "apay"])
def test_a_guarded_view_answers_503_and_logs_why(replicas_paused, view, caplog):
    received = []

    def receiver(sender, event, **kwargs):
        received.append(event)

    lock_not_replicated.connect(receiver, sender=Lock)
    try:
        with caplog.at_level(logging.WARNING, logger="django_distlock"):
            response = Client().post(f"/{view}/42/")
    finally:
        lock_not_replicated.disconnect(receiver, sender=Lock)
    assert response.status_code == 503
    assert "Retry-After" in response
    [record] = [r for r in caplog.records if "answering 503" in r.getMessage()]
    assert EXPLAINED in record.getMessage()
    [event] = received
    assert (event.kind, event.name, event.fence) == ("not_replicated", "invoice:42", None)
    assert event.reason == "0 of 1 replicas acknowledged"
    [row] = LockEvent.objects.filter(kind=LockEvent.Kind.NOT_REPLICATED)
    assert (row.name, row.reason, row.fence) == ("invoice:42", "0 of 1 replicas acknowledged", None)
    assert row.waited_ms >= 100
    # The acquire was given back: with the replicas back, the view runs.
    for replica in replicas_paused.replicas:
        replica.resume()
    replicas_paused.wait_in_sync()
    assert Client().post(f"/{view}/42/").status_code == 200


@pytest.mark.django_db
def test_a_locked_command_fails_and_says_why(replicas_paused):
    with pytest.raises(CommandError) as raised:
        call_command("sync_catalog", stdout=io.StringIO())
    message = str(raised.value)
    assert message.startswith("cannot take lock 'sync_catalog': lock 'sync_catalog' was taken")
    assert EXPLAINED in message
    assert "(the primary has 2 connected replicas" in message  # what the server reported
    assert "raise replica_timeout, or lower min_replicas" in message
    assert isinstance(raised.value.__cause__, LockNotReplicated)
    assert isinstance(raised.value.__cause__, LockBackendUnavailable)
    assert (raised.value.__cause__.acknowledged, raised.value.__cause__.required) == (0, 1)


@pytest.mark.django_db(transaction=True)
def test_distlock_raises_lock_not_replicated_sync_and_async(replicas_paused):
    with pytest.raises(LockNotReplicated, match=re.escape(EXPLAINED)):
        distlock("report").acquire()

    async def take() -> None:
        async with distlock("report"):
            pass

    with pytest.raises(LockNotReplicated, match=re.escape(EXPLAINED)):
        asyncio.run(take())
    # Per lock: min_replicas=0 does not wait for the paused replicas.
    with distlock("report", min_replicas=0) as lock:
        assert lock.fence
    assert LockEvent.objects.filter(kind="not_replicated", name="report").count() == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_waiter_tries_again_while_no_replica_acknowledges(replicas_paused, api):
    """A planned failover takes the old primary's replica first: a waiting acquire that no
    replica acknowledges gives the lock back and tries again within its
    ``blocking_timeout`` (for up to the failover ride-out), instead of raising at once."""

    def acquire(name: str, blocking_timeout: float) -> bool:
        lock = distlock(name, blocking_timeout=blocking_timeout)
        if api == "sync":
            got = lock.acquire()
            if got:
                lock.release()
            return got

        async def take() -> bool:
            got = await lock.aacquire()
            if got:
                await lock.arelease()
            return got

        return asyncio.run(take())

    started = time.monotonic()
    with pytest.raises(LockNotReplicated, match=re.escape(EXPLAINED)):
        acquire("report", 1.0)  # the replicas stay paused: refused at the wait's end
    assert 1.0 <= time.monotonic() - started < 3.0
    resume = threading.Timer(0.5, lambda: [r.resume() for r in replicas_paused.replicas])
    resume.start()
    started = time.monotonic()
    try:
        assert acquire("report:later", 5.0)
    finally:
        resume.join()
    assert 0.5 <= time.monotonic() - started < 5.0


@pytest.mark.django_db(transaction=True)
def test_the_admin_filters_and_charts_not_replicated_events(replicas_paused):
    for _attempt in range(2):
        with pytest.raises(LockNotReplicated):
            distlock("report").acquire()
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    url = reverse("admin:django_distlock_lockevent_changelist")
    page = client.get(url).content.decode()
    assert '?kind__exact=not_replicated">not replicated</a>' in page  # the kind filter
    filtered = client.get(url, {"kind__exact": "not_replicated"}).content.decode()
    assert filtered.count('not replicated</td><td class="field-lock">report</td>') == 2
    colour = DEFAULT_COLOURS["not_replicated"]
    assert re.search(rf'data-kind="not_replicated"[^>]*fill="{colour}"', filtered)
