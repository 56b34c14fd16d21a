"""Chart data for the lock-events admin: events per time bucket by kind, rendered as an
inline SVG on the server by a template (no JavaScript, no CDN), and wait/hold time
percentiles.

Everything here is a function over plain values (datetimes, strings, numbers), so it can
be tested without a request or a database. The admin computes the inputs in the
database (``Trunc`` + ``Count`` per bucket and kind) and hands them over.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.template.loader import render_to_string

__all__ = [
    "DEFAULT_COLOURS",
    "FONT_SIZE",
    "GRANULARITIES",
    "HEIGHT",
    "MAX_BUCKETS",
    "WIDTH",
    "Bucket",
    "ChartData",
    "KindSeries",
    "bucket_starts",
    "build_chart",
    "choose_granularity",
    "next_bucket",
    "percentile",
    "percentiles",
    "render_svg",
    "svg_layout",
    "truncate",
]

#: Bucket sizes, finest first; each matches a Django ``Trunc`` kind.
GRANULARITIES: tuple[str, ...] = ("minute", "hour", "day", "week", "month", "year")

#: The finest granularity is chosen that keeps the chart at or under this many buckets.
MAX_BUCKETS = 60

#: The SVG's size in user units, about the width the admin gives it at 1280 px beside its
#: filters: a page scales the SVG down to fit, text and all, so drawing it much wider
#: than it is shown shrinks its text below reading size.
WIDTH = 560
HEIGHT = 200
#: Text size in user units (pixels when the chart is shown at its own width).
FONT_SIZE = 12

#: One colour per event kind (colour-blind friendly where possible); unknown kinds take
#: colours from ``FALLBACK_COLOURS`` in order.
DEFAULT_COLOURS: dict[str, str] = {
    "acquired": "#2b8a3e",
    "released": "#1c7ed6",
    "extended": "#0ca678",
    "contended": "#f08c00",
    "lost": "#e03131",
    "force_released": "#7048e8",
    "not_replicated": "#862e9c",
}
FALLBACK_COLOURS: tuple[str, ...] = ("#495057", "#c2255c", "#5c940d", "#1098ad", "#e8590c")

_LABEL_FORMATS: dict[str, str] = {
    "minute": "%Y-%m-%d %H:%M",
    "hour": "%Y-%m-%d %H:00",
    "day": "%Y-%m-%d",
    "week": "week of %Y-%m-%d",
    "month": "%Y-%m",
    "year": "%Y",
}


@dataclass(frozen=True)
class Bucket:
    """One time bucket: its start and the number of events of each kind in it."""

    start: dt.datetime
    counts: dict[str, int]

    @property
    def total(self) -> int:
        """All events in the bucket."""
        return sum(self.counts.values())


@dataclass(frozen=True)
class KindSeries:
    """One kind in the legend: its value, label, colour and total over the chart."""

    kind: str
    label: str
    colour: str
    total: int


@dataclass(frozen=True)
class ChartData:
    """Everything the SVG needs: buckets in time order and the kinds present."""

    granularity: str
    buckets: list[Bucket]
    kinds: list[KindSeries] = field(default_factory=list)

    @property
    def total(self) -> int:
        """All events in the chart."""
        return sum(bucket.total for bucket in self.buckets)

    @property
    def max_total(self) -> int:
        """The tallest bar (0 when there is no data)."""
        return max((bucket.total for bucket in self.buckets), default=0)

    def label(self, start: dt.datetime) -> str:
        """A bucket's start as text, as fine as the granularity."""
        return start.strftime(_LABEL_FORMATS[self.granularity])


def truncate(moment: dt.datetime, granularity: str) -> dt.datetime:
    """``moment`` truncated to the start of its bucket, in ``moment``'s own time zone,
    the way Django's ``Trunc`` does it (weeks start on Monday)."""
    if granularity == "minute":
        return moment.replace(second=0, microsecond=0)
    if granularity == "hour":
        return moment.replace(minute=0, second=0, microsecond=0)
    midnight = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if granularity == "day":
        return midnight
    if granularity == "week":
        monday = moment.date() - dt.timedelta(days=moment.weekday())
        return dt.datetime.combine(monday, dt.time(), tzinfo=moment.tzinfo)
    if granularity == "month":
        return midnight.replace(day=1)
    if granularity == "year":
        return midnight.replace(month=1, day=1)
    raise ValueError(f"unknown granularity {granularity!r}; expected one of {GRANULARITIES}")


