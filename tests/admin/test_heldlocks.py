"""The held-locks admin: changelist, detail page, force release and permissions, over
locks really held in the suite's Redis."""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import statistics
import threading
import time
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.test import Client, override_settings
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.html import escape

from django_distlock import LockLost, LockNotOwned, distlock, events
from django_distlock.connections import get_backend
from django_distlock.engine import Lock
from django_distlock.engine.renewal.watchdog import listening
from django_distlock.models import HeldLock, LockEvent
from tests.support.admin import logged_in, make_user

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_client", "events_off")]

CHANGELIST = "/admin/django_distlock/heldlock/"
DETAIL = CHANGELIST + "detail/"
FORCE_RELEASE = CHANGELIST + "force-release/"


def _names_on_page(html: str) -> list[str]:
    return re.findall(r'<th class="lock-name"><a href="[^"]*">(.*?)</a></th>', html)


def _detail(name: str) -> str:
    return DETAIL + "?" + urlencode({"name": name})


def _selection(lock: Lock) -> str:
    held = HeldLock.objects.get(name=lock.name)
    return f"{held.token}:{held.fence}:{held.name}"


def _let_go(*locks: Lock) -> None:
    """Release ``locks`` at the end of a test, whether or not they were taken away."""
    for lock in locks:
        with contextlib.suppress(LockLost, LockNotOwned):
            lock.release()


def _messages(response: object) -> list[str]:
    return [str(message) for message in response.context["messages"]]  # type: ignore[attr-defined]


# -- changelist -------------------------------------------------------------------------


def test_changelist_lists_held_locks_with_their_owner(admin, hold):
    lock = hold.enter_context(
        distlock("invoice:42", context="billing.pay", timeout=30, auto_renew=False)
    )
    hold.enter_context(distlock("report:daily", timeout=60, auto_renew=True))
    response = admin.get(CHANGELIST)
    assert response.status_code == 200
    html = response.content.decode()
    # Unless asked, the locks that stay held longest come first.
    assert _names_on_page(html) == ["report:daily", "invoice:42"]
    assert "2 holds" in html
    assert "billing.pay" in html
    assert f'<td class="fence">{lock.fence}</td>' in html
    assert 'href="/admin/django_distlock/heldlock/detail/?name=invoice%3A42"' in html
    # TTL in seconds, with its expiry for the countdown script.
    ttl = re.search(
        r'data-expires-at="(\d+)" data-ttl="([\d.]+)" data-renew-every="">(\d+)s</td>', html
    )
    assert ttl is not None
    # The renewing lock tells the countdown its renewal period (a third of its lease).
    assert 'data-renew-every="20.000">' in html
    assert 25 <= float(ttl.group(2)) <= 30
    assert abs(int(ttl.group(1)) / 1000 - (time.time() + float(ttl.group(2)))) < 5
    assert "icon-no.svg" in html
    assert "icon-yes.svg" in html
    # The admin look, the countdown and the pausable auto-refresh.
    assert "breadcrumbs" in html
    assert "Pause auto-refresh" in html
    assert "localStorage" in html
    assert "window.location.reload()" in html
    # A superuser may force release.
    assert "Force release selected locks" in html
    assert f'value="{_selection(lock)}"' in html


def test_changelist_warns_when_the_lock_server_evicts_keys(admin, private_redis):
    warning = "the lock server evicts keys (maxmemory-policy volatile-lru): held locks can vanish"
    with override_settings(DISTLOCK={"URL": private_redis.url, "EVENTS": "off"}):
        assert warning not in admin.get(CHANGELIST).content.decode()
        private_redis.client().config_set("maxmemory-policy", "volatile-lru")
        html = admin.get(CHANGELIST).content.decode()
    assert warning in html
    assert "Use noeviction." in html
    assert "No lock is held." in html


def test_changelist_owner_and_held_for(admin, hold):
    hold.enter_context(distlock("job", timeout=30))
    html = admin.get(CHANGELIST).content.decode()
    held = HeldLock.objects.get(name="job")
    assert f"{held.host}:{held.pid} {held.thread}" in html
    assert '<td class="held-for"' in html
    # Written as the CLI writes durations: a lock held for milliseconds is "0.0s".
    assert re.search(r'<td class="held-for" title="[^"]+">0\.\ds</td>', html)


def test_empty_changelist(admin, redis_client):
    response = admin.get(CHANGELIST)
    assert response.status_code == 200
    assert "No lock is held." in response.content.decode()
    assert "Force release selected locks" not in response.content.decode()


