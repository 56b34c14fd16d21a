"""The admin in real headless Chromium (Debian's ``/usr/bin/chromium`` via Playwright).

Screenshots go to ``test-artifacts/`` at the repository root.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest
from django.urls import reverse
from playwright.sync_api import Page, expect

from django_distlock import distlock
from tests.support.browser import (  # noqa: F401 (fixtures)
    ADMIN_USERNAME,
    ARTIFACTS,
    admin_page_fixture,
    admin_user_fixture,
    browser_context_fixture,
    browser_fixture,
    is_png,
    lock_holder_fixture,
    page_fixture,
    playwright_instance_fixture,
    save_screenshot,
)


def test_login_through_the_admin_form_in_chromium(admin_page: Page, live_server: Any) -> None:
    """The browser logs in through the real login form and lands on the admin index."""
    assert admin_page.url == f"{live_server.url}/admin/"
    assert admin_page.locator("#user-tools").inner_text().upper().startswith("WELCOME")
    path = save_screenshot(admin_page, "admin-index.png")
    assert is_png(path)


def test_lock_holder_subprocess_holds_the_lock(lock_holder: Any, redis_client: Any) -> None:
    """The other-process holder really holds the lock, without renewal (its TTL is
    below the lease)."""
    from django_distlock.models import HeldLock

    holder = lock_holder("browser:probe", timeout=60)
    held = HeldLock.objects.get(name="browser:probe")
    assert held.pid == holder.process.pid
    assert 0 < held.ttl <= 60


LOCK_NAME = "browser:invoice:42"


def heldlocks_url(live_server: Any) -> str:
    """The held-locks changelist on the live server."""
    return f"{live_server.url}{reverse('admin:django_distlock_heldlock_changelist')}"


def lockevents_url(live_server: Any) -> str:
    """The lock-events changelist on the live server."""
    return f"{live_server.url}{reverse('admin:django_distlock_lockevent_changelist')}"


def ttl_seconds(page: Page) -> int:
    """The TTL cell of the lock's row, as the page's countdown shows it (``"117s"``)."""
    row = page.locator("#heldlocks tbody tr", has_text=LOCK_NAME)
    text = row.locator("td.ttl").inner_text()
    assert text.endswith("s"), text
    return int(text.removesuffix("s"))


def ttl_countdown(page: Page) -> tuple[int, int]:
    """The TTL cell read twice, 1.5 s apart, with no auto-refresh in between (a marker on
    ``window`` proves the page was not reloaded, so the decrease is the page's own
    countdown, not a fresher server value); retried when a reload fell in between."""
    for _attempt in range(3):
        page.evaluate("window.__distlockCountdown = true")
        first = ttl_seconds(page)
        page.wait_for_timeout(1500)
        second = ttl_seconds(page)
        if page.evaluate("window.__distlockCountdown === true"):
            return first, second
        page.wait_for_load_state()
    raise AssertionError("the page reloaded during every countdown measurement")


def test_force_release_a_lock_held_by_another_process(
    admin_page: Page, live_server: Any, lock_holder: Any, settings: Any
) -> None:
    """The whole operator story: a lock held by another process shows up, its TTL counts
    down in the page, its detail page shows it, force release goes through the
    confirmation page, the lock is gone and the event is in the history."""
    from django_distlock.models import HeldLock, LockEvent

    settings.DISTLOCK = {"EVENTS": "sync"}  # global: the live server thread sees it too
    holder = lock_holder(LOCK_NAME, timeout=120, context="browser-context")
    page = admin_page

    # It appears on the held-locks page, with its owner process.
    page.goto(heldlocks_url(live_server))
    row = page.locator("#heldlocks tbody tr", has_text=LOCK_NAME)
    expect(row).to_have_count(1)
    expect(row.locator("td.owner")).to_contain_text(str(holder.process.pid))
    expect(row.locator("td.context")).to_have_text("browser-context")
    expect(row.locator("td.fence")).to_have_text(str(holder.fence))

    # Its TTL counts down in the page itself (no renewal: the holder has auto-renew off).
    first, second = ttl_countdown(page)
    assert 100 < first <= 120
    assert second < first
    path = save_screenshot(page, "admin-heldlocks.png")
    assert is_png(path)

    # Its detail page.
    with page.expect_navigation():
        row.locator("th.lock-name a").click()
    expect(page.locator("h1.lock-name")).to_have_text(LOCK_NAME)
    detail = page.locator("#heldlock-detail")
    expect(detail).to_contain_text(str(holder.process.pid))
    expect(detail).to_contain_text("browser-context")
    token = HeldLock.objects.get(name=LOCK_NAME).token
    expect(detail.locator("code")).to_have_text(token)

    # Force release: the button leads to a confirmation page (GET changes nothing)...
    with page.expect_navigation():
        page.click("#force-release-button")
    expect(page.locator("#force-release-list")).to_contain_text(LOCK_NAME)
    expect(page.locator("#force-release-list td.lock-state")).to_have_text("still held")
    assert HeldLock.objects.filter(name=LOCK_NAME).exists()
    # ... and confirming POSTs the release.
    with page.expect_navigation():
        page.click("#confirm-force-release")
    assert page.url.startswith(heldlocks_url(live_server))
    success = page.locator("ul.messagelist li.success")
    expect(success).to_contain_text(f"Force-released lock “{LOCK_NAME}”")
    expect(page.locator("#heldlocks tbody tr", has_text=LOCK_NAME)).to_have_count(0)
    expect(page.locator("#heldlocks tbody")).to_contain_text("No lock is held.")
    assert not HeldLock.objects.filter(name=LOCK_NAME).exists()

    # The history shows the force_released event, with the operator.
    event = LockEvent.objects.get(name=LOCK_NAME, kind=LockEvent.Kind.FORCE_RELEASED)
    assert event.user is not None
    assert event.user.username == ADMIN_USERNAME
    page.goto(lockevents_url(live_server))
    event_row = page.locator("#result_list tbody tr", has_text=LOCK_NAME)
    expect(event_row).to_have_count(1)
    expect(event_row.locator("td.field-happened")).to_contain_text("force released")
    expect(event_row.locator("td.field-happened .by")).to_have_text(f"by {ADMIN_USERNAME}")
    expect(page.locator("#distlock-events-summary svg")).to_have_count(1)
    path = save_screenshot(page, "admin-lockevents.png")
    assert is_png(path)


def test_auto_refresh_reloads_the_page_until_paused(
    admin_page: Page, live_server: Any, lock_holder: Any
) -> None:
    """The held-locks page reloads itself every 5 s; paused, it stays put (a marker set
    on ``window`` survives past the interval), and the pause sticks across reloads."""
    lock_holder(LOCK_NAME, timeout=120)
    page = admin_page
    page.goto(heldlocks_url(live_server))
    expect(page.locator("#refresh-state")).to_have_text("Refreshing every 5 seconds.")

    # Running: the marker is wiped by the automatic reload.
    page.evaluate("window.__distlockMarker = 'still here'")
    page.wait_for_function("window.__distlockMarker === undefined", timeout=8000)

    # Paused: no reload for well past the interval.
    page.click("#toggle-refresh")
    expect(page.locator("#refresh-state")).to_have_text("Auto-refresh paused.")
    expect(page.locator("#toggle-refresh")).to_have_text("Resume auto-refresh")
    page.evaluate("window.__distlockMarker = 'still here'")
    first = ttl_seconds(page)
    page.wait_for_timeout(5500)  # the reload timer (every 5 s) has fired at least once
    assert page.evaluate("window.__distlockMarker") == "still here"
    # The countdown keeps running while paused.
    assert ttl_seconds(page) <= first - 4

    # The pause is remembered across a (manual) reload.
    page.reload()
    expect(page.locator("#refresh-state")).to_have_text("Auto-refresh paused.")
    page.evaluate("window.__distlockMarker = 'still here'")

    # Resumed: reloads again.
    page.click("#toggle-refresh")
    expect(page.locator("#refresh-state")).to_have_text("Refreshing every 5 seconds.")
    page.wait_for_function("window.__distlockMarker === undefined", timeout=8000)


HOSTILE_NAME = '<img src=x onerror="window.__distlockXss=1;alert(1)">*[a-z]?'


def test_hostile_lock_name_is_shown_as_text_never_run(
    admin_page: Page, live_server: Any, lock_holder: Any
) -> None:
    """A lock name made of HTML and glob characters is displayed literally on the
    changelist, in the search and on the detail page; its script never runs."""
    dialogs: list[str] = []
    admin_page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    lock_holder(HOSTILE_NAME, timeout=120)
    lock_holder("browser:innocent", timeout=120)
    page = admin_page
    page.goto(heldlocks_url(live_server))
    expect(page.locator("#heldlocks th.lock-name a", has_text=HOSTILE_NAME)).to_have_count(1)
    assert page.locator("#heldlocks img[src=x]").count() == 0

    # Searching for the glob/HTML characters matches them literally.
    page.fill("#searchbar", "*[a-z]?")
    with page.expect_navigation():
        page.press("#searchbar", "Enter")
    expect(page.locator("#heldlocks tbody tr")).to_have_count(1)
    expect(page.locator("#heldlocks th.lock-name")).to_have_text(HOSTILE_NAME)

    with page.expect_navigation():
        page.locator("#heldlocks th.lock-name a").click()
    expect(page.locator("h1.lock-name")).to_have_text(HOSTILE_NAME)
    page.wait_for_timeout(300)
    assert page.evaluate("window.__distlockXss") is None
    assert page.locator("img[src=x]").count() == 0
    assert dialogs == []


def test_a_renewing_lock_counts_down_the_way_its_watchdog_renews(
    admin_page: Page, live_server: Any, redis_client: Any
) -> None:
    """An auto-renewed lock's TTL follows its watchdog (a renewal at every third of the
    lease) between page loads: with a 3 s lease it stays between 2 and 3 s and is never
    shown as expiring, where a plain countdown would reach a red "0s"."""
    page = admin_page
    with distlock("browser:renewing", timeout=3, auto_renew=True) as lock:
        page.goto(heldlocks_url(live_server))
        page.click("#toggle-refresh")  # paused: only the page's own countdown runs
        try:
            cell = page.locator("#heldlocks tbody tr", has_text="browser:renewing").locator(
                "td.ttl"
            )
            shown = []
            for _second in range(5):
                page.wait_for_timeout(1000)
                shown.append(int(cell.inner_text().removesuffix("s")))
                assert "expiring" not in (cell.get_attribute("class") or "")
            assert min(shown) >= 2, shown
            assert not lock.lost
        finally:
            page.click("#toggle-refresh")
    expect(page.locator("#refresh-state")).to_have_text("Refreshing every 5 seconds.")


def test_each_kind_of_lock_and_force_release_of_one_shared_hold(
    admin_page: Page, live_server: Any, lock_holder: Any, settings: Any
) -> None:
    """One exclusive lock, one shared lock with two holders and one limited lock (limit 3)
    with two holders, each holder another process: the page shows a row per hold with
    its mode, the shared lock's detail page shows both holds, and force-releasing one
    shared hold leaves the other holder's."""
    from django_distlock.models import HeldLock, LockEvent

    settings.DISTLOCK = {"EVENTS": "sync"}
    mutex = lock_holder("browser:mutex", context="kinds")
    readers = [
        lock_holder("browser:shared", context="kinds", kind={"shared": True}) for _ in range(2)
    ]
    slots = [lock_holder("browser:limited", context="kinds", kind={"limit": 3}) for _ in range(2)]
    page = admin_page

    page.goto(heldlocks_url(live_server) + "?o=name")
    rows = page.locator("#heldlocks tbody tr")
    expect(rows).to_have_count(5)
    expect(page.locator(".paginator-summary")).to_contain_text("5 holds")
    expect(rows.locator("th.lock-name")).to_have_text(
        ["browser:limited", "browser:limited", "browser:mutex", "browser:shared", "browser:shared"]
    )
    expect(rows.locator("td.mode")).to_have_text(
        ["limited 2/3", "limited 2/3", "exclusive", "shared", "shared"]
    )
    # Each row is its holder's: its own process and fence.
    for holder in (mutex, *readers, *slots):
        row = page.locator(
            "#heldlocks tbody tr", has=page.locator(f"td.fence:text-is('{holder.fence}')")
        )
        expect(row).to_have_count(1)
        expect(row.locator("td.owner")).to_contain_text(f":{holder.process.pid} ")
    assert is_png(save_screenshot(page, "admin-heldlocks-kinds.png"))

    # The shared lock's detail page: both holds, each with its own force release.
    with page.expect_navigation():
        page.locator("#heldlocks th.lock-name a", has_text="browser:shared").first.click()
    expect(page.locator("#holds-summary")).to_have_text("Held by 2 holders (shared).")
    expect(page.locator("h2.hold-title")).to_have_text(["Hold 1 of 2", "Hold 2 of 2"])
    expect(page.locator("table.heldlock-detail")).to_have_count(2)
    expect(page.locator("a.danger-button")).to_have_count(2)
    assert is_png(save_screenshot(page, "admin-heldlock-shared-detail.png"))

    # Force release the hold of the first reader: pick its button by its fence.
    evicted, kept = readers
    tables = page.locator("table.heldlock-detail")
    index = 0 if str(evicted.fence) in tables.nth(0).inner_text() else 1
    button_id = "#force-release-button" if index == 0 else "#force-release-button-2"
    with page.expect_navigation():
        page.click(button_id)
    confirmation = page.locator("#force-release-list")
    expect(confirmation).to_contain_text(str(evicted.fence))
    expect(confirmation.locator("td.mode")).to_have_text("shared")
    expect(confirmation.locator("td.lock-state")).to_have_text("still held")
    with page.expect_navigation():
        page.click("#confirm-force-release")
    expect(page.locator("ul.messagelist li.success")).to_contain_text(
        "Force-released a shared hold of lock “browser:shared”"
    )
    shared_rows = page.locator("#heldlocks tbody tr", has_text="browser:shared")
    expect(shared_rows).to_have_count(1)
    expect(shared_rows.locator("td.fence")).to_have_text(str(kept.fence))
    expect(page.locator("#heldlocks tbody tr")).to_have_count(4)
    assert [held.fence for held in HeldLock.objects.filter(name="browser:shared")] == [kept.fence]
    assert is_png(save_screenshot(page, "admin-heldlocks-kinds-after-release.png"))

    # The history has the force release, as a shared hold.
    event = LockEvent.objects.get(name="browser:shared", kind=LockEvent.Kind.FORCE_RELEASED)
    assert (event.mode, event.fence) == ("shared", evicted.fence)
    page.goto(lockevents_url(live_server))
    event_row = page.locator("#result_list tbody tr", has_text="browser:shared")
    expect(event_row.locator("td.field-lock .mode")).to_have_text("shared")