def next_bucket(start: dt.datetime, granularity: str) -> dt.datetime:
    """The start of the bucket after the one starting at ``start``."""
    if granularity == "minute":
        return start + dt.timedelta(minutes=1)
    if granularity == "hour":
        return start + dt.timedelta(hours=1)
    if granularity in ("day", "week"):
        days = 1 if granularity == "day" else 7
        day = start.date() + dt.timedelta(days=days)
        return dt.datetime.combine(day, dt.time(), tzinfo=start.tzinfo)
    if granularity == "month":
        year, month = (start.year + 1, 1) if start.month == 12 else (start.year, start.month + 1)
        return start.replace(year=year, month=month, day=1)
    if granularity == "year":
        return start.replace(year=start.year + 1, month=1, day=1)
    raise ValueError(f"unknown granularity {granularity!r}; expected one of {GRANULARITIES}")


def bucket_starts(
    start: dt.datetime, end: dt.datetime, granularity: str, limit: int | None = None
) -> list[dt.datetime]:
    """The starts of every bucket from the one holding ``start`` to the one holding
    ``end`` (both included). With ``limit``, stops after ``limit + 1`` starts (enough to
    tell that there are too many)."""
    if end < start:
        start, end = end, start
    current = truncate(start, granularity)
    last = truncate(end, granularity)
    starts: list[dt.datetime] = []
    while current <= last:
        starts.append(current)
        if limit is not None and len(starts) > limit:
            break
        current = next_bucket(current, granularity)
    return starts


def choose_granularity(
    start: dt.datetime | None, end: dt.datetime | None, max_buckets: int = MAX_BUCKETS
) -> str:
    """The finest granularity that covers ``start``..``end`` in at most ``max_buckets``
    buckets ("minute" when there is no data or a single moment; "year" at worst)."""
    if start is None or end is None:
        return GRANULARITIES[0]
    for granularity in GRANULARITIES:
        if len(bucket_starts(start, end, granularity, limit=max_buckets)) <= max_buckets:
            return granularity
    return GRANULARITIES[-1]