def test_search_is_a_literal_substring(admin, hold):
    names = ["a*b", "axb", "a?c", "abc", "[ab]", "a", "x.y", "xzy", "(a|b)", "a|b"]
    for name in names:
        hold.enter_context(distlock(name, timeout=30))
    for query, expected in [
        ("*", ["a*b"]),
        ("a*b", ["a*b"]),
        ("?", ["a?c"]),
        ("[ab]", ["[ab]"]),
        ("x.y", ["x.y"]),
        (".", ["x.y"]),
        ("(a|b)", ["(a|b)"]),
        ("b", sorted(["a*b", "axb", "abc", "[ab]", "(a|b)", "a|b"])),
        ("nothing", []),
    ]:
        response = admin.get(CHANGELIST, {"q": query, "o": "name"})
        assert response.status_code == 200
        assert _names_on_page(response.content.decode()) == expected, query


def test_names_with_html_are_escaped(admin, redis_client):
    name = '<script>alert("x")</script>&<b>'
    lock = distlock(name, context="<i>ctx</i>", timeout=30)
    assert lock.acquire()
    try:
        _check_escaped(admin, name)
    finally:
        _let_go(lock)


def _check_escaped(admin: Client, name: str) -> None:
    for response in (
        admin.get(CHANGELIST),
        admin.get(CHANGELIST, {"q": "<script>"}),
        admin.get(_detail(name)),
        admin.get(FORCE_RELEASE, {"lock": _selection(distlock(name))}),
    ):
        html = response.content.decode()
        assert response.status_code == 200
        assert "<script>alert" not in html
        assert "<i>ctx</i>" not in html
        assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&lt;b&gt;" in html
    response = admin.post(
        FORCE_RELEASE, {"lock": _selection(distlock(name)), "confirm": "yes"}, follow=True
    )
    html = response.content.decode()
    assert "Force-released lock" in html
    assert "<script>alert" not in html
    assert "&lt;script&gt;alert" in html


def test_very_long_names_render(admin, hold):
    name = "long:" + "é/" * 253 + "z"
    assert len(name) == 512
    hold.enter_context(distlock(name, timeout=30))
    html = admin.get(CHANGELIST).content.decode()
    assert _names_on_page(html) == [name]
    detail = admin.get(_detail(name))
    assert detail.status_code == 200
    assert name in detail.content.decode()


@pytest.mark.parametrize(
    ("ordering", "expected"),
    [
        ("name", ["a", "b", "c"]),
        ("-name", ["c", "b", "a"]),
        ("ttl", ["b", "c", "a"]),
        ("-ttl", ["a", "c", "b"]),
        ("acquired_at", ["c", "a", "b"]),
        ("-acquired_at", ["b", "a", "c"]),
        ("bogus", ["a", "c", "b"]),  # the default: -ttl
        ("", ["a", "c", "b"]),
    ],
)
def test_ordering(admin, hold, ordering, expected):
    # acquired c, a, b; leases a 60 s, c 40 s, b 20 s.
    for name, timeout in (("c", 40), ("a", 60), ("b", 20)):
        hold.enter_context(distlock(name, timeout=timeout, auto_renew=False))
        time.sleep(0.002)
    html = admin.get(CHANGELIST, {"o": ordering}).content.decode()
    assert _names_on_page(html) == expected


def test_sortable_headers_toggle_and_keep_the_search(admin, hold):
    hold.enter_context(distlock("x", timeout=30))
    html = admin.get(CHANGELIST, {"q": "x", "o": "name"}).content.decode()
    assert 'class="sortable sorted ascending"><div class="text"><a href="?q=x&amp;o=-name"' in html
    assert 'href="?q=x&amp;o=ttl"' in html
    assert 'href="?q=x&amp;o=-acquired_at"' in html  # "held for", shortest first
    html = admin.get(CHANGELIST, {"o": "-name"}).content.decode()
    assert 'class="sortable sorted descending"><div class="text"><a href="?o=name"' in html
    # The default order, longest TTL first, is the TTL column's descending one.
    html = admin.get(CHANGELIST).content.decode()
    assert 'class="sortable sorted descending"><div class="text"><a href="?o=ttl"' in html
    html = admin.get(CHANGELIST, {"o": "ttl"}).content.decode()
    assert 'class="sortable sorted ascending"><div class="text"><a href="?"' in html


