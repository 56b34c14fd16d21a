"""What a held lock looks like on the admin's pages: a table row's computed cells, and
the value a checkbox or a confirmation form carries to name one hold."""

from __future__ import annotations

from django.templatetags.static import static
from django.utils.translation import gettext as _

from ..commands.durations import format_duration
from ..models import HeldLock

__all__ = ["ICONS", "Icons", "Row", "parse_selection", "selection_value"]


class Icons(dict[bool, str]):
    """The admin's yes/no icons, resolved once (``static()`` may hash file names)."""

    def __missing__(self, key: bool) -> str:
        url = static(f"admin/img/icon-{'yes' if key else 'no'}.svg")
        self[key] = url
        return url


ICONS = Icons()


def selection_value(held: HeldLock) -> str:
    """What a checkbox or a confirmation form carries: the token and fence the operator
    saw (the token names one hold), then the name (last: it may contain ``:``)."""
    return f"{held.token}:{held.fence}:{held.name}"


def parse_selection(value: str) -> tuple[str, int | None, str] | None:
    """``(token, fence, name)`` of a :func:`selection_value` (the fence ``None`` when it
    is not a number), or ``None`` when ``value`` is not one."""
    token, sep, rest = value.partition(":")
    fence_text, sep2, name = rest.partition(":")
    if not (sep and sep2 and token and name):
        return None
    try:
        fence: int | None = int(fence_text)
    except ValueError:
        fence = None
    return token, fence, name


class Row:
    """One hold as the pages show it. Everything a table cell shows is computed here:
    template filters per cell would cost more than the Redis reads of a page."""

    def __init__(
        self, held: HeldLock, now: float, detail_url: str = "", force_release_url: str = ""
    ) -> None:
        self.held = held
        self.detail_url = detail_url
        self.force_release_url = force_release_url
        self.selection = selection_value(held)
        self.owner = held.owner
        self.mode_label = held.mode_label
        self.acquired_at_iso = held.acquired_at.isoformat()
        self.held_for = format_duration(now - held.acquired_at.timestamp())
        self.ttl_seconds = f"{max(held.ttl, 0.0):.3f}"
        self.ttl_display = f"{round(max(held.ttl, 0.0))}s"
        self.lease_display = format_duration(held.lease)
        self.expires_at_ms = int((now + max(held.ttl, 0.0)) * 1000)
        # The holder's watchdog renews at a third of the lease: the countdown shows that.
        self.renew_every = f"{held.lease / 3:.3f}" if held.auto_renew else ""
        self.auto_renew_icon = ICONS[held.auto_renew]
        self.auto_renew_label = _("yes") if held.auto_renew else _("no")
