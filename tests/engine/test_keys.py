"""Validation of user input and the key layout of a lock (pure: no server needed)."""

from __future__ import annotations

import collections
import math
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from django_distlock.engine import MAX_NAME_LENGTH, MAX_SECONDS, LockKeys, validate_name
from django_distlock.engine.keys import (
    BUCKETS,
    ENGINE_KINDS,
    MAX_CONTEXT_LENGTH,
    bucket_of,
    clean_label,
    index_key,
    validate_context,
    validate_prefix,
    validate_seconds,
)

EMOJI = "\N{GRINNING FACE}"

valid_names = st.text(
    st.characters(exclude_categories=("Cs",), exclude_characters="\x00"),
    min_size=1,
    max_size=MAX_NAME_LENGTH,
)
# Names stressing the hash tag and escaping: braces, percent signs, their escapes.
tricky_names = st.text(
    st.sampled_from(["{", "}", "%", "7", "B", "D", "2", "5", "a", EMOJI]), min_size=1, max_size=12
)


def slot(key: str) -> int:
    return key_slot(key.encode())


def per_lock_keys(keys: LockKeys) -> list[str]:
    """Every key of one lock except its bucket's listing index, with a sample wake list."""
    return [key for key in keys.all("0123456789abcdef") if key != keys.index]


# -- names ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "a",
        "invoice:42",
        "x" * MAX_NAME_LENGTH,
        EMOJI * MAX_NAME_LENGTH,
        "{braces}%25 and spaces\nnewline",
        "index",
    ],
    ids=["one-char", "plain", "512-ascii", "512-emoji", "special", "index"],
)
def test_valid_names_are_returned_unchanged(name):
    assert validate_name(name) is name


def test_name_length_is_counted_in_code_points():
    assert MAX_NAME_LENGTH == 512
    assert len((EMOJI * 512).encode()) == 2048  # far over 512 bytes, still valid
    assert validate_name(EMOJI * 512) == EMOJI * 512
    with pytest.raises(ValueError, match="at most 512"):
        validate_name(EMOJI * 513)


@pytest.mark.parametrize(
    ("name", "error"),
    [
        (None, TypeError),
        (42, TypeError),
        (b"bytes", TypeError),
        (["list"], TypeError),
        ("", ValueError),
        ("x" * (MAX_NAME_LENGTH + 1), ValueError),
        ("nul\x00inside", ValueError),
        ("\x00", ValueError),
        ("lone \ud800 surrogate", ValueError),
        ("\udfff", ValueError),
    ],
    ids=[
        "none",
        "int",
        "bytes",
        "list",
        "empty",
        "513-chars",
        "nul",
        "only-nul",
        "high-surrogate",
        "low-surrogate",
    ],
)
def test_invalid_names_are_rejected_naming_the_argument(name, error):
    with pytest.raises(error, match=r"^name "):
        validate_name(name)
    with pytest.raises(error, match=r"^formatted lock name "):
        validate_name(name, "formatted lock name")


@given(valid_names)
def test_every_valid_name_is_accepted(name):
    assert validate_name(name) == name


@given(
    st.one_of(
        st.text(max_size=20).map(lambda s: s + "\x00"),
        st.text(min_size=MAX_NAME_LENGTH + 1, max_size=MAX_NAME_LENGTH + 40),
        st.text(max_size=5).map(lambda s: s + "\ud834"),
        st.integers(),
        st.binary(),
        st.none(),
        st.floats(),
    )
)
def test_every_invalid_name_is_rejected(name):
    with pytest.raises((TypeError, ValueError), match=r"^name "):
        validate_name(name)


# -- seconds ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [1, 0.5, 0.001, 30, 7 * 24 * 3600.0])
def test_valid_seconds_are_returned_as_float(value):
    seconds = validate_seconds(value, "timeout")
    assert isinstance(seconds, float)
    assert seconds == value