def test_pagination(admin, redis_client):
    locks = [distlock(f"job:{i:03}", timeout=60, auto_renew=False) for i in range(250)]
    for lock in locks:
        assert lock.acquire(blocking=False)
    try:
        first = admin.get(CHANGELIST, {"o": "name"}).content.decode()
        third = admin.get(CHANGELIST, {"o": "name", "p": 3}).content.decode()
        beyond = admin.get(CHANGELIST, {"o": "name", "p": 99}).content.decode()
        searched = admin.get(CHANGELIST, {"q": "job:1", "o": "name", "p": 2}).content.decode()
        # The default order (lease end, latest first; equal ends by name, descending) is
        # read from each bucket's index only as far as the page goes.
        by_lease = admin.get(CHANGELIST, {"p": 2}).content.decode()
        by_lease_searched = admin.get(CHANGELIST, {"q": "job:1"}).content.decode()
    finally:
        for lock in locks:
            lock.release()
    assert "250 holds" in first
    assert _names_on_page(first) == [f"job:{i:03}" for i in range(100)]
    assert "page 1 of 3" in first
    assert 'href="?o=name&amp;p=3"' in first
    assert _names_on_page(third) == [f"job:{i:03}" for i in range(200, 250)]
    assert _names_on_page(beyond) == _names_on_page(third)  # get_page: the last page
    assert "100 holds" in searched
    assert "page 1 of 1" not in searched
    assert _names_on_page(searched) == [f"job:{i:03}" for i in range(100, 200)]
    assert _names_on_page(by_lease) == [f"job:{i:03}" for i in range(149, 49, -1)]
    assert _names_on_page(by_lease_searched) == [f"job:{i:03}" for i in range(199, 99, -1)]


def test_ten_thousand_locks_page_render_time(admin, redis_client, capsys):
    locks = [distlock(f"n:{i:05}", auto_renew=False, timeout=120) for i in range(10_000)]
    for lock in locks:
        assert lock.acquire(blocking=False)
    try:
        admin.get(CHANGELIST)  # warm up (scripts, templates)
        timings = {}
        for label, params in (
            ("first page (by -ttl)", {}),
            ("page 50 (by -ttl)", {"p": 50}),
            ("first page by name", {"o": "name"}),
            ("page 50 by name", {"o": "name", "p": 50}),
            ("by -acquired_at", {"o": "-acquired_at"}),
            ("search n:09", {"q": "n:09"}),
        ):
            runs = []
            for _ in range(5):
                started = time.perf_counter()
                response = admin.get(CHANGELIST, params)
                runs.append(time.perf_counter() - started)
                assert response.status_code == 200
                assert len(_names_on_page(response.content.decode())) == 100
            timings[label] = statistics.median(runs)
        assert "10000 holds" in admin.get(CHANGELIST).content.decode()
    finally:
        for lock in locks:
            lock.release()
    with capsys.disabled():
        print()
        for label, seconds in timings.items():
            print(
                f"held-locks changelist, 10,000 locks, {label}: "
                f"{seconds * 1000:.1f} ms (median of 5)"
            )
    assert max(timings.values()) < 2.0


# -- detail -----------------------------------------------------------------------------


def test_detail_page_shows_metadata_and_recent_events(admin, hold):
    name = "path/with?odd&chars=%2F #1"
    lock = hold.enter_context(distlock(name, context="ctx.detail", timeout=30))
    now = timezone.now()
    LockEvent.objects.bulk_create(
        [
            LockEvent(
                name=name,
                kind="acquired",
                fence=i,
                at=now - dt.timedelta(seconds=i),
                host="web-1",
                pid=4242,
                thread="worker",
            )
            for i in range(60)
        ]
        + [LockEvent(name="other", kind="released", fence=999, at=now)]
    )
    response = admin.get(_detail(name))
    assert response.status_code == 200
    html = response.content.decode()
    held = HeldLock.objects.get(name=name)
    assert "path/with?odd&amp;chars=%2F #1" in html
    assert "ctx.detail" in html
    assert f"<td>{lock.fence}</td>" in html
    assert "<td>30s</td>" in html  # the lease, written as the CLI writes durations
    assert held.token in html
    assert held.host in html
    assert "data-expires-at=" in html
    events = list(response.context["events"])
    assert len(events) == 50
    assert [event.fence for event in events] == list(range(50))  # newest first
    assert html.count('class="event event-acquired"') == 50
    assert html.count('<td class="owner">web-1:4242 worker</td>') == 50  # the CLI's owner format
    assert ">999<" not in html
    assert "force-release-button" in html
    force_url = re.search(r'<a href="([^"]+)" class="danger-button"', html)
    assert force_url is not None
    confirmation = admin.get(force_url.group(1).replace("&amp;", "&"))
    assert confirmation.status_code == 200
    assert escape(response.context["row"].selection) in confirmation.content.decode()


def test_detail_links_to_the_events_changelist_when_it_exists(admin, hold):
    hold.enter_context(distlock("a b/c", timeout=30))
    html = admin.get(_detail("a b/c")).content.decode()
    try:
        url = reverse("admin:django_distlock_lockevent_changelist")
    except NoReverseMatch:  # the lock events admin is another module's
        assert 'id="events-link"' not in html
    else:
        assert f'href="{url}?name=a+b%2Fc" id="events-link"' in html


