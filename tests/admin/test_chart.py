"""``django_distlock.admin.chart``: the pure functions behind the lock-events admin's chart
(buckets, granularity, percentiles, the SVG)."""

from __future__ import annotations

import datetime as dt
import itertools
import re

import pytest

from django_distlock.admin import chart
from django_distlock.models import LockEvent
from tests.support.admin import bars, legend

UTC = dt.UTC
T0 = dt.datetime(2026, 11, 20, 10, 0, tzinfo=UTC)


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
        assert all(float(x) < chart.WIDTH for x, _y in items)
        assert all(float(y) < chart.HEIGHT for _x, y in items)

    def test_text_is_escaped(self):
        hostile = '<script>alert("x")</script>'
        data = chart.build_chart(
            [(T0, hostile, 1)], "minute", T0, T0, kind_labels={hostile: hostile}
        )
        svg = chart.render_svg(data)
        assert "<script>" not in svg
        assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in svg


@pytest.mark.parametrize("granularity", ["minute", "hour", "day", "week", "month", "year"])
def test_x_axis_labels_never_overlap_and_stay_inside(granularity: str) -> None:
    """Whatever the number of buckets: at least the first and last labels once there are
    two buckets, none within a font size of another (estimated at 0.65 em a character,
    more than the chart's font draws) and none past the chart's edges."""
    for count in range(1, 41):
        starts = [T0]
        for _ in range(count - 1):
            starts.append(chart.next_bucket(starts[-1], granularity))
        data = chart.build_chart([(s, "acquired", 1) for s in starts], granularity, None, None)
        layout = chart.svg_layout(data, chart.WIDTH, chart.HEIGHT, "t")
        spans = []
        for tick in layout["ticks"]:
            x = float(tick["x"])
            extent = len(tick["label"]) * chart.FONT_SIZE * chart.TICK_CHARACTER
            start = {"start": x, "end": x - extent, "middle": x - extent / 2}[tick["anchor"]]
            assert start >= 0, (count, tick)
            assert start + extent <= chart.WIDTH, (count, tick)
            spans.append((start, start + extent))
        assert len(spans) >= min(count, 2), (granularity, count, layout["ticks"])
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end + chart.FONT_SIZE <= start, (granularity, count, spans)