def test_zero_seconds_only_when_allowed():
    assert validate_seconds(0, "blocking_timeout", allow_zero=True) == 0.0
    assert validate_seconds(0.0, "blocking_timeout", allow_zero=True) == 0.0
    with pytest.raises(ValueError, match="timeout must be positive"):
        validate_seconds(0, "timeout")


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (0, ValueError),
        (-1, ValueError),
        (-0.5, ValueError),
        (1e-4, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        (-math.inf, ValueError),
        (True, TypeError),
        (False, TypeError),
        ("1", TypeError),
        (None, TypeError),
        ([1], TypeError),
    ],
    ids=repr,
)
def test_invalid_seconds_are_rejected_naming_the_argument(value, error):
    with pytest.raises(error, match=r"^extend_by "):
        validate_seconds(value, "extend_by")


@pytest.mark.parametrize("value", [-1, -1e-9, math.nan, math.inf, True, "0"], ids=repr)
def test_invalid_seconds_are_rejected_even_when_zero_is_allowed(value):
    with pytest.raises((TypeError, ValueError), match=r"^blocking_timeout "):
        validate_seconds(value, "blocking_timeout", allow_zero=True)


@pytest.mark.parametrize("allow_zero", [False, True])
def test_max_seconds_is_accepted(allow_zero):
    assert validate_seconds(MAX_SECONDS, "timeout", allow_zero=allow_zero) == MAX_SECONDS
    assert validate_seconds(float(MAX_SECONDS), "timeout", allow_zero=allow_zero) == MAX_SECONDS


@pytest.mark.parametrize(
    "value",
    [MAX_SECONDS + 1, MAX_SECONDS + 0.001, 1e16, 2**63, 10**400, -(10**400), 1.7e308],
    ids=["max+1", "max+1ms", "1e16", "2**63", "10**400", "-10**400", "1.7e308"],
)
@pytest.mark.parametrize("allow_zero", [False, True])
def test_too_large_seconds_are_rejected_naming_the_argument(value, allow_zero):
    # 10**400 used to raise OverflowError; 1e16 used to pass and fail in Redis.
    with pytest.raises(ValueError, match=r"^extend_by must be "):
        validate_seconds(value, "extend_by", allow_zero=allow_zero)


def test_a_huge_int_is_not_printed_in_the_message():
    with pytest.raises(ValueError, match=r"at most 31536000 seconds .* not an int of"):
        validate_seconds(10**5000, "timeout")  # more digits than Python will print


def test_a_larger_maximum_can_be_asked_for():
    assert validate_seconds(2 * MAX_SECONDS, "retention", maximum=3 * MAX_SECONDS) > MAX_SECONDS
    with pytest.raises(ValueError, match=r"^retention must be at most"):
        validate_seconds(4 * MAX_SECONDS, "retention", maximum=3 * MAX_SECONDS)


outside_seconds = st.one_of(
    st.floats(max_value=0.001, exclude_max=True),
    st.floats(min_value=MAX_SECONDS, exclude_min=True),
    st.integers(max_value=0),
    st.integers(min_value=MAX_SECONDS + 1),
    st.sampled_from([math.nan, math.inf, -math.inf, 10**400, -(10**400)]),
)


@given(outside_seconds)
def test_every_duration_outside_the_bounds_is_refused(value):
    with pytest.raises((TypeError, ValueError), match=r"^timeout "):
        validate_seconds(value, "timeout")


@given(
    st.one_of(
        st.floats(min_value=0.001, max_value=MAX_SECONDS),
        st.integers(min_value=1, max_value=MAX_SECONDS),
    )
)
def test_every_duration_inside_the_bounds_is_accepted(value):
    assert validate_seconds(value, "timeout") == value


# -- prefix -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "error"),
    [
        ("", ValueError),
        ("{app}:", ValueError),
        ("app{", ValueError),
        ("app}", ValueError),
        ("a\x00b:", ValueError),
        (None, TypeError),
        (b"app:", TypeError),
    ],
    ids=repr,
)
def test_invalid_prefixes_are_rejected(prefix, error):
    with pytest.raises(error, match="prefix"):
        validate_prefix(prefix)