# -- what an operator sees at 1280x900 -----------------------------------------------------

OPERATOR_VIEWPORT = {"width": 1280, "height": 900}
LONG_CONTEXT = "celery:billing.tasks.render_invoice_pdf[8c4b7a1e-1f2d-4c3b-9a8e-5d6f7a8b9c0d]"


def operator_events(user: Any) -> Any:
    """A page's worth of realistic events (long host, thread and context labels, every
    kind, a force release by ``user``); returns the ``released`` one, held 29981.065 ms."""
    import datetime as dt

    from django.utils import timezone

    from django_distlock.models import LockEvent

    now = timezone.now()
    kinds = ["acquired", "released", "contended", "force_released", "lost"]
    LockEvent.objects.bulk_create(
        LockEvent(
            name=f"invoice:{1000 + i}:pdf-render",
            kind=kinds[i % 5],
            fence=1_795_654_505_819_153 + i,
            host="web-worker-7.prod.example.internal",
            pid=40_000 + i,
            thread=f"Thread-{i} (process_request_thread)",
            context=LONG_CONTEXT,
            user=user if kinds[i % 5] == "force_released" else None,
            waited_ms=1234.56789 * (i + 1) if kinds[i % 5] == "acquired" else None,
            held_ms=29981.06513600004 if kinds[i % 5] == "released" else None,
            at=now - dt.timedelta(minutes=3 * i),
        )
        for i in range(20)
    )
    return LockEvent.objects.filter(kind="released").order_by("-at").first()


