"""``django_distlock.commands.durations``: reading and writing ``30d``, ``12h``, ``90m``,
``45s``."""

from __future__ import annotations

import argparse
import datetime

import pytest

from django_distlock.commands.durations import (
    duration_type,
    format_duration,
    format_milliseconds,
    parse_duration,
    seconds_type,
)
from django_distlock.engine.keys import MAX_SECONDS


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30d", 30 * 86400),
        ("12h", 12 * 3600),
        ("90m", 5400),
        ("45s", 45),
        ("3600", 3600),
        ("1.5", 1.5),
        ("0", 0),
        (" 2h ", 7200),
        ("0.5m", 30),
    ],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == datetime.timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty duration"),
        ("   ", "empty duration"),
        ("-5", "must not be negative"),
        ("-1h", "must not be negative"),
        ("5w", "unknown unit 'w'"),
        ("5ms", "unknown unit 'ms'"),
        ("5D", "unknown unit 'D'"),
        ("h", "invalid duration"),
        ("1e3", "invalid duration"),
        ("5 m", "invalid duration"),
        ("1h30m", "invalid duration"),
        ("nan", "invalid duration"),
        ("inf", "invalid duration"),
        (".5", "invalid duration"),
        ("1_000", "invalid duration"),
        ("٣", "invalid duration"),  # a non-ASCII digit
        ("999999999999d", "too large"),
        ("9" * 5000, "too large"),
    ],
)
def test_parse_duration_rejects(text, message):
    with pytest.raises(ValueError, match=message):
        parse_duration(text)


def test_parse_duration_rejects_non_strings():
    with pytest.raises(TypeError):
        parse_duration(30)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (-3, "0s"),
        (4.25, "4.2s"),
        (45, "45s"),
        (192, "3m 12s"),
        (180, "3m"),
        (7500, "2h 5m"),
        (3 * 86400 + 4 * 3600 + 5, "3d 4h"),
        (30 * 86400, "30d"),
    ],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(float("nan"), "?"), (float("inf"), "forever"), (3 * 3600, "3h"), (86400 + 3600, "1d 1h")],
)
def test_format_duration_edges(seconds, text):
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    ("milliseconds", "text"),
    [
        (None, "-"),
        (0.0, "0ms"),
        (0.35, "0.3ms"),
        (5.5, "5.5ms"),
        (412.4, "412ms"),
        (999.6, "1.0s"),
        (1234.5, "1.2s"),
        (29981.06513600004, "30s"),  # rounded, not cut to 29s
        (192_400.0, "3m 12s"),
        (7_500_000.0, "2h 5m"),
    ],
)
def test_format_milliseconds(milliseconds, text):
    """A lock event's wait or hold time (recorded in milliseconds) as people read it."""
    assert format_milliseconds(milliseconds) == text


def test_duration_type_is_parse_duration_for_argparse():
    assert duration_type("2d") == datetime.timedelta(days=2)
    with pytest.raises(argparse.ArgumentTypeError, match="unknown unit 'w'"):
        duration_type("5w")


def test_seconds_type_reads_durations_as_seconds():
    seconds = seconds_type(allow_zero=True)
    assert seconds("5m") == 300.0
    assert seconds("1.5") == 1.5
    assert seconds("0") == 0.0
    assert seconds(str(MAX_SECONDS)) == MAX_SECONDS


@pytest.mark.parametrize(
    ("allow_zero", "text", "message"),
    [
        (False, "0", "must be more than zero seconds"),
        (False, "0.0001", "must be more than zero seconds"),
        (True, "366d", "must be at most 31536000 seconds"),
        (True, "soon", "invalid duration"),
    ],
)
def test_seconds_type_rejects(allow_zero, text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        seconds_type(allow_zero=allow_zero)(text)