def test_detail_of_a_lock_not_held(admin, redis_client):
    LockEvent.objects.create(name="gone", kind="released", fence=7, at=timezone.now())
    response = admin.get(_detail("gone"))
    assert response.status_code == 404
    html = response.content.decode()
    assert "The lock “gone” is not held (any more)." in html
    assert 'class="event event-released"' in html
    assert "force-release-button" not in html
    assert admin.get(DETAIL).status_code == 404


def test_detail_hides_events_without_their_permission(hold):
    hold.enter_context(distlock("e", timeout=30))
    LockEvent.objects.create(name="e", kind="acquired", fence=1, at=timezone.now())
    client = logged_in(make_user("noevents", "view_heldlock"))
    html = client.get(_detail("e")).content.decode()
    assert "You do not have permission to view lock events." in html
    assert "event-acquired" not in html


# -- force release ----------------------------------------------------------------------


def _wait_in_thread(name: str) -> tuple[threading.Thread, dict[str, object]]:
    result: dict[str, object] = {}

    def wait() -> None:
        waiter = distlock(name, timeout=30, blocking_timeout=10)
        started = time.monotonic()
        result["acquired"] = waiter.acquire()
        result["waited"] = time.monotonic() - started
        if result["acquired"]:
            result["fence"] = waiter.fence
            waiter.release()

    thread = threading.Thread(target=wait)
    thread.start()
    return thread, result