def test_the_events_changelist_fits_1280_pixels(
    admin_page: Page, live_server: Any, admin_user: Any
) -> None:
    """Every column is on screen at 1280x900, with long labels: nothing needs a
    horizontal scroll (the admin's results box scrolls instead of growing the page)."""
    operator_events(admin_user)
    page = admin_page
    page.set_viewport_size(OPERATOR_VIEWPORT)
    page.goto(lockevents_url(live_server))
    expect(page.locator("#result_list tbody tr")).to_have_count(20)
    box = page.evaluate(
        """() => {
            const results = document.querySelector('#changelist .results');
            return {scroll: results.scrollWidth, client: results.clientWidth,
                    page: document.documentElement.scrollWidth, viewport: innerWidth};
        }"""
    )
    assert box["scroll"] <= box["client"], box
    assert box["page"] <= box["viewport"], box
    for header in ("when", "happened", "lock", "duration", "holder"):
        cell = page.locator(f"#result_list thead th.column-{header}")
        right = cell.evaluate("th => th.getBoundingClientRect().right")
        assert right <= box["viewport"], (header, right)
    assert is_png(save_screenshot(page, "admin-lockevents-1280.png"))


def text_box(page: Page, selector: str) -> list[dict[str, float]]:
    """The box of the text (not the cell) of each element ``selector`` matches."""
    return page.evaluate(
        """selector => [...document.querySelectorAll(selector)].map(element => {
            const range = document.createRange();
            range.selectNodeContents(element);
            const box = range.getBoundingClientRect();
            return {left: box.left, right: box.right, lines: range.getClientRects().length};
        })""",
        selector,
    )


