"""The lock-events admin: a read-only changelist with filters, search, date hierarchy,
and a server-rendered chart (events per bucket by kind, wait/hold percentiles) of the
current filter (the chart's pure functions: ``tests/admin/test_chart.py``)."""

from __future__ import annotations

import datetime as dt
import time
from urllib.parse import urlencode

import pytest
from django.urls import reverse
from django.utils import timezone

from django_distlock.admin.events import LockEventAdmin
from django_distlock.engine.keys import MAX_NAME_LENGTH
from django_distlock.models import LockEvent
from tests.support.admin import bars, legend, make_user

UTC = dt.UTC
T0 = dt.datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
CHANGELIST = "admin:django_distlock_lockevent_changelist"


def changelist_url(**params: object) -> str:
    url = reverse(CHANGELIST)
    return f"{url}?{urlencode(params)}" if params else url


def event(**fields: object) -> LockEvent:
    values: dict[str, object] = {
        "name": "job",
        "kind": LockEvent.Kind.ACQUIRED,
        "fence": 1,
        "host": "web-1",
        "pid": 100,
        "thread": "MainThread",
        "context": "web",
        "at": T0,
    }
    values.update(fields)
    return LockEvent.objects.create(**values)


def result_names(response) -> list[str]:
    return [obj.name for obj in response.context["cl"].result_list]


# -- the changelist -----------------------------------------------------------------------


@pytest.mark.django_db
class TestChangelistChart:
    def test_chart_and_percentiles_for_all_events(self, viewer):
        for i in range(10):
            event(kind="acquired", waited_ms=float(i + 1), at=T0 + dt.timedelta(minutes=i))
        event(kind="released", held_ms=500.0, at=T0 + dt.timedelta(minutes=3))
        event(kind="lost", at=T0 + dt.timedelta(minutes=5))
        response = viewer.get(changelist_url())
        assert response.status_code == 200
        content = response.content.decode()
        assert (
            '<svg xmlns="http://www.w3.org/2000/svg" class="distlock-chart" role="img"' in content
        )
        assert legend(content) == ["acquired", "released", "lost"]
        assert sorted(bars(content)) == sorted(["acquired"] * 10 + ["released", "lost"])
        assert response.context["event_chart"].granularity == "minute"
        assert response.context["event_chart"].total == 12
        waited, held = response.context["event_percentiles"]
        assert waited["values"] == ["5.5ms", "9.1ms", "9.9ms"]
        assert waited["count"] == 10
        assert held["values"] == ["500ms", "500ms", "500ms"]
        assert 'id="distlock-percentiles"' in content
        assert "<td>5.5ms</td>" in content

    def test_chart_follows_the_kind_filter(self, viewer):
        for i in range(4):
            event(kind="acquired", waited_ms=10.0 * (i + 1), at=T0 + dt.timedelta(minutes=i))
        event(kind="contended", waited_ms=1000.0, at=T0)
        event(kind="released", held_ms=7.0, at=T0 + dt.timedelta(minutes=1))
        everything = viewer.get(changelist_url()).content.decode()
        assert legend(everything) == ["acquired", "released", "contended"]
        response = viewer.get(changelist_url(kind__exact="acquired"))
        content = response.content.decode()
        assert legend(content) == ["acquired"]
        assert bars(content) == ["acquired"] * 4
        assert "acquired (4)" in content
        waited, held = response.context["event_percentiles"]
        assert waited["values"] == ["25ms", "37ms", "40ms"]
        assert held["count"] == 0
        assert held["values"] == ["-", "-", "-"]

    def test_no_events(self, viewer):
        response = viewer.get(changelist_url())
        content = response.content.decode()
        assert response.status_code == 200
        assert "No events" in content
        assert 'aria-label="Lock events per minute by kind: no events"' in content

    def test_buckets_follow_the_span(self, viewer):
        event(at=T0)
        event(at=T0 + dt.timedelta(days=5))
        response = viewer.get(changelist_url())
        data = response.context["event_chart"]
        assert data.granularity == "day"
        assert len(data.buckets) == 6
        assert [b.total for b in data.buckets] == [1, 0, 0, 0, 0, 1]

    def test_percentiles_read_a_capped_sample(self, viewer, monkeypatch):
        from django_distlock.admin import events as distlock_admin

        monkeypatch.setattr(distlock_admin, "PERCENTILE_SAMPLE", 3)
        for i in range(6):  # the most recent three are 1, 2, 3 ms
            event(waited_ms=float(6 - i), at=T0 + dt.timedelta(seconds=i))
        response = viewer.get(changelist_url())
        waited, _held = response.context["event_percentiles"]
        assert waited["count"] == 3
        assert waited["values"][0] == "2.0ms"


