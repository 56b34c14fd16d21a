"""The lock-events admin: a read-only changelist with filters, search, date hierarchy,
and a server-rendered chart (events per bucket by kind, wait/hold percentiles) of the
current filter; plus the pure chart functions of ``django_distlock.chart``."""

from __future__ import annotations

import datetime as dt
import re
import time
from urllib.parse import urlencode

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_distlock import chart
from django_distlock.engine.keys import MAX_NAME_LENGTH
from django_distlock.models import LockEvent

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


def make_user(username: str, *perms: str, staff: bool = True, superuser: bool = False) -> User:
    user = User.objects.create_user(
        username, password="pw", is_staff=staff or superuser, is_superuser=superuser
    )
    for codename in perms:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="django_distlock", codename=codename)
        )
    return user


@pytest.fixture
def viewer(client: Client) -> Client:
    client.force_login(make_user("viewer", "view_lockevent"))
    return client


@pytest.fixture
def superuser_client(client: Client) -> Client:
    client.force_login(make_user("root", superuser=True))
    return client


def bars(content: str) -> list[str]:
    """The kinds of the bar segments in the chart, one per segment."""
    return re.findall(r'<rect class="bar" data-kind="([^"]*)"', content)


def legend(content: str) -> list[str]:
    return re.findall(r'<g class="legend" data-kind="([^"]*)"', content)


def result_names(response) -> list[str]:
    return [obj.name for obj in response.context["cl"].result_list]


# -- chart functions ----------------------------------------------------------------------


class TestTruncateAndBuckets:
    def test_truncate_each_granularity(self):
        moment = dt.datetime(2026, 11, 19, 13, 47, 31, 123, tzinfo=UTC)  # a Thursday
        assert chart.truncate(moment, "minute") == dt.datetime(2026, 11, 19, 13, 47, tzinfo=UTC)
        assert chart.truncate(moment, "hour") == dt.datetime(2026, 11, 19, 13, tzinfo=UTC)
        assert chart.truncate(moment, "day") == dt.datetime(2026, 11, 19, tzinfo=UTC)
        assert chart.truncate(moment, "week") == dt.datetime(2026, 11, 16, tzinfo=UTC)  # Monday
        assert chart.truncate(moment, "month") == dt.datetime(2026, 11, 1, tzinfo=UTC)
        assert chart.truncate(moment, "year") == dt.datetime(2026, 1, 1, tzinfo=UTC)

    def test_truncate_unknown_granularity(self):
        with pytest.raises(ValueError, match="unknown granularity"):
            chart.truncate(T0, "fortnight")

    def test_bucket_starts_are_inclusive_and_contiguous(self):
        starts = chart.bucket_starts(T0 + dt.timedelta(seconds=30), T0.replace(minute=3), "minute")
        assert starts == [T0 + dt.timedelta(minutes=m) for m in range(4)]

    def test_bucket_starts_across_month_and_year_ends(self):
        start = dt.datetime(2025, 11, 15, tzinfo=UTC)
        end = dt.datetime(2026, 2, 3, tzinfo=UTC)
        months = chart.bucket_starts(start, end, "month")
        assert [(m.year, m.month) for m in months] == [(2025, 11), (2025, 12), (2026, 1), (2026, 2)]
        assert chart.bucket_starts(start, end, "year") == [
            dt.datetime(2025, 1, 1, tzinfo=UTC),
            dt.datetime(2026, 1, 1, tzinfo=UTC),
        ]

    def test_bucket_starts_limit_stops_early(self):
        starts = chart.bucket_starts(T0, T0 + dt.timedelta(days=365), "minute", limit=60)
        assert len(starts) == 61

    @pytest.mark.parametrize(
        ("span", "expected"),
        [
            (dt.timedelta(0), "minute"),
            (dt.timedelta(minutes=59), "minute"),
            (dt.timedelta(minutes=61), "hour"),
            (dt.timedelta(hours=50), "hour"),
            (dt.timedelta(days=10), "day"),
            (dt.timedelta(days=200), "week"),
            (dt.timedelta(days=3 * 365), "month"),
            (dt.timedelta(days=20 * 365), "year"),
        ],
    )
    def test_choose_granularity_keeps_at_most_60_buckets(self, span, expected):
        granularity = chart.choose_granularity(T0, T0 + span)
        assert granularity == expected
        assert len(chart.bucket_starts(T0, T0 + span, granularity)) <= chart.MAX_BUCKETS

    def test_choose_granularity_without_data(self):
        assert chart.choose_granularity(None, None) == "minute"


class TestBuildChart:
    def test_empty(self):
        data = chart.build_chart([], "minute", None, None)
        assert data.buckets == []
        assert data.kinds == []
        assert data.total == 0
        assert data.max_total == 0

    def test_one_event(self):
        data = chart.build_chart([(T0, "acquired", 1)], "minute", T0, T0)
        assert [(b.start, b.counts) for b in data.buckets] == [(T0, {"acquired": 1})]
        assert [(k.kind, k.total) for k in data.kinds] == [("acquired", 1)]
        assert data.kinds[0].colour == chart.DEFAULT_COLOURS["acquired"]

    def test_gaps_are_filled_and_totals_add_up(self):
        later = T0 + dt.timedelta(hours=3)
        rows = [(T0, "acquired", 2), (T0, "released", 1), (later, "acquired", 4)]
        data = chart.build_chart(rows, "hour", T0, later + dt.timedelta(minutes=5))
        assert [b.total for b in data.buckets] == [3, 0, 0, 4]
        assert data.total == 7
        assert data.max_total == 4
        assert {k.kind: k.total for k in data.kinds} == {"acquired": 6, "released": 1}

    def test_many_kinds_follow_label_order_then_unknown_sorted(self):
        labels = dict(LockEvent.Kind.choices)
        rows = [(T0, kind, 1) for kind in ("zeta", "lost", "acquired", "alpha", "contended")]
        data = chart.build_chart(rows, "minute", T0, T0, kind_labels=labels)
        assert [k.kind for k in data.kinds] == ["acquired", "contended", "lost", "alpha", "zeta"]
        assert data.kinds[0].label == "acquired"
        colours = [k.colour for k in data.kinds]
        assert len(set(colours)) == len(colours)
        assert colours[3] in chart.FALLBACK_COLOURS

    def test_zero_counts_do_not_make_a_kind(self):
        data = chart.build_chart([(T0, "lost", 0)], "minute", T0, T0)
        assert data.kinds == []


