"""Text for a terminal: escaping what came from Redis, timestamps, fixed-width tables.

Lock names, hosts and context labels are written by any process that can reach Redis,
so everything the management commands print from there goes through
:func:`escape_for_terminal` first. No Django import.
"""

from __future__ import annotations

import datetime
import time
import unicodedata
from collections.abc import Collection, Mapping, Sequence

from .durations import format_duration

__all__ = [
    "escape_for_terminal",
    "render_table",
    "timestamp_and_age",
    "utc_timestamp",
]

_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def _escape(char: str) -> str:
    named = _NAMED_ESCAPES.get(char)
    if named is not None:
        return named
    if unicodedata.category(char) not in _UNSAFE_CATEGORIES:
        return char
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def escape_for_terminal(text: str) -> str:
    """``text`` safe to print on a terminal: control and format characters (escape
    sequences, bidi overrides, line breaks) become Python-style escapes (``\\x1b``,
    ``\\u202e``), and so does the backslash, so that the output is unambiguous.

    Lock names and owner labels come from any process that can reach Redis; printing
    them raw would let one rewrite an operator's screen.

    >>> escape_for_terminal("job\\x1b[2J")
    'job\\\\x1b[2J'
    """
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(_escape(char) for char in text)


def utc_timestamp(moment: datetime.datetime) -> str:
    """``2026-11-22 10:01:02 UTC`` for an aware datetime.

    >>> utc_timestamp(datetime.datetime(2026, 11, 22, 10, 1, 2, tzinfo=datetime.UTC))
    '2026-11-22 10:01:02 UTC'
    """
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def timestamp_and_age(moment: datetime.datetime, *, now: float | None = None) -> str:
    """``2026-11-22 10:01:02 UTC (12s ago)``: when, and how long before ``now`` (a
    ``time.time()`` value, default: the current time)."""
    age = (time.time() if now is None else now) - moment.timestamp()
    return f"{utc_timestamp(moment)} ({format_duration(age)} ago)"


def _display_width(text: str) -> int:
    width = 0
    for char in text:
        if unicodedata.combining(char):
            continue
        width += 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
    return width


def _fit(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` terminal cells, ending with ``…`` when cut."""
    if _display_width(text) <= limit:
        return text
    kept, width = [], 0
    for char in text:
        char_width = _display_width(char)
        if width + char_width > limit - 1:
            break
        kept.append(char)
        width += char_width
    return "".join(kept) + "…"


def _pad(text: str, width: int, *, right: bool) -> str:
    fill = " " * (width - _display_width(text))
    return fill + text if right else text + fill


def render_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    column_limits: Mapping[str, int] | None = None,
    right_aligned: Collection[str] = (),
) -> list[str]:
    """Lines of a fixed-width table: a header line, a line of dashes, one line per row.

    Cells must already be escaped for a terminal. Widths are counted in terminal cells
    (wide East Asian characters take two). A column named in ``column_limits`` is cut
    to that many cells, ending with ``…``; columns named in ``right_aligned`` are
    aligned right (numbers, durations).

    >>> for line in render_table(["NAME", "TTL"], [["job", "4.2s"]], right_aligned={"TTL"}):
    ...     print(line)
    NAME   TTL
    ----  ----
    job   4.2s
    """
    limits = column_limits or {}
    cells = [
        [
            _fit(cell, limits[header]) if header in limits else cell
            for header, cell in zip(headers, row, strict=True)
        ]
        for row in rows
    ]
    widths = [
        max([_display_width(header)] + [_display_width(row[i]) for row in cells])
        for i, header in enumerate(headers)
    ]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            _pad(value, width, right=header in right_aligned)
            for header, value, width in zip(headers, values, widths, strict=True)
        ).rstrip()

    return [line(headers), line(["-" * width for width in widths])] + [line(r) for r in cells]