def test_valid_prefix_is_returned():
    assert validate_prefix("myapp:locks:") == "myapp:locks:"


# -- context and owner labels ----------------------------------------------------------


@pytest.mark.parametrize(
    "context",
    ["", "manage.py nightly", "x" * MAX_CONTEXT_LENGTH, EMOJI * MAX_CONTEXT_LENGTH, "a\nb ü"],
    ids=["empty", "plain", "255-ascii", "255-emoji", "newline"],
)
def test_valid_contexts_are_returned_unchanged(context):
    assert validate_context(context) is context


@pytest.mark.parametrize(
    ("context", "error"),
    [
        (7, TypeError),
        (None, TypeError),
        (b"ctx", TypeError),
        ("a\x00b", ValueError),
        ("lone\ud800", ValueError),
        ("x" * (MAX_CONTEXT_LENGTH + 1), ValueError),
        (EMOJI * (MAX_CONTEXT_LENGTH + 1), ValueError),
    ],
    ids=repr,
)
def test_invalid_contexts_are_rejected_naming_the_argument(context, error):
    with pytest.raises(error, match=r"^context "):
        validate_context(context)
    with pytest.raises(error, match=r"^label of the view "):
        validate_context(context, "label of the view")


@pytest.mark.parametrize(
    ("text", "cleaned"),
    [
        ("MainThread", "MainThread"),
        ("worker\x00-1", "worker-1"),
        ("job-\udcff.sh", "job-.sh"),  # an undecodable byte of a file name (surrogateescape)
        ("t" * 300, "t" * 255),
        (EMOJI * 300, EMOJI * 255),
    ],
    ids=["plain", "nul", "surrogate", "long", "long-emoji"],
)
def test_clean_label_drops_what_cannot_be_stored_and_truncates(text, cleaned):
    assert clean_label(text) == cleaned


def test_clean_label_takes_a_limit():
    assert clean_label("abcdef", limit=3) == "abc"


@given(st.text())
def test_every_cleaned_label_is_a_valid_context(text):
    assert validate_context(clean_label(text)) == clean_label(text)


# -- key layout -------------------------------------------------------------------------


def test_key_layout_of_a_plain_name():
    keys = LockKeys.for_name("app:", "invoice:42")
    tag = f"{{{bucket_of('invoice:42'):02x}}}"
    assert keys.lock == f"app:{tag}:lock:invoice:42"
    assert keys.fence == f"app:{tag}:fence:invoice:42"
    assert keys.index == index_key("app:", bucket_of("invoice:42")) == f"app:{tag}:index"
    assert keys.wake("0123456789abcdef") == f"app:{tag}:wake:0123456789abcdef:invoice:42"
    waiter_keys = keys.all("0123456789abcdef")
    assert len(set(waiter_keys)) == len(waiter_keys) == 10
    assert waiter_keys[0] == keys.lock  # KEYS[1] of every script is the lock itself
    assert keys.all()[6] == keys.signal  # no waiter: KEYS[7] is the shared list


def test_a_name_is_in_a_stable_bucket():
    """The bucket is part of where a lock lives: it must never depend on the process
    (Python's hash() is salted per process) or change between versions."""
    assert [bucket_of(name) for name in ("a", "invoice:42", "ü", EMOJI)] == [
        zlib.crc32(name.encode()) % BUCKETS for name in ("a", "invoice:42", "ü", EMOJI)
    ]
    assert bucket_of("invoice:42") == 0xEE  # pinned: a changed hash moves every lock


def test_buckets_spread_over_the_cluster_slots_and_names_over_buckets():
    slots = {slot(index_key("distlock:", bucket)) for bucket in range(BUCKETS)}
    assert len(slots) == BUCKETS  # every bucket a slot of its own
    counts = collections.Counter(bucket_of(f"invoice:{i}") for i in range(BUCKETS * 40))
    assert len(counts) == BUCKETS
    assert max(counts.values()) < 3 * 40  # no bucket takes a crowd