@pytest.mark.django_db
class TestFiltersAndSearch:
    def test_kind_filter(self, viewer):
        event(name="a", kind="acquired")
        event(name="b", kind="lost")
        response = viewer.get(changelist_url(kind__exact="lost"))
        assert result_names(response) == ["b"]

    def test_date_filter(self, viewer):
        event(name="old", at=T0 - dt.timedelta(days=2))
        event(name="new", at=T0)
        response = viewer.get(
            changelist_url(at__gte="2026-11-20 00:00:00+00:00", at__lt="2026-11-21 00:00:00+00:00")
        )
        assert result_names(response) == ["new"]
        assert response.context["event_chart"].total == 1

    def test_context_filter(self, viewer):
        event(name="w", context="web")
        event(name="c", context="command:sync")
        response = viewer.get(changelist_url(context="command:sync"))
        assert result_names(response) == ["c"]
        assert "command:sync" in response.content.decode()  # offered in the sidebar

    def test_name_filter_is_exact(self, viewer):
        event(name="report")
        event(name="report:daily")
        event(name="Report")
        response = viewer.get(changelist_url(name="report"))
        assert response.status_code == 200
        assert result_names(response) == ["report"]
        assert response.context["event_chart"].total == 1

    def test_name_filter_link_from_held_lock_page(self, viewer):
        name = "tenant:42/job?x=1&y=<b>"
        event(name=name)
        event(name="other")
        url = reverse(CHANGELIST) + "?" + urlencode({"name": name})
        response = viewer.get(url)
        assert result_names(response) == [name]
        content = response.content.decode()
        assert "<b>" not in content.split('id="changelist-filter"', 1)[1]
        assert "&lt;b&gt;" in content

    def test_search_by_name_and_host(self, viewer):
        event(name="alpha", host="db-1")
        event(name="beta", host="web-7")
        assert result_names(viewer.get(changelist_url(q="lph"))) == ["alpha"]
        assert result_names(viewer.get(changelist_url(q="web-7"))) == ["beta"]

    @pytest.mark.parametrize(
        ("query", "expected"),
        [
            ("%", ["a%b"]),
            ("_", ["a_b"]),
            ("*", ["a*b"]),
            ("[b]", ["a[b]"]),
            ("a.b", ["a.b"]),
            ("?", ["a?b"]),
        ],
    )
    def test_search_pattern_characters_are_literal(self, viewer, query, expected):
        names = ["a%b", "a_b", "a*b", "a[b]", "a.b", "a?b", "axb", "ab"]
        for i, name in enumerate(names):
            event(name=name, at=T0 + dt.timedelta(seconds=i))
        response = viewer.get(changelist_url(q=query))
        assert result_names(response) == expected
        assert response.context["event_chart"].total == len(expected)

    def test_html_in_names_is_escaped(self, viewer):
        hostile = '<script>alert("pwned")</script><img src=x onerror=alert(1)>'
        event(name=hostile, host="<i>h</i>", thread="<u>t</u>", context="<s>c</s>")
        content = viewer.get(changelist_url()).content.decode()
        assert "<script>alert" not in content
        assert "<img src=x" not in content
        assert "<i>h</i>" not in content
        assert "&lt;script&gt;alert(&quot;pwned&quot;)&lt;/script&gt;" in content
        assert "&lt;i&gt;h&lt;/i&gt;" in content
        searched = viewer.get(changelist_url(q="<script>")).content.decode()
        assert "<script>alert" not in searched
        assert "&lt;script&gt;" in searched

    def test_very_long_names(self, viewer):
        long_name = "n" * (MAX_NAME_LENGTH - 1) + "<"
        event(name=long_name)
        response = viewer.get(changelist_url(name=long_name))
        assert result_names(response) == [long_name]
        assert "n" * (MAX_NAME_LENGTH - 1) + "&lt;" in response.content.decode()

    def test_date_hierarchy_links(self, viewer):
        event(name="nov", at=T0)
        event(name="dec", at=dt.datetime(2026, 12, 3, 8, tzinfo=UTC))
        event(name="old", at=dt.datetime(2025, 6, 1, tzinfo=UTC))
        content = viewer.get(changelist_url()).content.decode()
        assert "?at__year=2026" in content
        assert "?at__year=2025" in content
        year = viewer.get(changelist_url(at__year=2026))
        assert sorted(result_names(year)) == ["dec", "nov"]
        assert "at__month=12" in year.content.decode()
        month = viewer.get(changelist_url(at__year=2026, at__month=12))
        assert result_names(month) == ["dec"]
        assert month.context["event_chart"].total == 1

    @pytest.mark.parametrize("kind", ["year", "month", "day"])
    @pytest.mark.parametrize("order", ["ASC", "DESC"])
    def test_date_hierarchy_buckets_match_django(self, kind, order):
        from django.db.models import QuerySet

        from django_distlock.admin.events import LockEventAdminQuerySet

        for moment in (
            T0,
            T0 + dt.timedelta(hours=15),
            dt.datetime(2026, 11, 3, 23, 59, 59, tzinfo=UTC),
            dt.datetime(2026, 2, 28, tzinfo=UTC),
            dt.datetime(2024, 12, 31, 23, 0, tzinfo=UTC),
        ):
            event(at=moment)
        base = LockEvent.objects.filter(at__gte=dt.datetime(2025, 1, 1, tzinfo=UTC))
        ours = LockEventAdminQuerySet(model=LockEvent, query=base.query)
        expected = list(QuerySet.datetimes(base, "at", kind, order))
        assert list(ours.datetimes("at", kind, order)) == expected
        assert len(expected) >= 1
        everything = LockEventAdminQuerySet(model=LockEvent)
        assert list(everything.datetimes("at", kind, order)) == list(
            LockEvent.objects.datetimes("at", kind, order)
        )
        assert list(everything.filter(name="none").datetimes("at", kind)) == []

    def test_columns_and_newest_first(self, viewer):
        event(name="first", at=T0, waited_ms=1234.5, pid=77, thread="worker-3")
        event(name="second", at=T0 + dt.timedelta(minutes=1))
        response = viewer.get(changelist_url())
        assert result_names(response) == ["second", "first"]
        content = response.content.decode()
        assert "web-1:77 worker-3" in content
        at = timezone.localtime(T0)
        assert (
            f'<span class="date">{at:%Y-%m-%d}</span> <span class="time">{at:%H:%M:%S}</span>'
            in content
        )
        assert '<td class="field-duration">waited 1.2s</td>' in content

    def test_the_duration_column_sorts_waits_and_holds_together(self, viewer):
        event(name="quick", waited_ms=3.0)
        event(name="long", held_ms=29981.06)
        event(name="slow", waited_ms=1200.0)
        duration = LockEventAdmin.list_display.index("duration")
        response = viewer.get(changelist_url(o=f"-{duration}"))
        assert result_names(response) == ["long", "slow", "quick"]

    def test_the_detail_page_reads_like_the_list(self, viewer):
        released = event(kind="released", held_ms=29981.06513600004, waited_ms=0.35)
        url = reverse("admin:django_distlock_lockevent_change", args=[released.pk])
        content = viewer.get(url).content.decode()
        assert released.at_label in content
        assert "30s (29,981 ms)" in content
        assert "0.3ms" in content
        assert "29981.06" not in content