def test_the_chart_text_is_readable_and_the_percentiles_line_up(
    admin_page: Page, live_server: Any, admin_user: Any
) -> None:
    """At 1280x900 the chart's labels are drawn at 11 px or more (the SVG is scaled to
    fit: its font size times that scale), and each header of the percentile table is
    above its own column's values."""
    operator_events(admin_user)
    page = admin_page
    page.set_viewport_size(OPERATOR_VIEWPORT)
    page.goto(lockevents_url(live_server))
    sizes = page.evaluate(
        """() => [...document.querySelectorAll('#distlock-events-summary svg text')].map(
            text => parseFloat(getComputedStyle(text).fontSize) * text.getScreenCTM().a)"""
    )
    assert len(sizes) >= 5
    assert min(sizes) >= 11, sizes
    headers = text_box(page, "#distlock-percentiles thead th")
    for row in (1, 2):
        cells = text_box(page, f"#distlock-percentiles tbody tr:nth-child({row}) > *")
        assert len(cells) == len(headers)
        for header, cell in zip(headers, cells, strict=True):
            assert header["left"] < cell["right"], (header, cell)
            assert cell["left"] < header["right"], (header, cell)
    assert is_png(save_screenshot(page, "admin-lockevents-chart-1280.png"))


def test_the_event_detail_page_reads_like_the_list(
    admin_page: Page, live_server: Any, admin_user: Any
) -> None:
    """The detail page of an event shows its time as the list does, and its durations
    rounded and in human units, not ``29981.06513600004``."""
    released = operator_events(admin_user)
    page = admin_page
    page.set_viewport_size(OPERATOR_VIEWPORT)
    page.goto(lockevents_url(live_server) + f"?kind=released&name={released.name}")
    listed = page.locator("#result_list tbody tr").first
    listed_at = listed.locator(".field-when").inner_text()
    listed_held = listed.locator(".field-duration").inner_text()
    with page.expect_navigation():
        listed.locator(".field-when a").click()
    fields = page.locator("#content-main fieldset")
    expect(fields.locator(".field-when .readonly")).to_have_text(listed_at)
    expect(fields.locator(".field-hold_time .readonly")).to_have_text("30s (29,981 ms)")
    assert listed_held == "held 30s"
    assert "29981.06" not in page.content()
    assert is_png(save_screenshot(page, "admin-lockevent-detail-1280.png"))


