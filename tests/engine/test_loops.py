"""The last loop's value (``LastLoop``): found for that loop only, never for another."""

from __future__ import annotations

import asyncio
import gc

from django_distlock.engine.loops import LastLoop


def test_a_value_is_found_for_its_loop_only():
    last: LastLoop[str] = LastLoop()
    first, second = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        assert last.get(first) is None
        last.remember(first, "first's")
        assert last.get(first) == "first's"
        assert last.get(second) is None
        last.remember(second, "second's")
        assert last.get(second) == "second's"
        assert last.get(first) is None
        last.forget()
        assert last.get(second) is None
    finally:
        first.close()
        second.close()


def test_the_loop_is_not_kept_alive():
    last: LastLoop[str] = LastLoop()
    loop = asyncio.new_event_loop()
    last.remember(loop, "value")
    loop.close()
    del loop
    gc.collect()
    assert last._last[0]() is None