# -- read only and permissions ------------------------------------------------------------


@pytest.mark.django_db
class TestReadOnly:
    def test_no_add_or_delete_buttons_nor_actions(self, admin):
        event()
        content = admin.get(changelist_url()).content.decode()
        assert reverse("admin:django_distlock_lockevent_add") not in content
        assert 'name="action"' not in content
        assert "delete_selected" not in content

    def test_detail_is_read_only(self, viewer):
        obj = event(name="detail-me", reason="because")
        url = reverse("admin:django_distlock_lockevent_change", args=[obj.pk])
        response = viewer.get(url)
        assert response.status_code == 200
        content = response.content.decode()
        assert "detail-me" in content
        assert "because" in content
        assert 'name="_save"' not in content
        assert 'name="name"' not in content  # read-only: no input for the fields
        assert reverse("admin:django_distlock_lockevent_delete", args=[obj.pk]) not in content

    @pytest.mark.parametrize("who", ["viewer", "superuser"])
    def test_writes_are_refused(self, client, who):
        user = (
            make_user("root", superuser=True)
            if who == "superuser"
            else make_user("viewer", "view_lockevent")
        )
        client.force_login(user)
        obj = event(name="keep")
        change = reverse("admin:django_distlock_lockevent_change", args=[obj.pk])
        assert client.post(change, {"name": "changed", "kind": "lost"}).status_code == 403
        assert client.post(reverse("admin:django_distlock_lockevent_add"), {}).status_code == 403
        delete = reverse("admin:django_distlock_lockevent_delete", args=[obj.pk])
        assert client.post(delete, {"post": "yes"}).status_code == 403
        obj.refresh_from_db()
        assert obj.name == "keep"
        assert LockEvent.objects.count() == 1