def test_force_release_of_a_lock_that_expired_offers_nothing_to_confirm(
    admin_page: Page, live_server: Any, lock_holder: Any
) -> None:
    """The confirmation page of a lock whose lease ran out meanwhile says there is nothing
    to release and offers no "Yes, force release"; its table is as wide as it needs, no
    header or name broken across lines."""
    from django_distlock.models import HeldLock

    lock_holder("browser:expiring", timeout=1)
    held = HeldLock.objects.get(name="browser:expiring")
    page = admin_page
    page.set_viewport_size(OPERATOR_VIEWPORT)
    url = reverse("admin:django_distlock_heldlock_force_release")
    page.wait_for_timeout(1500)  # the lease (1 s, not renewed) runs out
    page.goto(f"{live_server.url}{url}?lock={held.token}:{held.fence}:{held.name}")
    expect(page.locator("#force-release-list td.lock-state")).to_have_text(
        "no longer held: nothing to release"
    )
    expect(page.locator("#confirm-force-release")).to_have_count(0)
    expect(page.locator("a.back-to-held-locks")).to_have_attribute(
        "href", reverse("admin:django_distlock_heldlock_changelist")
    )
    for cell in text_box(page, "#force-release-list thead th, #force-release-list tbody th"):
        assert cell["lines"] == 1, cell
    assert is_png(save_screenshot(page, "admin-force-release-expired-1280.png"))


