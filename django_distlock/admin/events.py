"""The admin of lock events: a read-only history with filters, search, wait and hold
percentiles, and a server-rendered chart of events over time by kind."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Case, Count, IntegerField, Max, Min, QuerySet, Value, When
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ..commands.durations import format_milliseconds
from ..models import LockEvent, Mode
from . import chart

__all__ = ["LockEventAdmin", "LockEventAdminQuerySet", "event_chart_context"]

#: At most this many recent values feed the wait/hold percentiles.
PERCENTILE_SAMPLE = 10_000
PERCENTILES = (50, 90, 99)


def _bucket_number(starts: list[Any], granularity: str) -> Case:
    """An expression numbering the bucket each event's ``at`` falls in (``starts`` are
    the buckets' time-zone aware starts). A ``CASE`` over the edges rather than
    ``Trunc``, which SQLite evaluates with a Python function row by row."""
    edges = [*starts[1:], chart.next_bucket(starts[-1], granularity)]
    return Case(
        *(When(at__lt=edge, then=Value(index)) for index, edge in enumerate(edges)),
        default=Value(len(edges) - 1),
        output_field=IntegerField(),
    )


class LockEventAdminQuerySet(QuerySet):  # type: ignore[type-arg]
    """The changelist's queryset: ``datetimes("at", ...)``, which the date hierarchy
    asks for, is answered from the same bucket numbering as the chart (one scan, no
    per-row function), so it stays fast on every backend."""

    #: Above this many candidate buckets, fall back to Django's own query.
    MAX_HIERARCHY_BUCKETS = 400

    def datetimes(self, field_name: str, kind: str, order: str = "ASC", tzinfo: Any = None) -> Any:
        """The distinct ``kind`` ("year", "month", "day") starts that have events."""
        if field_name != "at" or kind not in ("year", "month", "day") or self.query.is_sliced:
            return super().datetimes(field_name, kind, order, tzinfo)
        span = self.order_by().aggregate(start=Min("at"), end=Max("at"))
        if span["start"] is None:
            return []
        zone = tzinfo or timezone.get_current_timezone()
        starts = chart.bucket_starts(
            timezone.localtime(span["start"], zone),
            timezone.localtime(span["end"], zone),
            kind,
            limit=self.MAX_HIERARCHY_BUCKETS,
        )
        if len(starts) > self.MAX_HIERARCHY_BUCKETS:
            return super().datetimes(field_name, kind, order, tzinfo)
        numbers = (
            self.order_by()
            .annotate(bucket=_bucket_number(starts, kind))
            .values_list("bucket", flat=True)
            .distinct()
        )
        found = sorted(starts[number] for number in numbers)
        return found[::-1] if order == "DESC" else found


class LockNameFilter(admin.SimpleListFilter):
    """``?name=<lock name>``: the events of exactly that lock (the held-lock detail page
    links here). Any value is accepted; it is shown in the sidebar only while set."""

    title = gettext_lazy("lock name")
    parameter_name = "name"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        """Only the current value, so the sidebar shows it and offers "All"."""
        value = self.value()
        return [(value, value)] if value else []

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet | None:
        """Exact match on the name (no pattern characters are special)."""
        value = self.value()
        return queryset.filter(name=value) if value else queryset


@admin.register(LockEvent)
class LockEventAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Read-only history of lock events, with a chart of the current filter above the
    list: events per time bucket by kind (inline SVG) and wait/hold time percentiles."""

    # Five columns fit at 1280 px beside the filters: when, what, which lock, how long,
    # who. What is rare rides along in a second line (the user of a force release, a
    # hold that is not exclusive), and the long labels wrap.
    list_display = ("when", "happened", "lock", "duration", "holder")
    list_display_links = ("when",)
    list_filter = (
        "kind",
        ("at", admin.DateFieldListFilter),
        "mode",
        "context",
        LockNameFilter,
    )
    search_fields = ("name", "host")
    date_hierarchy = "at"
    list_select_related = ("user",)
    ordering = ("-at", "-id")
    list_per_page = 100
    actions = None
    # The detail page shows time and durations as the list does (the fields' own widgets
    # would show Django's long date format and every digit of a float).
    fields = (
        "when",
        "kind",
        "name",
        "mode",
        "limit",
        "fence",
        "host",
        "process_id",
        "thread",
        "context",
        "user",
        "wait_time",
        "hold_time",
        "reason",
    )
    readonly_fields = ("when", "process_id", "wait_time", "hold_time")

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        """Events, as a ``LockEventAdminQuerySet`` (a fast date hierarchy)."""
        queryset = super().get_queryset(request)
        return LockEventAdminQuerySet(model=queryset.model, query=queryset.query, using=queryset.db)

    @admin.display(description=gettext_lazy("at"), ordering="at")
    def when(self, obj: LockEvent) -> str:
        """Local time to the second, the same on the list and the detail page (the date
        and the time each kept on one line)."""
        date, time = obj.at_label.split(" ")
        return format_html('<span class="date">{}</span> <span class="time">{}</span>', date, time)

    @admin.display(description=gettext_lazy("PID"))
    def process_id(self, obj: LockEvent) -> str:
        """The process's id, labelled "PID" as on every other page (the field's own
        label would read "Pid")."""
        return "-" if obj.pid is None else str(obj.pid)

    @admin.display(description=gettext_lazy("kind"), ordering="kind")
    def happened(self, obj: LockEvent) -> str:
        """The kind of event, and under a force release the user who made it."""
        kind = obj.get_kind_display()
        if obj.user is None:
            return kind
        by = _("by %(user)s") % {"user": obj.user.get_username()}
        return format_html('{}<div class="quiet by">{}</div>', kind, by)

    @admin.display(description=gettext_lazy("lock name"), ordering="name")
    def lock(self, obj: LockEvent) -> str:
        """The lock's name, and under it the kind of hold unless exclusive."""
        if obj.mode == Mode.EXCLUSIVE:
            return obj.name
        return format_html('{}<div class="quiet mode">{}</div>', obj.name, obj.mode_label)

    @admin.display(
        description=gettext_lazy("waited / held"), ordering=Coalesce("waited_ms", "held_ms")
    )
    def duration(self, obj: LockEvent) -> str:
        """How long the acquirer waited, or the holder held (``held 30s``)."""
        parts = [
            _("%(what)s %(time)s") % {"what": what, "time": format_milliseconds(value)}
            for what, value in ((_("waited"), obj.waited_ms), (_("held"), obj.held_ms))
            if value is not None
        ]
        return format_html_join(mark_safe("<br>"), "{}", ((part,) for part in parts)) or "-"

    @admin.display(description=gettext_lazy("context and owner"), ordering="context")
    def holder(self, obj: LockEvent) -> str:
        """The lock's context label, and under it ``host:pid thread``."""
        return format_html('{}<div class="quiet owner">{}</div>', obj.context or "-", obj.owner)

    @admin.display(description=gettext_lazy("waited"))
    def wait_time(self, obj: LockEvent) -> str:
        """The detail page's: rounded, and the milliseconds recorded (``30s (29,981
        ms)``)."""
        return _with_milliseconds(obj.waited_ms)

    @admin.display(description=gettext_lazy("held"))
    def hold_time(self, obj: LockEvent) -> str:
        """The detail page's: rounded, and the milliseconds recorded."""
        return _with_milliseconds(obj.held_ms)

    def has_add_permission(self, request: HttpRequest) -> bool:
        """Events are written by the lock machinery, never by hand."""
        return False

    def has_change_permission(self, request: HttpRequest, obj: LockEvent | None = None) -> bool:
        """History is read-only."""
        return False

    def has_delete_permission(self, request: HttpRequest, obj: LockEvent | None = None) -> bool:
        """History is read-only (retention prunes it)."""
        return False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The changelist, with the chart and percentiles of its filtered queryset."""
        response = super().changelist_view(request, extra_context)
        context_data = getattr(response, "context_data", None)
        if context_data is not None and "cl" in context_data:
            context_data.update(event_chart_context(context_data["cl"].queryset))
        return response


def _with_milliseconds(value: float | None) -> str:
    """``29981.065`` -> ``"30s (29,981 ms)"``; below a second the rounded value alone
    (``"412ms"``) says it all."""
    shown = format_milliseconds(value)
    return shown if value is None or value < 999.5 else f"{shown} ({value:,.0f} ms)"


def event_chart_context(queryset: QuerySet) -> dict[str, Any]:
    """Template context for the chart over ``queryset`` (a filtered ``LockEvent``
    queryset): the SVG and the wait/hold percentiles. Bucket counts are aggregated in
    the database; percentiles read at most ``PERCENTILE_SAMPLE`` most recent values."""
    base = queryset.order_by()
    span = base.aggregate(start=Min("at"), end=Max("at"))
    current = timezone.get_current_timezone()
    start = timezone.localtime(span["start"], current) if span["start"] else None
    end = timezone.localtime(span["end"], current) if span["end"] else None
    granularity = chart.choose_granularity(start, end)
    rows: list[tuple[Any, str, int]] = []
    if start is not None and end is not None:
        # One scan, grouped by (bucket number, kind).
        starts = chart.bucket_starts(start, end, granularity)
        bucket = _bucket_number(starts, granularity)
        rows = [
            (starts[index], kind, count)
            for index, kind, count in base.annotate(bucket=bucket)
            .values("bucket", "kind")
            .annotate(count=Count("id"))
            .order_by("bucket", "kind")
            .values_list("bucket", "kind", "count")
        ]
    data = chart.build_chart(
        rows, granularity, start, end, kind_labels=dict(LockEvent.Kind.choices)
    )
    stats = []
    for field_name, label in (
        ("waited_ms", gettext_lazy("waited")),
        ("held_ms", gettext_lazy("held")),
    ):
        sample = list(
            queryset.exclude(**{field_name: None})
            .order_by("-at", "-id")
            .values_list(field_name, flat=True)[:PERCENTILE_SAMPLE]
        )
        values = chart.percentiles(sample, PERCENTILES)
        stats.append(
            {
                "label": label,
                "count": len(sample),
                "values": [format_milliseconds(values[p]) for p in PERCENTILES],
            }
        )
    return {
        "event_chart": data,
        "event_chart_svg": mark_safe(chart.render_svg(data)),  # noqa: S308 (all text escaped)
        "event_percentiles": stats,
        "event_percentile_headers": [f"p{p}" for p in PERCENTILES],
        "event_percentile_sample": PERCENTILE_SAMPLE,
    }