def build_chart(
    rows: Iterable[tuple[dt.datetime, str, int]],
    granularity: str,
    start: dt.datetime | None,
    end: dt.datetime | None,
    kind_labels: Mapping[str, str] | None = None,
    colours: Mapping[str, str] | None = None,
) -> ChartData:
    """Chart data from ``(bucket start, kind, count)`` rows (as a ``Trunc`` + ``Count``
    query returns them). Empty buckets between ``start`` and ``end`` are filled in, so
    gaps show as gaps. Kinds appear in the order of ``kind_labels`` (then any others,
    sorted); only kinds with events are kept."""
    labels = dict(kind_labels or {})
    palette = dict(DEFAULT_COLOURS if colours is None else colours)
    counts: dict[dt.datetime, dict[str, int]] = {}
    if start is not None and end is not None:
        for bucket_start in bucket_starts(start, end, granularity):
            counts[bucket_start] = {}
    totals: dict[str, int] = {}
    for bucket_start, kind, count in rows:
        if not count:
            continue
        per_kind = counts.setdefault(bucket_start, {})
        per_kind[kind] = per_kind.get(kind, 0) + int(count)
        totals[kind] = totals.get(kind, 0) + int(count)
    ordered = [kind for kind in labels if kind in totals]
    ordered += sorted(kind for kind in totals if kind not in labels)
    series: list[KindSeries] = []
    spare = iter(FALLBACK_COLOURS * (len(ordered) // len(FALLBACK_COLOURS) + 1))
    for kind in ordered:
        colour = palette.get(kind) or next(spare)
        series.append(KindSeries(kind, str(labels.get(kind, kind)), colour, totals[kind]))
    buckets = [Bucket(key, counts[key]) for key in sorted(counts)]
    return ChartData(granularity=granularity, buckets=buckets, kinds=series)


def percentile(sorted_values: Sequence[float], p: float) -> float | None:
    """The ``p``-th percentile (0-100) of already sorted values, interpolating linearly
    between the closest ranks (numpy's default method). ``None`` for no values."""
    if not sorted_values:
        return None
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be between 0 and 100, not {p!r}")
    rank = (len(sorted_values) - 1) * p / 100
    low = math.floor(rank)
    high = math.ceil(rank)
    fraction = rank - low
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * fraction


def percentiles(
    values: Iterable[float | None], ps: Sequence[float] = (50, 90, 99)
) -> dict[float, float | None]:
    """``{p: value}`` for each of ``ps`` over ``values`` (``None`` values are ignored)."""
    ordered = sorted(value for value in values if value is not None)
    return {p: percentile(ordered, p) for p in ps}


def _number(value: float) -> str:
    """A coordinate for SVG: short, and never in exponent notation."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


def render_svg(
    chart: ChartData,
    width: int = WIDTH,
    height: int = HEIGHT,
    title: str = "Lock events per {granularity} by kind",
) -> str:
    """The chart as an inline, accessible SVG (``role="img"``, ``aria-label``, a
    ``<title>`` tooltip on every bar segment) with stacked bars, one colour per kind,
    and a legend with each kind's total: the template ``django_distlock/chart.svg`` drawn
    with :func:`svg_layout`. All text is escaped by the template; the result is safe to
    insert into a page as is."""
    layout = svg_layout(chart, width, height, title)
    return render_to_string("django_distlock/chart.svg", layout).strip()


TICK_CHARACTER = 0.65
"""The width of a tick label's character, in ems: a little over DejaVu Sans's digits
(0.636 em), so that labels estimated apart are apart on screen too."""


def _ticks(
    chart: ChartData, left: float, step: float, font: int, width: int
) -> list[dict[str, Any]]:
    """The x axis labels: the first and last buckets', then the middle one's, each only
    where it overlaps none already placed (a font size apart at least). A label is
    centred on its bucket, unless that would run past the chart's edge."""
    last = len(chart.buckets) - 1
    placed: list[tuple[float, float, dict[str, Any]]] = []
    for index in dict.fromkeys((0, last, last // 2)):
        label = chart.label(chart.buckets[index].start)
        x = left + (index + 0.5) * step
        extent = len(label) * font * TICK_CHARACTER
        anchor, start = "middle", x - extent / 2
        if start < 0:
            anchor, start = "start", x
        elif start + extent > width:
            anchor, start = "end", x - extent
        end = start + extent
        if any(
            start < other_end + font and other_start < end + font
            for other_start, other_end, _t in placed
        ):
            continue
        placed.append((start, end, {"x": _number(x), "anchor": anchor, "label": label}))
    return [tick for _start, _end, tick in sorted(placed, key=lambda item: item[0])]


def svg_layout(chart: ChartData, width: int, height: int, title: str) -> dict[str, Any]:
    """Where everything of :func:`render_svg`'s chart goes, in SVG user units (numbers as
    short strings), for its template."""
    heading = title.format(granularity=chart.granularity)
    if chart.buckets:
        first = chart.label(chart.buckets[0].start)
        last = chart.label(chart.buckets[-1].start)
        summary = f"{heading}: {chart.total} events from {first} to {last}"
    else:
        summary = f"{heading}: no events"
    font = FONT_SIZE
    line = round(font * 1.5)  # a legend row
    left, right, top, bottom = 44, 8, 10, line + 6
    # The legend wraps onto as many rows as it needs under the x axis labels (a
    # character is taken as 0.6 em wide, about DejaVu Sans's average).
    placed: list[tuple[KindSeries, str, float, int]] = []
    x, row = float(left), 0
    for series in chart.kinds:
        text = f"{series.label} ({series.total})"
        item_width = font + 4 + font * 0.6 * len(text) + 16
        if x > left and x + item_width > width - right:
            x, row = float(left), row + 1
        placed.append((series, text, x, row))
        x += item_width
    legend_height = line * (row + 1) + 4 if placed else 0
    plot_width = width - left - right
    plot_height = height - top - bottom - legend_height
    base = top + plot_height
    peak = chart.max_total
    gridlines, bars, ticks = [], [], []
    if chart.buckets and peak:
        for value in (peak, peak // 2) if peak > 1 else (peak,):
            y = base - plot_height * value / peak
            gridlines.append({"y": _number(y), "label_y": _number(y + font / 3), "value": value})
        step = plot_width / len(chart.buckets)
        gap = 1.0 if step > 3 else 0.0
        for index, bucket in enumerate(chart.buckets):
            y = float(base)
            for series in chart.kinds:
                count = bucket.counts.get(series.kind, 0)
                if not count:
                    continue
                segment = plot_height * count / peak
                y -= segment
                bars.append(
                    {
                        "series": series,
                        "count": count,
                        "label": chart.label(bucket.start),
                        "x": _number(left + index * step + gap / 2),
                        "y": _number(y),
                        "width": _number(max(step - gap, 0.5)),
                        "height": _number(segment),
                    }
                )
        ticks = _ticks(chart, left, step, font, width)
    legend = []
    for series, text, x, row in placed:
        legend_y = base + bottom + font + line * row
        legend.append(
            {
                "series": series,
                "text": text,
                "x": _number(x),
                "y": legend_y - font + 2,
                "text_x": _number(x + font + 4),
                "text_y": legend_y,
            }
        )
    return {
        "summary": summary,
        "width": width,
        "height": height,
        "font": font,
        "swatch": font - 2,
        "left": left,
        "right_edge": width - right,
        "base": base,
        "tick_y": base + font + 3,
        "empty_x": left + plot_width / 2,
        "empty_y": top + plot_height / 2,
        "empty_font": font + 1,
        "gridlines": gridlines,
        "bars": bars,
        "ticks": ticks,
        "legend": legend,
    }
