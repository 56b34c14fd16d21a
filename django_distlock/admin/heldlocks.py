"""The admin of the locks held right now, live from Redis: one row per hold (an
exclusive lock has one, a shared or limited lock one per holder), each force-released
on its own.

``HeldLock`` has no table, so its admin replaces every view Django would build on a
``ChangeList`` with its own, over ``HeldLock.objects`` (the django-rq way: an unmanaged
model with explicit permissions, extra URLs wrapped in ``admin_site.admin_view``, and
force release as a GET confirmation page then a POST, reported with ``messages``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.models import DELETION, LogEntry
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, URLPattern, path, reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_http_methods

from ..connections import lock_servers
from ..engine import LockBackendUnavailable
from ..managers import lock_server_eviction_policy
from ..models import HeldLock, LockEvent, Mode
from ..settings import get_config
from .heldlockrows import Row, parse_selection, selection_value

__all__ = ["HeldLockAdmin"]

HELD_LOCKS_PER_PAGE = 100
RECENT_EVENTS = 50
_ORDERINGS = ("name", "-name", "ttl", "-ttl", "acquired_at", "-acquired_at")
DEFAULT_ORDERING = "-ttl"
"""The held locks page's order unless asked: the locks that stay held longest first (a
stuck lock with a long lease is near the top), and the order of the listing index, so a
page reads only as far as it shows (by name or hold time, every held lock is read)."""
_SORTABLE_COLUMNS = (
    ("name", gettext_lazy("Name")),
    ("acquired_at", gettext_lazy("Held for")),
    ("ttl", gettext_lazy("TTL remaining")),
)


@admin.register(HeldLock)
class HeldLockAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Read-only listing of the held locks, a detail page per lock, and force release
    (with ``django_distlock.force_release_heldlock``). No add, change or delete: locks
    are taken by code and broken only through force release, a compare-and-delete on
    the token the operator saw."""

    # -- permissions --------------------------------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        """Locks are taken by code, never added here."""
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Held locks are read-only."""
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Breaking a lock is force release (its own permission), not a delete."""
        return False

    def has_force_release_permission(self, request: HttpRequest) -> bool:
        """May ``request.user`` break held locks?"""
        return request.user.has_perm("django_distlock.force_release_heldlock")

    def _check_view(self, request: HttpRequest) -> None:
        if not self.has_view_permission(request):
            raise PermissionDenied

    # -- URLs ---------------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        """Only our own views: the lock name travels as ``?name=`` (any character
        round-trips), never in the path."""
        info = self.opts.app_label, self.opts.model_name
        wrap = self.admin_site.admin_view
        return [
            path("", wrap(self.changelist_view), name="{}_{}_changelist".format(*info)),
            path("detail/", wrap(self.detail_view), name="{}_{}_detail".format(*info)),
            path(
                "force-release/",
                wrap(self.force_release_view),
                name="{}_{}_force_release".format(*info),
            ),
        ]

    def _url(self, view: str, **params: Any) -> str:
        url = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_{view}")
        return f"{url}?{urlencode(params, doseq=True)}" if params else url

    def _force_release_url(self, held: HeldLock) -> str:
        """The confirmation page of force-releasing hold ``held``."""
        return self._url("force_release", lock=selection_value(held))

    def detail_url(self, name: str) -> str:
        """The detail page of the lock ``name``."""
        return self._url("detail", name=name)

    def _context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "title": title,
            "changelist_url": self._url("changelist"),
            "has_force_release_permission": self.has_force_release_permission(request),
            **extra,
        }

    def _unavailable(self, request: HttpRequest, exc: LockBackendUnavailable) -> HttpResponse:
        """The page every held-lock view answers while the lock server cannot be reached:
        503, in the admin's frame, naming the server and the error (lock events, kept in
        the database, are a link away)."""
        try:
            where = lock_servers(get_config()).describe()
        except ImproperlyConfigured:
            where = _("the lock server")
        error = str(exc)
        try:
            events_url = reverse("admin:django_distlock_lockevent_changelist")
        except NoReverseMatch:
            events_url = ""
        context = self._context(
            request,
            _("Lock server unavailable"),
            where=where,
            error=error,
            events_url=events_url
            if request.user.has_perm("django_distlock.view_lockevent")
            else "",
        )
        return TemplateResponse(
            request, "admin/django_distlock/heldlock/unavailable.html", context, status=503
        )

    # -- changelist ---------------------------------------------------------------------

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The held locks: search (``?q=``, a literal substring of the name), ordering
        (``?o=``, :data:`DEFAULT_ORDERING` unless given) and pages of 100 (``?p=``), from
        a few Redis round trips whatever the number of locks. While the lock server cannot
        be reached: a 503 page that says so (the same for the detail and force-release
        pages)."""
        self._check_view(request)
        try:
            return self._changelist(request, extra_context)
        except LockBackendUnavailable as exc:
            return self._unavailable(request, exc)

    def _changelist(
        self, request: HttpRequest, extra_context: dict[str, Any] | None
    ) -> HttpResponse:
        query = request.GET.get("q", "")
        ordering = request.GET.get("o", DEFAULT_ORDERING)
        if ordering not in _ORDERINGS:
            ordering = DEFAULT_ORDERING
        queryset = HeldLock.objects.all()
        if query:
            queryset = queryset.filter(name__contains=query)
        paginator = Paginator(queryset.order_by(ordering), HELD_LOCKS_PER_PAGE)
        page = paginator.get_page(request.GET.get("p"))
        now = time.time()
        detail = self._url("detail")
        rows = [
            Row(held, now, f"{detail}?{urlencode({'name': held.name})}")
            for held in page.object_list
        ]

        def link(**changes: Any) -> str:
            params = {"q": query, "o": ordering, **changes}
            if params["o"] == DEFAULT_ORDERING:
                del params["o"]
            return "?" + urlencode({k: v for k, v in params.items() if v not in ("", None)})

        columns = []
        for field, label in _SORTABLE_COLUMNS:
            # "held for" grows as acquired_at shrinks: its ascending order is -acquired_at.
            ascending = "-acquired_at" if field == "acquired_at" else field
            descending = field if ascending.startswith("-") else f"-{field}"
            if ordering == ascending:
                state = "ascending"
            elif ordering == descending:
                state = "descending"
            else:
                state = ""
            next_ordering = descending if ordering == ascending else ascending
            columns.append({"label": label, "url": link(o=next_ordering, p=None), "sorted": state})
        pages = [
            {"number": number, "url": link(p=number), "current": number == page.number}
            for number in paginator.get_elided_page_range(page.number)
            if isinstance(number, int)
        ]
        context = self._context(
            request,
            _("Held locks"),
            rows=rows,
            page=page,
            paginator=paginator,
            pages=pages,
            query=query,
            ordering=ordering,
            default_ordering=DEFAULT_ORDERING,
            columns=columns,
            force_release_url=self._url("force_release"),
            select_label=_("Select this lock"),
            eviction_policy=lock_server_eviction_policy(),
            **(extra_context or {}),
        )
        return TemplateResponse(request, "admin/django_distlock/heldlock/change_list.html", context)

    # -- detail -------------------------------------------------------------------------

    def detail_view(self, request: HttpRequest) -> HttpResponse:
        """One lock's holds (each with its own force release) and its recent events; 404
        when it is not held."""
        self._check_view(request)
        try:
            return self._detail(request)
        except LockBackendUnavailable as exc:
            return self._unavailable(request, exc)

    def _detail(self, request: HttpRequest) -> HttpResponse:
        name = request.GET.get("name", "")
        holds = list(HeldLock.objects.filter(name=name)) if name else []
        held = holds[0] if holds else None
        can_see_events = request.user.has_perm("django_distlock.view_lockevent")
        events: Iterable[LockEvent] = []
        events_url = None
        if name and can_see_events:
            events = LockEvent.objects.filter(name=name).select_related("user")[:RECENT_EVENTS]
            try:
                events_url = (
                    reverse("admin:django_distlock_lockevent_changelist")
                    + "?"
                    + urlencode({"name": name})
                )
            except NoReverseMatch:
                events_url = None
        now = time.time()
        rows = [Row(hold, now, force_release_url=self._force_release_url(hold)) for hold in holds]
        row = rows[0] if rows else None
        context = self._context(
            request,
            _("Held lock “%(name)s”") % {"name": name} if held else _("Lock not held"),
            name=name,
            row=row,
            rows=rows,
            held=held,
            events=events,
            can_see_events=can_see_events,
            events_url=events_url,
            force_release_url=row.force_release_url if row is not None else None,
        )
        return TemplateResponse(
            request,
            "admin/django_distlock/heldlock/detail.html",
            context,
            status=200 if held is not None else 404,
        )

    # -- force release ------------------------------------------------------------------

    def force_release_view(self, request: HttpRequest) -> HttpResponse:
        """The selected locks (``lock=token:fence:name``, repeated) are confirmed on GET
        (the detail page's button) or on a POST without ``confirm`` (the changelist's
        selection, too long for a URL); the page offers to release only the holds still
        there, and no button when none is. The POST of the confirmation page
        (CSRF-checked, ``confirm=yes``) releases each one *if it still has the token
        shown* (a compare-and-delete), logs it, reports with ``messages`` and redirects."""
        return require_http_methods(["GET", "POST"])(self._force_release)(request)

    def _force_release(self, request: HttpRequest) -> HttpResponse:
        self._check_view(request)
        if not self.has_force_release_permission(request):
            raise PermissionDenied
        try:
            return self._confirm_or_release(request)
        except LockBackendUnavailable as exc:
            return self._unavailable(request, exc)

    def _confirm_or_release(self, request: HttpRequest) -> HttpResponse:
        data = request.POST if request.method == "POST" else request.GET
        selected = [
            parsed for parsed in map(parse_selection, data.getlist("lock")) if parsed is not None
        ]
        if not selected:
            self.message_user(request, _("No lock was selected."), messages.WARNING)
            return HttpResponseRedirect(self._url("changelist"))
        current: dict[str, list[HeldLock]] = {}
        for held in HeldLock.objects.filter(name__in=[name for _t, _f, name in selected]):
            current.setdefault(held.name, []).append(held)

        def same_hold(token: str, name: str) -> HeldLock | None:
            return next((held for held in current.get(name, ()) if held.token == token), None)

        if request.method == "POST" and request.POST.get("confirm") == "yes":
            for token, fence, name in selected:
                self._release_one(request, token, fence, name, same_hold(token, name))
            return HttpResponseRedirect(self._url("changelist"))
        now = time.time()
        items = []
        for token, fence, name in selected:
            held = same_hold(token, name)
            others = current.get(name, [])
            items.append(
                {
                    "name": name,
                    "token": token,
                    "fence": fence,
                    "selection": f"{token}:{fence}:{name}",
                    "row": Row(held, now) if held is not None else None,
                    # Only a hold still there as the operator saw it is offered (and
                    # posted) for release: for the others it would release nothing.
                    "releasable": held is not None,
                    "gone": not others,
                    # Another exclusive holder has it now; or this shared or limited hold
                    # ended while others of the lock remain (neither is touched).
                    "changed_hands": held is None and any(h.mode == Mode.EXCLUSIVE for h in others),
                    "hold_ended": held is None and any(h.mode != Mode.EXCLUSIVE for h in others),
                }
            )
        releasable = [item for item in items if item["releasable"]]
        context = self._context(
            request,
            _("Force release held locks") if releasable else _("Nothing to force release"),
            items=items,
            releasable=releasable,
            force_release_url=self._url("force_release"),
        )
        return TemplateResponse(
            request, "admin/django_distlock/heldlock/force_release_confirmation.html", context
        )

    def _release_one(
        self,
        request: HttpRequest,
        token: str,
        fence: int | None,
        name: str,
        current: HeldLock | None,
    ) -> None:
        # Always released by the token the operator saw: the hold read now lends its
        # metadata (and its mode) to the event only when it is still that same hold.
        held = current if current is not None else HeldLock(name=name, token=token, fence=fence)
        try:
            released = held.release(force=True, by=request.user)
        except (TypeError, ValueError) as exc:
            self.message_user(
                request,
                _("Lock “%(name)s” was not released: %(error)s") % {"name": name, "error": exc},
                messages.ERROR,
            )
            return
        if released:
            if held.mode in (Mode.SHARED, Mode.LIMITED):
                message = _(
                    "Force-released a %(mode)s hold of lock “%(name)s” (fence %(fence)s); "
                    "its other holds are untouched."
                ) % {"name": name, "fence": fence, "mode": held.mode}
            else:
                message = _("Force-released lock “%(name)s” (fence %(fence)s).") % {
                    "name": name,
                    "fence": fence,
                }
            LogEntry.objects.log_actions(
                user_id=request.user.pk,
                queryset=[held],
                action_flag=DELETION,
                change_message=message,
                single_object=True,
            )
            self.message_user(request, message, messages.SUCCESS)
        else:
            self.message_user(
                request,
                _(
                    "Lock “%(name)s” (fence %(fence)s) was not released: it changed hands "
                    "or expired since you saw it, and was left untouched."
                )
                % {"name": name, "fence": fence},
                messages.ERROR,
            )