# -- every page at 800 and 1280 px (issue 28) --------------------------------------------

WIDTHS = (800, 1280)


def page_box(page: Page) -> dict[str, float]:
    """How wide the page is against the window: it must never scroll sideways."""
    return page.evaluate(
        "() => ({page: document.documentElement.scrollWidth, viewport: innerWidth})"
    )


def scrolls_itself(page: Page, selector: str) -> bool:
    """Whether ``selector``'s box scrolls sideways by itself (as stock Django's
    changelist results do) instead of widening the page."""
    return page.evaluate(
        """selector => {
            const box = document.querySelector(selector);
            return ['auto', 'scroll'].includes(getComputedStyle(box).overflowX)
                && box.getBoundingClientRect().right <= innerWidth + 0.5;
        }""",
        selector,
    )


def hold_wide_locks(hold: Any) -> list[Any]:
    """Three locks with long names and contexts (the columns the table is widest by)."""
    return [
        hold.enter_context(
            distlock(f"invoice:{n}:pdf-render", context=LONG_CONTEXT, timeout=300, auto_renew=False)
        )
        for n in (1001, 1002, 1003)
    ]


@pytest.mark.parametrize("width", WIDTHS)
def test_held_locks_pages_fit_the_window(
    admin_page: Page, live_server: Any, admin_user: Any, hold: Any, width: int
) -> None:
    """The list and a lock's page at 800 and 1280 px: the page never scrolls sideways
    (the tables scroll in their own box); the detail page's times have no microseconds,
    each date and time stays on one line, its events show human kinds and "PID", and its
    force-release button looks like a button."""
    from django.utils import timezone

    from django_distlock.models import LockEvent

    hold_wide_locks(hold)
    name = "invoice:1001:pdf-render"
    LockEvent.objects.bulk_create(
        LockEvent(
            name=name,
            kind=kind,
            fence=1_795_654_505_819_153,
            host="web-worker-7.prod.example.internal",
            pid=40_000,
            thread="Thread-3 (process_request_thread)",
            context=LONG_CONTEXT,
            user=admin_user if kind == "force_released" else None,
            at=timezone.now(),
        )
        for kind in ("acquired", "force_released", "lost")
    )
    page = admin_page
    page.set_viewport_size({"width": width, "height": 900})

    page.goto(heldlocks_url(live_server))
    expect(page.locator("#heldlocks tbody tr")).to_have_count(3)
    assert is_png(save_screenshot(page, f"admin-heldlocks-{width}.png"))
    box = page_box(page)
    assert box["page"] <= box["viewport"], box
    assert scrolls_itself(page, "#heldlocks-results")
    assert "Owner (host, PID, thread)" in (page.locator("#heldlocks thead").text_content() or "")
    if width >= OPERATOR_VIEWPORT["width"]:
        # Every column is on screen beside a long context, which is cut short and shown
        # whole on hover: the TTL the page is ordered by too.
        cells = page.locator("#heldlocks thead th, #heldlocks td.ttl").all()
        assert len(cells) == 9 + 3
        shown = page.evaluate(
            "() => document.getElementById('heldlocks-results').getBoundingClientRect().right"
        )
        for cell in cells:
            right = cell.evaluate("cell => cell.getBoundingClientRect().right")
            assert right <= shown, (cell.text_content(), right, shown)
        contexts = page.locator("#heldlocks td.context")
        assert contexts.first.get_attribute("title") == LONG_CONTEXT

    page.goto(f"{live_server.url}{reverse('admin:django_distlock_heldlock_detail')}?name={name}")
    assert is_png(save_screenshot(page, f"admin-heldlock-detail-{width}.png"))
    box = page_box(page)
    assert box["page"] <= box["viewport"], box
    assert scrolls_itself(page, "#recent-events-results")
    acquired = page.locator("#heldlock-detail td.acquired-at").inner_text()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+", acquired), acquired
    for cell in text_box(page, "#recent-events td.at .date, #recent-events td.at .time"):
        assert cell["lines"] == 1, cell
    text = page.locator("#content-main").inner_text()
    assert "force_released" not in text
    assert "force released" in text
    assert page.locator("#heldlock-detail th", has_text="PID").count() == 1
    assert "Pid" not in text
    button = page.evaluate(
        """() => {
            const style = getComputedStyle(document.getElementById('force-release-button'));
            return {background: style.backgroundColor, padding: parseFloat(style.paddingLeft),
                    radius: parseFloat(style.borderTopLeftRadius), display: style.display};
        }"""
    )
    assert button["background"] not in ("rgba(0, 0, 0, 0)", "transparent"), button
    assert button["padding"] >= 6, button
    assert button["radius"] > 0, button
    assert button["display"] in ("inline-block", "block", "inline-flex", "flex"), button

    # An event's own page: its title says the kind as people read it, and "PID".
    event = LockEvent.objects.get(name=name, kind="force_released")
    page.goto(
        f"{live_server.url}{reverse('admin:django_distlock_lockevent_change', args=[event.pk])}"
    )
    assert "force_released" not in page.title()
    assert "force released" in page.locator("#content").inner_text()
    assert "force_released" not in page.locator("#content").inner_text()
    expect(page.locator(".field-process_id label")).to_have_text("PID:")
    assert is_png(save_screenshot(page, f"admin-lockevent-force-released-{width}.png"))