@given(valid_names, st.sampled_from(["distlock:", "p:", "my app/locks%:"]))
def test_every_key_lives_under_the_prefix(name, prefix):
    keys = LockKeys.for_name(prefix, name)
    for key in (*keys.all("0123456789abcdef"), keys.signal):
        assert key.startswith(prefix)


@given(st.one_of(valid_names, tricky_names))
def test_all_keys_of_one_lock_and_its_index_share_one_cluster_slot(name):
    keys = LockKeys.for_name("distlock:", name)
    assert {slot(key) for key in keys.all("0123456789abcdef")} == {slot(keys.index)}


@pytest.mark.parametrize(
    "name",
    ["{", "}", "{}", "}{", "a{b}c", "%", "%7B", "{x", f"{EMOJI}{{{EMOJI}}}", "{{ab}}"],
)
def test_braces_in_a_name_cannot_move_its_keys_to_another_slot(name):
    """The bucket's tag comes first in every key (the prefix may hold no brace), so it is
    the tag Redis Cluster hashes, whatever braces the name holds."""
    keys = LockKeys.for_name("distlock:", name)
    tag = f"{bucket_of(name):02x}"
    assert keys.lock.startswith(f"distlock:{{{tag}}}:")
    assert {slot(key) for key in keys.all("0123456789abcdef")} == {key_slot(tag.encode())}


@given(st.one_of(valid_names, tricky_names), st.one_of(valid_names, tricky_names))
def test_different_names_share_no_key_but_a_bucket_index(first, second):
    if first == second:
        return
    a = LockKeys.for_name("distlock:", first)
    b = LockKeys.for_name("distlock:", second)
    assert set(per_lock_keys(a)) & set(per_lock_keys(b)) == set()
    assert (a.index == b.index) == (bucket_of(first) == bucket_of(second))


def test_a_name_never_reads_as_another_key_of_a_lock():
    """The kind comes before the name: "a:fence" is a lock of its own, not the fence
    counter of "a", and "index" is not the index."""
    a, a_fence = LockKeys.for_name("p:", "a"), LockKeys.for_name("p:", "a:fence")
    assert a_fence.lock != a.fence
    assert a_fence.lock.endswith(":lock:a:fence")
    index = LockKeys.for_name("p:", "index")
    assert index.lock.endswith(":lock:index")
    assert index.lock != index.index


# -- keys beside a lock -------------------------------------------------------------------


@given(st.one_of(valid_names, tricky_names))
def test_a_key_beside_a_lock_shares_its_slot_and_prefix(name):
    keys = LockKeys.for_name("distlock:", name)
    beside = keys.beside("celery-claim")
    assert beside == f"distlock:{{{bucket_of(name):02x}}}:celery-claim:{name}"
    assert slot(beside) == slot(keys.lock)


@pytest.mark.parametrize(
    "kind", ["lock", "fence", "waiting", "index", "queue", "queue-deadlines", "signal", "wake"]
)
def test_the_engines_own_kinds_cannot_be_used_beside_a_lock(kind):
    with pytest.raises(ValueError, match="cannot name a kind"):
        LockKeys.for_name("p:", "a").beside(kind)


@pytest.mark.parametrize("kind", ["", "a:b", "A", "-a", "a b", "{x}", "celery-claim:x"])
def test_a_kind_is_lowercase_letters_digits_and_dashes(kind):
    with pytest.raises(ValueError, match="cannot name a kind"):
        LockKeys.for_name("p:", "a").beside(kind)


def test_engine_kinds_name_every_key_the_engine_writes():
    """``ENGINE_KINDS`` is kept by hand: every key of a lock must be in it, or a layer
    built on locks could name a key of its own like one of the engine's."""
    keys = LockKeys.for_name("p:", "a")
    written = [*keys.all("0123456789abcdef"), keys.holder_index]
    kinds = {key.removeprefix(keys.tag_prefix).split(":", 1)[0] for key in written}
    assert kinds <= ENGINE_KINDS
    assert kinds == ENGINE_KINDS