class TestPercentiles:
    def test_linear_interpolation(self):
        values = list(range(1, 11))
        assert chart.percentile(values, 0) == 1
        assert chart.percentile(values, 50) == pytest.approx(5.5)
        assert chart.percentile(values, 90) == pytest.approx(9.1)
        assert chart.percentile(values, 99) == pytest.approx(9.91)
        assert chart.percentile(values, 100) == 10

    def test_one_and_no_values(self):
        assert chart.percentile([42.0], 99) == 42.0
        assert chart.percentile([], 50) is None
        assert chart.percentiles([None, None]) == {50: None, 90: None, 99: None}

    def test_percentiles_sort_and_skip_none(self):
        result = chart.percentiles([30.0, None, 10.0, 20.0], (0, 50, 100))
        assert result == {0: 10.0, 50: 20.0, 100: 30.0}

    def test_out_of_range(self):
        with pytest.raises(ValueError, match="between 0 and 100"):
            chart.percentile([1.0], 101)


class TestRenderSvg:
    def test_empty_chart_is_accessible_and_says_so(self):
        svg = chart.render_svg(chart.build_chart([], "minute", None, None))
        assert svg.startswith("<svg")
        assert 'role="img"' in svg
        assert 'aria-label="Lock events per minute by kind: no events"' in svg
        assert "No events" in svg
        assert bars(svg) == []

    def test_stacked_bars_with_titles_and_legend(self):
        rows = [(T0, "acquired", 3), (T0, "released", 1), (T0 + dt.timedelta(minutes=2), "lost", 2)]
        data = chart.build_chart(
            rows,
            "minute",
            T0,
            T0 + dt.timedelta(minutes=2),
            kind_labels=dict(LockEvent.Kind.choices),
        )
        svg = chart.render_svg(data, title="Events per {granularity}")
        assert bars(svg) == ["acquired", "released", "lost"]
        assert legend(svg) == ["acquired", "released", "lost"]
        assert "<title>2026-11-20 10:00: 3 acquired</title>" in svg
        assert "acquired (3)" in svg
        assert (
            'aria-label="Events per minute: 6 events from 2026-11-20 10:00 to 2026-11-20 10:02"'
            in svg
        )
        # The tallest bar reaches the top of the plot; a stacked bar's segments add up.
        heights = [float(h) for h in re.findall(r'class="bar"[^>]*height="([\d.]+)"', svg)]
        assert heights[0] + heights[1] == pytest.approx(max(heights[0] + heights[1], heights[2]))
        assert heights[0] / heights[1] == pytest.approx(3)

    def test_legend_wraps_inside_the_width(self):
        labels = {f"kind-{i}": f"a rather long kind label number {i}" for i in range(6)}
        rows = [(T0, kind, 1000 + i) for i, kind in enumerate(labels)]
        svg = chart.render_svg(chart.build_chart(rows, "minute", T0, T0, kind_labels=labels))
        items = re.findall(r'<g class="legend"[^>]*><rect x="([\d.]+)" y="([\d.]+)"', svg)
        assert len(items) == 6
        assert len({y for _x, y in items}) > 1  # more than one row
        assert all(float(x) < 760 for x, _y in items)
        assert all(float(y) < 180 for _x, y in items)

    def test_text_is_escaped(self):
        hostile = '<script>alert("x")</script>'
        data = chart.build_chart(
            [(T0, hostile, 1)], "minute", T0, T0, kind_labels={hostile: hostile}
        )
        svg = chart.render_svg(data)
        assert "<script>" not in svg
        assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in svg


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
        assert waited["values"] == ["5.5", "9.1", "9.9"]
        assert waited["count"] == 10
        assert held["values"] == ["500.0", "500.0", "500.0"]
        assert 'id="distlock-percentiles"' in content
        assert "<td>5.5</td>" in content

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
        assert waited["values"] == ["25.0", "37.0", "39.7"]
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
        assert waited["values"][0] == "2.0"


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
        assert f"{timezone.localtime(T0):%Y-%m-%d %H:%M:%S}" in content
        assert "1,234.5" in content


# -- read only and permissions ------------------------------------------------------------


@pytest.mark.django_db
class TestReadOnly:
    def test_no_add_or_delete_buttons_nor_actions(self, superuser_client):
        event()
        content = superuser_client.get(changelist_url()).content.decode()
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

    def test_superuser_sees_all(self, superuser_client):
        obj = event()
        assert superuser_client.get(changelist_url()).status_code == 200
        change = reverse("admin:django_distlock_lockevent_change", args=[obj.pk])
        assert superuser_client.get(change).status_code == 200
        assert changelist_url() in superuser_client.get(reverse("admin:index")).content.decode()


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