@pytest.mark.parametrize("width", WIDTHS)
def test_the_events_chart_reads_well(
    admin_page: Page, live_server: Any, admin_user: Any, width: int
) -> None:
    """The x-axis labels never overlap (at 1280 px, at every bucket count that showed
    it), and at 800 px (a column of about 230 px beside both sidebars) the chart keeps
    520 px or more, its legend drawn at 11 px or more, scrolling in its own box rather
    than the page."""
    import datetime as dt

    from django.utils import timezone

    from django_distlock.models import LockEvent

    page = admin_page
    page.set_viewport_size({"width": width, "height": 900})
    now = timezone.now().replace(minute=30)
    for buckets in (2, 3, 5, 24):
        LockEvent.objects.all().delete()
        LockEvent.objects.bulk_create(
            LockEvent(name="chart", kind=kind, at=now - dt.timedelta(hours=hour))
            for hour in range(buckets)
            for kind in ("acquired", "released", "force_released", "lost", "contended")
        )
        page.goto(lockevents_url(live_server))
        ticks = page.evaluate(
            """() => [...document.querySelectorAll('#distlock-events-summary svg text.tick')]
                .map(text => { const box = text.getBoundingClientRect();
                    return {left: box.left, right: box.right, text: text.textContent}; })"""
        )
        assert len(ticks) >= 2, (buckets, ticks)
        for before, after in itertools.pairwise(ticks):
            assert before["right"] + 4 <= after["left"], (buckets, before, after)
    chart = page.evaluate(
        """() => {
            const svg = document.querySelector('#distlock-events-summary svg');
            const legend = [...svg.querySelectorAll('g.legend text')].map(
                text => parseFloat(getComputedStyle(text).fontSize) * text.getScreenCTM().a);
            return {width: svg.getBoundingClientRect().width, legend: Math.min(...legend)};
        }"""
    )
    summary = ARTIFACTS / f"admin-lockevents-chart-{width}-summary.png"
    page.locator("#distlock-events-summary").screenshot(path=str(summary))
    assert is_png(summary)
    assert chart["width"] >= 520, chart
    assert scrolls_itself(page, "#distlock-events-summary")
    assert chart["legend"] >= 11, chart
    box = page_box(page)
    assert box["page"] <= box["viewport"], box
    assert is_png(save_screenshot(page, f"admin-lockevents-chart-{width}.png"))


def test_an_empty_list_has_no_select_all_box(admin_page: Page, live_server: Any) -> None:
    page = admin_page
    page.goto(heldlocks_url(live_server))
    expect(page.locator("#heldlocks tbody")).to_contain_text("No lock is held.")
    expect(page.locator("#select-all")).to_have_count(0)


@pytest.mark.parametrize("width", WIDTHS)
def test_the_outage_page_in_the_browser(
    admin_page: Page, live_server: Any, private_redis: Any, settings: Any, width: int
) -> None:
    """The lock server stopped: the held-locks page is the admin's, saying so, at 503."""
    settings.DISTLOCK = {"URL": private_redis.url}
    private_redis.stop()
    page = admin_page
    page.set_viewport_size({"width": width, "height": 900})
    response = page.goto(heldlocks_url(live_server))
    assert response is not None
    assert response.status == 503
    expect(page.locator("#lock-server-unavailable")).to_contain_text(
        f"one Redis server, redis://127.0.0.1:{private_redis.port}"
    )
    expect(page.locator("#user-tools")).to_be_visible()
    box = page_box(page)
    assert box["page"] <= box["viewport"], box
    assert is_png(save_screenshot(page, f"admin-heldlocks-outage-{width}.png"))
