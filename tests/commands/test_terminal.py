"""``django_distlock.commands.terminal``: escaping, timestamps and tables for a terminal."""

from __future__ import annotations

import datetime

import pytest

from django_distlock.commands.terminal import (
    escape_for_terminal,
    render_table,
    timestamp_and_age,
    utc_timestamp,
)

MOMENT = datetime.datetime(2026, 11, 22, 10, 1, 2, tzinfo=datetime.UTC)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain:name", "plain:name"),
        ("tab\there", "tab\\there"),
        ("esc\x1b[31m", "esc\\x1b[31m"),
        ("bidi\u202eevil", "bidi\\u202eevil"),
        ("back\\slash", "back\\\\slash"),
        ("café ☕ 日本", "café ☕ 日本"),
        ("nbsp\u00a0ok", "nbsp\u00a0ok"),
    ],
)
def test_escape_for_terminal(text, shown):
    assert escape_for_terminal(text) == shown


def test_utc_timestamp_converts_to_utc():
    paris = datetime.timezone(datetime.timedelta(hours=1))
    assert utc_timestamp(MOMENT.astimezone(paris)) == "2026-11-22 10:01:02 UTC"


def test_timestamp_and_age():
    now = MOMENT.timestamp() + 192
    assert timestamp_and_age(MOMENT, now=now) == "2026-11-22 10:01:02 UTC (3m 12s ago)"


def test_timestamp_and_age_reads_a_future_moment_as_now():
    # Clock skew between hosts: the holder's clock may run ahead of ours.
    assert timestamp_and_age(MOMENT, now=MOMENT.timestamp() - 5).endswith("(0s ago)")


def test_render_table_pads_columns_and_aligns_right_where_asked():
    lines = render_table(
        ["NAME", "FENCE", "NOTE"],
        [["a", "7", "x"], ["longer-name", "12345", ""]],
        right_aligned={"FENCE"},
    )
    assert lines == [
        "NAME         FENCE  NOTE",
        "-----------  -----  ----",
        "a                7  x",
        "longer-name  12345",
    ]


def test_render_table_cuts_limited_columns():
    lines = render_table(["NAME", "TTL"], [["x" * 20, "5s"]], column_limits={"NAME": 8})
    assert lines[2] == "xxxxxxx…  5s"


def test_render_table_counts_wide_characters_as_two_cells():
    lines = render_table(["NAME", "TTL"], [["日本語", "5s"], ["ab", "1s"]])
    assert lines == ["NAME    TTL", "------  ---", "日本語  5s", "ab      1s"]
    cut = render_table(["NAME"], [["日本語です"]], column_limits={"NAME": 6})
    assert cut[2] == "日本…"


def test_render_table_without_rows_is_the_header():
    assert render_table(["NAME", "TTL"], []) == ["NAME  TTL", "----  ---"]