def _main_thread_writes_only(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Let only this thread write lock events; return the kinds the other threads recorded.

    The shared in-memory test database fails a second writer at once ("database table is
    locked") where a deployment's database waits: the woken waiter's and the evicted
    holder's events, written as the view writes its own, would make the view's row
    (the one under test) a coin toss."""
    write = events._WRITERS["sync"]
    main = threading.current_thread()
    elsewhere: list[str] = []

    def write_here(item: Any) -> None:
        if threading.current_thread() is main:
            write(item)
        else:
            elsewhere.append(item[0].kind)

    monkeypatch.setitem(events._WRITERS, "sync", write_here)
    return elsewhere


@pytest.mark.django_db(transaction=True)
@override_settings(DISTLOCK={"EVENTS": "sync"})
def test_force_release_from_the_changelist(admin_user, redis_client, monkeypatch):
    elsewhere = _main_thread_writes_only(monkeypatch)
    admin = logged_in(admin_user, enforce_csrf_checks=True)
    lock = distlock("stuck:job", context="cron", timeout=60, raise_on_lost=False)
    other = distlock("other", timeout=60)
    assert lock.acquire()
    assert other.acquire()
    try:
        selection = _selection(lock)
        changelist = admin.get(CHANGELIST).content.decode()
        assert f'<form id="heldlocks-form" method="post" action="{FORCE_RELEASE}">' in changelist
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', changelist)
        assert csrf is not None
        # The selection is posted (it may be too long for a URL): that only confirms.
        confirmation = admin.post(
            FORCE_RELEASE, {"lock": [selection], "csrfmiddlewaretoken": csrf.group(1)}
        )
        assert confirmation.status_code == 200
        assert HeldLock.objects.filter(name="stuck:job").exists()
        by_get = admin.get(FORCE_RELEASE, {"lock": [selection]}).context["items"]
        assert [(item["selection"], item["changed_hands"]) for item in by_get] == [
            (item["selection"], item["changed_hands"]) for item in confirmation.context["items"]
        ]
        html = confirmation.content.decode()
        token, fence, _name = selection.split(":", 2)
        assert token in html
        assert f'<td class="fence">{fence}</td>' in html
        assert "still held" in html
        assert f'<input type="hidden" name="lock" value="{selection}">' in html
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
        assert csrf is not None
        assert '<input type="hidden" name="confirm" value="yes">' in html
        assert HeldLock.objects.filter(name="stuck:job").exists()  # GET released nothing

        thread, result = _wait_in_thread("stuck:job")
        time.sleep(0.2)
        response = admin.post(
            FORCE_RELEASE,
            {"lock": [selection], "confirm": "yes", "csrfmiddlewaretoken": csrf.group(1)},
        )
        thread.join(15)
        assert response.status_code == 302
        assert response.url == CHANGELIST  # type: ignore[attr-defined]
        assert result["acquired"] is True
        assert result["waited"] < 5  # type: ignore[operator]
        assert result["fence"] > lock.fence  # type: ignore[operator]
        assert HeldLock.objects.filter(name="other").exists()

        page = admin.get(response.url)  # type: ignore[attr-defined]
        assert "stuck:job" in admin.get("/admin/").content.decode()  # recent actions
        assert f"Force-released lock “stuck:job” (fence {lock.fence})." in _messages(page)

        event = LockEvent.objects.get(name="stuck:job", kind="force_released")
        assert event.user == admin_user
        assert event.fence == lock.fence
        assert event.context == "cron"
        entry = LogEntry.objects.get()
        assert entry.user == admin_user
        assert entry.action_flag == DELETION
        assert entry.object_id == "stuck:job"
        assert entry.content_type == ContentType.objects.get_for_model(HeldLock)
        assert f"fence {lock.fence}" in entry.get_change_message()
        with pytest.raises(LockLost):  # the evicted holder finds out
            lock.release()
        assert {"acquired", "released"} <= set(elsewhere)  # the waiter's, in its thread
    finally:
        _let_go(lock, other)


def test_force_release_button_on_the_detail_page(operator, redis_client):
    lock = distlock("from/detail", timeout=60, raise_on_lost=False)
    assert lock.acquire()
    try:
        detail = operator.get(_detail("from/detail")).content.decode()
        url = re.search(r'<a href="([^"]+)" class="danger-button"', detail)
        assert url is not None
        confirmation = operator.get(url.group(1).replace("&amp;", "&"))
        assert confirmation.status_code == 200
        selection = confirmation.context["items"][0]["selection"]
        response = operator.post(FORCE_RELEASE, {"lock": selection, "confirm": "yes"}, follow=True)
        assert response.status_code == 200
        assert not HeldLock.objects.filter(name="from/detail").exists()
        assert "Force-released lock “from/detail”" in _messages(response)[0]
        assert LogEntry.objects.filter(object_id="from/detail").count() == 1
    finally:
        _let_go(lock)


def test_force_release_several_locks(admin, redis_client):
    locks = [distlock(f"batch:{i}", timeout=60, raise_on_lost=False) for i in range(3)]
    for lock in locks:
        assert lock.acquire()
    try:
        selections = [_selection(lock) for lock in locks[:2]]
        html = admin.get(FORCE_RELEASE, {"lock": selections}).content.decode()
        assert "Force release these 2 locks?" in html
        response = admin.post(FORCE_RELEASE, {"lock": selections, "confirm": "yes"}, follow=True)
        assert [held.name for held in HeldLock.objects.all()] == ["batch:2"]
        assert len(_messages(response)) == 2
        assert LogEntry.objects.count() == 2
    finally:
        _let_go(*locks)


@override_settings(DISTLOCK={"EVENTS": "sync"})
def test_a_lock_that_changed_hands_is_not_touched(admin, admin_user, redis_client):
    first = distlock("handover", timeout=60, raise_on_lost=False)
    assert first.acquire()
    first_fence = first.fence
    selection = _selection(first)
    confirmation = admin.get(FORCE_RELEASE, {"lock": selection})
    assert "still held" in confirmation.content.decode()
    first.release()
    second = distlock("handover", timeout=60)
    assert second.acquire()
    try:
        # The confirmation page, reloaded, says so already.
        again = admin.get(FORCE_RELEASE, {"lock": selection}).content.decode()
        assert "changed hands since you saw it: it will not be touched" in again
        response = admin.post(FORCE_RELEASE, {"lock": selection, "confirm": "yes"}, follow=True)
        held = HeldLock.objects.get(name="handover")
        assert held.fence == second.fence  # untouched
        assert second.extend(30)
        message = _messages(response)[0]
        assert "“handover”" in message
        assert f"(fence {first_fence}) was not released" in message
        assert "changed hands or expired" in message
        assert not LogEntry.objects.exists()
        # Nothing was released, so the history says nothing was: no force_released row.
        assert list(LockEvent.objects.order_by("id").values_list("kind", flat=True)) == [
            "acquired",
            "released",
            "acquired",
            "extended",
        ]
    finally:
        second.release()


@override_settings(DISTLOCK={"EVENTS": "sync"})
def test_force_release_of_a_lock_gone_meanwhile(admin, redis_client):
    lock = distlock("ephemeral", timeout=60)
    assert lock.acquire()
    selection = _selection(lock)
    lock.release()
    html = admin.get(FORCE_RELEASE, {"lock": selection}).content.decode()
    assert "no longer held: nothing to release" in html
    assert "Nothing to release" in html
    assert 'id="confirm-force-release"' not in html
    assert 'name="lock"' not in html
    # A POST made anyway (a page from before) releases nothing and says so.
    response = admin.post(FORCE_RELEASE, {"lock": selection, "confirm": "yes"}, follow=True)
    assert "was not released" in _messages(response)[0]
    assert not LogEntry.objects.exists()
    # Not recorded as a release (it would have no holder: owner "-:- -"), nor counted
    # in the events page's chart.
    assert not LockEvent.objects.filter(kind="force_released").exists()
    chart = admin.get("/admin/django_distlock/lockevent/").context["event_chart"]
    assert [(series.kind, series.total) for series in chart.kinds] == [
        ("acquired", 1),
        ("released", 1),
    ]


def test_only_the_holds_still_there_are_offered_for_release(admin, redis_client):
    gone = distlock("ephemeral", timeout=60)
    assert gone.acquire()
    gone_selection = _selection(gone)
    gone.release()
    held = distlock("still:here", timeout=60)
    assert held.acquire()
    try:
        selections = [gone_selection, _selection(held)]
        html = admin.get(FORCE_RELEASE, {"lock": selections}).content.decode()
        assert "Force release this lock?" in html
        assert "no longer held: nothing to release" in html
        assert re.findall(r'name="lock" value="([^"]*)"', html) == [escape(_selection(held))]
        assert 'id="confirm-force-release"' in html
    finally:
        held.release()


def test_force_release_with_nothing_selected(admin, redis_client):
    for response in (
        admin.get(FORCE_RELEASE, follow=True),
        admin.post(FORCE_RELEASE, {"lock": "garbage", "confirm": "yes"}, follow=True),
    ):
        assert response.redirect_chain == [(CHANGELIST, 302)]
        assert _messages(response) == ["No lock was selected."]


def test_force_release_post_needs_the_csrf_token(admin_user, redis_client):
    client = logged_in(admin_user, enforce_csrf_checks=True)
    lock = distlock("csrf", timeout=60)
    assert lock.acquire()
    try:
        response = client.post(FORCE_RELEASE, {"lock": _selection(lock), "confirm": "yes"})
        assert response.status_code == 403
        assert HeldLock.objects.filter(name="csrf").exists()
        assert lock.extend(30)
    finally:
        lock.release()


def test_force_release_only_by_get_and_post(admin, redis_client):
    assert admin.put(FORCE_RELEASE).status_code == 405
    assert admin.delete(FORCE_RELEASE).status_code == 405


# -- permissions ------------------------------------------------------------------------

PAGES = (CHANGELIST, _detail("perm"), FORCE_RELEASE + "?lock=0:1:perm")


def test_anonymous_users_are_sent_to_the_login_page(client, hold):
    hold.enter_context(distlock("perm", timeout=30))
    for url in PAGES:
        response = client.get(url)
        assert response.status_code == 302
        assert response.url.startswith("/admin/login/?next=")
    response = client.post(FORCE_RELEASE, {"lock": _selection(distlock("perm")), "confirm": "yes"})
    assert response.status_code == 302
    assert HeldLock.objects.filter(name="perm").exists()


def test_staff_without_view_permission_get_403(hold):
    hold.enter_context(distlock("perm", timeout=30))
    client = logged_in(make_user("nobody", "view_lockevent"))
    for url in PAGES:
        assert client.get(url).status_code == 403, url
    assert (
        client.post(
            FORCE_RELEASE, {"lock": _selection(distlock("perm")), "confirm": "yes"}
        ).status_code
        == 403
    )
    assert HeldLock.objects.filter(name="perm").exists()
    index = client.get("/admin/").content.decode()
    assert CHANGELIST not in index
    assert "Held locks" not in index


def _assert_cannot_force_release(client: Client, name: str) -> None:
    """Neither the confirmation page nor the POST is allowed, and the lock stays held."""
    assert client.get(f"{FORCE_RELEASE}?lock=0:1:{name}").status_code == 403
    selection = _selection(distlock(name))
    assert client.post(FORCE_RELEASE, {"lock": selection, "confirm": "yes"}).status_code == 403
    assert HeldLock.objects.filter(name=name).exists()


def test_view_permission_is_read_only(viewer, hold):
    hold.enter_context(distlock("perm", timeout=30))
    index = viewer.get("/admin/").content.decode()
    assert CHANGELIST in index
    changelist = viewer.get(CHANGELIST).content.decode()
    assert _names_on_page(changelist) == ["perm"]
    assert "Force release selected locks" not in changelist
    assert 'name="lock"' not in changelist
    detail = viewer.get(_detail("perm")).content.decode()
    assert "force-release-button" not in detail
    _assert_cannot_force_release(viewer, "perm")


def test_force_release_permission_needs_view_permission_too(hold):
    hold.enter_context(distlock("perm", timeout=30))
    client = logged_in(make_user("blind", "force_release_heldlock"))
    _assert_cannot_force_release(client, "perm")


def test_operator_sees_the_action(operator, hold):
    hold.enter_context(distlock("perm", timeout=30))
    assert "Force release selected locks" in operator.get(CHANGELIST).content.decode()
    assert operator.get(PAGES[2]).status_code == 200


def test_no_add_change_or_delete(admin, hold):
    hold.enter_context(distlock("perm", timeout=30))
    index = admin.get("/admin/").content.decode()
    assert CHANGELIST in index
    assert CHANGELIST + "add/" not in index
    assert admin.get(CHANGELIST + "add/").status_code == 404
    assert admin.get(CHANGELIST + "perm/change/").status_code == 404
    assert admin.get(CHANGELIST + "perm/delete/").status_code == 404
    assert HeldLock.objects.filter(name="perm").exists()


def test_force_release_of_crafted_selections(admin, redis_client):
    for name in ("x" * 600, "nul\x00name"):
        response = admin.post(
            FORCE_RELEASE, {"lock": f"{'0' * 32}:1:{name}", "confirm": "yes"}, follow=True
        )
        assert response.status_code == 200
        [message] = _messages(response)
        assert "was not released" in message
    assert not LogEntry.objects.exists()


# -- kinds: a row per hold ----------------------------------------------------------------


def _holds_of(name: str) -> list[HeldLock]:
    return list(HeldLock.objects.filter(name=name))


def _hold_selection(held: HeldLock) -> str:
    return f"{held.token}:{held.fence}:{held.name}"


def test_changelist_shows_each_hold_with_its_mode(admin, hold):
    hold.enter_context(distlock("kinds:mutex", timeout=30))
    readers = [hold.enter_context(distlock("kinds:shared", shared=True)) for _ in range(2)]
    slots = [hold.enter_context(distlock("kinds:limited", limit=3)) for _ in range(2)]

    html = admin.get(CHANGELIST, {"o": "name"}).content.decode()

    assert _names_on_page(html) == ["kinds:limited"] * 2 + ["kinds:mutex"] + ["kinds:shared"] * 2
    assert "5 holds" in html
    assert html.count('<td class="mode mode-limited">limited 2/3</td>') == 2
    assert html.count('<td class="mode mode-exclusive">exclusive</td>') == 1
    assert html.count('<td class="mode mode-shared">shared</td>') == 2
    for lock in (*readers, *slots):
        assert f'<td class="fence">{lock.fence}</td>' in html
    # Every hold has its own checkbox, carrying its own token.
    for held in _holds_of("kinds:shared") + _holds_of("kinds:limited"):
        assert f'value="{escape(_hold_selection(held))}"' in html


def test_detail_shows_every_hold_with_its_own_force_release(admin, hold):
    readers = [hold.enter_context(distlock("kinds:shared", shared=True)) for _ in range(2)]
    response = admin.get(_detail("kinds:shared"))
    assert response.status_code == 200
    html = response.content.decode()
    assert "Held by 2 holders (shared)." in html
    assert "Hold 1 of 2" in html
    assert "Hold 2 of 2" in html
    assert 'id="heldlock-detail"' in html
    assert 'id="heldlock-detail-2"' in html
    assert 'id="force-release-button"' in html
    assert 'id="force-release-button-2"' in html
    assert html.count("Force release this hold") == 2
    for lock in readers:
        assert f"<code>{lock.token}</code>" in html
        assert f"<td>{lock.fence}</td>" in html
    assert [row.held.token for row in response.context["rows"]] == sorted(
        lock.token for lock in readers
    )
    # A lock with one hold reads as before.
    hold.enter_context(distlock("kinds:limited", limit=3))
    single = admin.get(_detail("kinds:limited")).content.decode()
    assert "Hold 1 of" not in single
    assert '<td class="mode mode-limited">limited 1/3</td>' in single
    assert ">Force release</a>" in single


@override_settings(DISTLOCK={"EVENTS": "sync"})
def test_force_release_of_one_shared_hold_leaves_the_other(operator, redis_client):
    evicted = distlock("kinds:shared", shared=True, timeout=60, raise_on_lost=False)
    kept = distlock("kinds:shared", shared=True, timeout=60)
    assert evicted.acquire()
    assert kept.acquire()
    try:
        detail = operator.get(_detail("kinds:shared"))
        row = next(r for r in detail.context["rows"] if r.held.token == evicted.token)
        confirmation = operator.get(row.force_release_url)
        assert confirmation.status_code == 200
        page = confirmation.content.decode()
        assert "still held" in page
        assert '<td class="mode">shared</td>' in page
        response = operator.post(
            FORCE_RELEASE, {"lock": row.selection, "confirm": "yes"}, follow=True
        )
        assert _messages(response) == [
            f"Force-released a shared hold of lock “kinds:shared” (fence {evicted.fence}); "
            "its other holds are untouched."
        ]
        assert [h.token for h in _holds_of("kinds:shared")] == [kept.token]
        assert kept.owned()
        event = LockEvent.objects.get(kind="force_released")
        assert (event.mode, event.fence) == ("shared", evicted.fence)
        assert LogEntry.objects.get().object_id == "kinds:shared"
        # Confirming the same hold again: it ended, the other hold is not touched.
        again = operator.get(FORCE_RELEASE, {"lock": row.selection}).content.decode()
        assert "this hold ended since you saw it; the lock's other holds" in again
        response = operator.post(
            FORCE_RELEASE, {"lock": row.selection, "confirm": "yes"}, follow=True
        )
        assert "was not released" in _messages(response)[0]
        assert kept.owned()
    finally:
        kept.release()
        _let_go(evicted)


def test_force_release_of_several_holds_at_once(admin, redis_client):
    slots = [distlock("kinds:limited", limit=3, raise_on_lost=False) for _ in range(3)]
    for lock in slots:
        assert lock.acquire()
    try:
        selections = [_hold_selection(held) for held in _holds_of("kinds:limited")[:2]]
        html = admin.get(FORCE_RELEASE, {"lock": selections}).content.decode()
        assert "Force release these 2 locks?" in html
        assert html.count('<td class="mode">limited 3/3</td>') == 2
        response = admin.post(FORCE_RELEASE, {"lock": selections, "confirm": "yes"}, follow=True)
        assert len(_messages(response)) == 2
        left = _holds_of("kinds:limited")
        assert len(left) == 1
        assert left[0].holders == 1
        assert sum(lock.owned() for lock in slots) == 1
    finally:
        _let_go(*slots)


def test_the_force_released_holder_is_told_at_once_who_did_it(admin, admin_user):
    """Its lease is 30 s (a renewal every 10 s): told within a second, by the notice the
    force release publishes, with the admin user named."""
    told = threading.Event()
    lock = distlock("notice:job", timeout=30, on_lost=lambda lock: told.set())
    lock.acquire()
    try:
        assert listening(get_backend(), 10.0)
        changelist = admin.get(CHANGELIST).content.decode()
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', changelist)
        assert csrf is not None
        selection = _selection(lock)
        started = time.monotonic()
        response = admin.post(
            FORCE_RELEASE,
            {"lock": [selection], "confirm": "yes", "csrfmiddlewaretoken": csrf.group(1)},
        )
        assert response.status_code == 302
        assert told.wait(5.0), "the holder was not told"
        assert time.monotonic() - started < 1.0
        assert lock.lost
        assert lock.lost_reason == "it was force-released by user 'root'"
        with pytest.raises(LockLost, match="force-released by user 'root'"):
            lock.release()
        assert LogEntry.objects.get().object_id == "notice:job"  # Recent actions
    finally:
        _let_go(lock)


# -- the lock server down ---------------------------------------------------------------


@pytest.fixture
def lock_server_down(private_redis, settings):
    """``DISTLOCK`` points at a real server that was stopped; yields its address."""
    address = f"127.0.0.1:{private_redis.port}"
    settings.DISTLOCK = {**getattr(settings, "DISTLOCK", {}), "URL": private_redis.url}
    private_redis.stop()
    return address


@pytest.mark.parametrize(
    "url",
    [
        CHANGELIST,
        CHANGELIST + "?q=invoice",
        CHANGELIST + "?o=-ttl&p=2",
        _detail("invoice:42"),
        FORCE_RELEASE + "?" + urlencode({"lock": "token:7:invoice:42"}),
    ],
)
def test_every_held_locks_page_says_the_lock_server_is_down(admin, lock_server_down, url):
    response = admin.get(url)
    assert response.status_code == 503
    html = response.content.decode()
    assert "Lock server unavailable" in html
    assert f"one Redis server, redis://{lock_server_down}" in html
    assert "Connection refused" in html  # the error itself
    assert 'id="user-tools"' in html  # the admin's chrome, not a bare error page
    assert "/admin/django_distlock/lockevent/" in html  # events are still there


def test_force_release_posted_during_an_outage_says_so(admin, lock_server_down):
    page = admin.get("/admin/").content.decode()
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    response = admin.post(
        FORCE_RELEASE,
        {
            "lock": ["token:7:invoice:42"],
            "confirm": "yes",
            "csrfmiddlewaretoken": csrf.group(1) if csrf else "",
        },
    )
    assert response.status_code == 503
    assert "Lock server unavailable" in response.content.decode()
    assert not LogEntry.objects.exists()


def test_lock_events_keep_working_during_an_outage(admin, lock_server_down):
    response = admin.get("/admin/django_distlock/lockevent/")
    assert response.status_code == 200