@pytest.mark.django_db
class TestPermissions:
    def test_anonymous_is_sent_to_login(self, client):
        obj = event()
        for url in (
            changelist_url(),
            reverse("admin:django_distlock_lockevent_change", args=[obj.pk]),
        ):
            response = client.get(url)
            assert response.status_code == 302
            assert response["Location"].startswith(reverse("admin:login"))

    def test_staff_without_view_permission_gets_403_and_no_model(self, client):
        client.force_login(make_user("staff"))
        obj = event()
        assert client.get(changelist_url()).status_code == 403
        change = reverse("admin:django_distlock_lockevent_change", args=[obj.pk])
        assert client.get(change).status_code == 403
        index = client.get(reverse("admin:index")).content.decode()
        assert changelist_url() not in index

    def test_staff_with_other_distlock_permission_does_not_see_events(self, client):
        client.force_login(make_user("ops", "view_heldlock"))
        assert client.get(changelist_url()).status_code == 403
        app = client.get(reverse("admin:app_list", args=["django_distlock"])).content.decode()
        assert changelist_url() not in app

    def test_viewer_sees_the_model_read_only(self, viewer):
        index = viewer.get(reverse("admin:index")).content.decode()
        assert changelist_url() in index
        assert reverse("admin:django_distlock_lockevent_add") not in index
        assert viewer.get(changelist_url()).status_code == 200

    def test_superuser_sees_all(self, admin):
        obj = event()
        assert admin.get(changelist_url()).status_code == 200
        change = reverse("admin:django_distlock_lockevent_change", args=[obj.pk])
        assert admin.get(change).status_code == 200
        assert changelist_url() in admin.get(reverse("admin:index")).content.decode()


# -- performance --------------------------------------------------------------------------


@pytest.mark.django_db
def test_changelist_with_50000_events_renders_fast(viewer, capsys):
    kinds = [k for k, _label in LockEvent.Kind.choices]
    LockEvent.objects.bulk_create(
        [
            LockEvent(
                name=f"lock-{i % 500}",
                kind=kinds[i % len(kinds)],
                fence=i,
                host=f"host-{i % 7}",
                pid=1000 + i % 13,
                thread="MainThread",
                context=("web", "command:x", "task:y")[i % 3],
                waited_ms=float(i % 997),
                held_ms=float(i % 1999) if i % 2 else None,
                at=T0 + dt.timedelta(seconds=17 * i),
            )
            for i in range(50_000)
        ],
        batch_size=5000,
    )
    viewer.get(changelist_url())  # warm up templates and caches
    timings: dict[str, list[float]] = {}
    for label, params in (
        ("all", {}),
        ("kind", {"kind__exact": "acquired"}),
        ("search", {"q": "lock-4"}),
        ("day", {"at__year": 2026, "at__month": 11, "at__day": 25}),
    ):
        for _ in range(3):
            started = time.perf_counter()
            response = viewer.get(changelist_url(**params))
            timings.setdefault(label, []).append(time.perf_counter() - started)
            assert response.status_code == 200
            assert response.context["event_chart"].total == response.context["cl"].result_count
    with capsys.disabled():
        print(
            "\nlock-events changelist, 50,000 events (min/max of 3, test client, SQLite): "
            + ", ".join(
                f"{k} {min(v) * 1000:.0f}/{max(v) * 1000:.0f} ms" for k, v in timings.items()
            )
        )
    assert response.context["event_chart"].granularity == "hour"
    assert max(max(v) for v in timings.values()) < 2.0


@pytest.mark.django_db
def test_the_mode_of_each_event_is_shown_and_filtered(viewer):
    event(name="mutex")
    event(name="readers", mode="shared")
    event(name="slots", mode="limited", limit=3)
    response = viewer.get(changelist_url())
    content = response.content.decode()
    # Under the name, unless exclusive (most locks: the column would say nothing).
    assert '<td class="field-lock">mutex</td>' in content
    assert '<td class="field-lock">readers<div class="quiet mode">shared</div></td>' in content
    assert '<td class="field-lock">slots<div class="quiet mode">limited 3</div></td>' in content
    assert "?mode__exact=limited" in content  # the sidebar filter
    assert result_names(viewer.get(changelist_url(mode__exact="limited"))) == ["slots"]
    assert result_names(viewer.get(changelist_url(mode__exact="shared"))) == ["readers"]
    detail = viewer.get(
        reverse(
            "admin:django_distlock_lockevent_change", args=[LockEvent.objects.get(name="slots").pk]
        )
    ).content.decode()
    assert "limited" in detail
    assert '<div class="readonly">3</div>' in detail
