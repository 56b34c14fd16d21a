"""``HeldLock.objects``: live locks read from Redis, and force release.

Every test runs on each topology (single server, Sentinel, Cluster: ``DISTLOCK`` says
which, see ``locks_on``) unless it is about one server.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis
from django.core.exceptions import FieldError
from django.test import override_settings

from django_distlock import LockLost, distlock
from django_distlock.commands.terminal import escape_for_terminal
from django_distlock.connections import get_backend
from django_distlock.engine import Lock, Tuning, force_release
from django_distlock.engine.keys import BUCKETS
from django_distlock.managers import HeldLockQuerySet, owner_label
from django_distlock.models import HeldLock
from django_distlock.signals import lock_force_released
from tests.support.engine import keys_of, lock_key, stored_lock
from tests.support.events import events_mode
from tests.support.probe import Topology, every_topology, single_server_only  # noqa: F401

PREFIX = "distlock:"


def index_of(name: str) -> str:
    """The listing index of the bucket ``name`` lives in."""
    return keys_of(name).index


@pytest.fixture(autouse=True)
def locks_on(topology: Topology) -> Iterator[Callable[..., override_settings]]:
    """Locks on the test's topology, no events; ``locks_on(**options)`` overrides
    ``DISTLOCK`` with more options on the same topology."""

    def distlock_setting(**options: object) -> override_settings:
        return override_settings(
            DISTLOCK={"EVENTS": "off", **topology.distlock_settings(), **options}
        )

    with distlock_setting():
        yield distlock_setting


def _names(queryset: object) -> list[str]:
    return [held.name for held in queryset]  # type: ignore[attr-defined]


def _command_calls(client: redis.Redis) -> dict[str, int]:
    return {
        name.removeprefix("cmdstat_"): int(stats["calls"])
        for name, stats in client.info("commandstats").items()
    }


def test_lists_held_locks_with_their_owner(redis_client, hold):
    before = dt.datetime.now(dt.UTC)
    unfair = hold.enter_context(distlock("invoice:42", context="billing.pay", timeout=20))
    fair = hold.enter_context(distlock("cart:7", fair=True, auto_renew=False, timeout=40))
    after = dt.datetime.now(dt.UTC)

    listed = list(HeldLock.objects.all())

    assert [held.name for held in listed] == ["cart:7", "invoice:42"]
    cart, invoice = listed
    assert isinstance(invoice, HeldLock)
    assert invoice._state.adding is False
    assert invoice.host == socket.gethostname()
    assert invoice.pid == os.getpid()
    assert invoice.thread == threading.current_thread().name
    assert invoice.context == "billing.pay"
    assert invoice.fence == unfair.fence
    assert invoice.token == unfair.token
    assert invoice.lease == 20
    assert 15 < invoice.ttl <= 20
    assert invoice.auto_renew is True
    assert invoice.acquired_at.tzinfo is dt.UTC
    # Server clock and ours are the same machine's.
    slack = dt.timedelta(seconds=1)
    assert before - slack <= invoice.acquired_at <= after + slack
    assert cart.fence == fair.fence
    assert cart.token == fair.token
    assert cart.auto_renew is False
    assert cart.lease == 40
    assert 35 < cart.ttl <= 40
    assert cart.acquired_at >= invoice.acquired_at


def test_odd_names_are_listed_and_matched_literally(redis_client, hold):
    names = [
        "a*",
        "a?",
        "a[bc]",
        "ab",
        "abc",
        "a.*",
        "<b>pay</b>&amp;",
        "{tag}%7B",
        "line\nbreak",
        "x" * 512,
        "🔒" * 512,
    ]
    for name in names:
        hold.enter_context(distlock(name))

    assert _names(HeldLock.objects.all()) == sorted(names)
    for name in names:
        assert _names(HeldLock.objects.filter(name=name)) == [name]
        assert HeldLock.objects.get(name=name).name == name
    # As a glob, "a*" would match every name starting with "a", "a?" both "ab" and "a?",
    # and "a[bc]" both "ab" and "ac"; as a regex "a.*" would match everything.
    assert _names(HeldLock.objects.filter(name__startswith="a*")) == ["a*"]
    assert _names(HeldLock.objects.filter(name__startswith="a?")) == ["a?"]
    assert _names(HeldLock.objects.filter(name__startswith="a[")) == ["a[bc]"]
    assert _names(HeldLock.objects.filter(name__contains=".*")) == ["a.*"]
    assert _names(HeldLock.objects.filter(name__contains="[bc]")) == ["a[bc]"]
    assert _names(HeldLock.objects.filter(name__contains="<b>")) == ["<b>pay</b>&amp;"]
    assert _names(HeldLock.objects.filter(name__startswith="🔒🔒")) == ["🔒" * 512]
    assert _names(HeldLock.objects.filter(name__in=["a*", "a?", "missing", "x" * 512])) == [
        "a*",
        "a?",
        "x" * 512,
    ]


def test_only_locks_under_the_configured_prefix_are_visible(redis_client, hold, locks_on):
    hold.enter_context(distlock("mine"))
    with locks_on(KEY_PREFIX="other-app:"):
        hold.enter_context(distlock("theirs"))
    # A key that looks like a lock but lies outside the prefix, in another index.
    value = 'tok\n1\n1700000000000000\n30000\n{"host":"h","pid":1}'
    redis_client.set("cache:{decoy}", value, px=60_000)
    redis_client.zadd("cache:index", {"decoy": 10**15})
    redis_client.set("distlockX:{decoy}", value, px=60_000)

    assert _names(HeldLock.objects.all()) == ["mine"]
    assert HeldLock.objects.count() == 1
    with pytest.raises(HeldLock.DoesNotExist):
        HeldLock.objects.get(name="theirs")
    with locks_on(KEY_PREFIX="other-app:"):
        assert _names(HeldLock.objects.all()) == ["theirs"]
    assert redis_client.exists("cache:{decoy}", "distlockX:{decoy}") == 2


def test_filters_combine_and_unknown_lookups_are_refused(redis_client, hold):
    for name in ("invoice:4", "invoice:14", "invoice:5", "cart:4"):
        hold.enter_context(distlock(name))

    queryset = HeldLock.objects.filter(name__startswith="invoice:", name__contains="4")
    assert _names(queryset) == ["invoice:14", "invoice:4"]
    assert _names(queryset.filter(name__in=["invoice:4", "cart:4"])) == ["invoice:4"]
    assert _names(HeldLock.objects.filter(pk="cart:4")) == ["cart:4"]
    assert _names(HeldLock.objects.filter(name__exact="cart:4")) == ["cart:4"]
    assert _names(HeldLock.objects.filter(name="cart:4", name__startswith="x")) == []
    assert _names(HeldLock.objects.filter(name__in=[])) == []

    for lookup in ("name__icontains", "name__regex", "host", "fence__gt"):
        with pytest.raises(FieldError, match=lookup):
            HeldLock.objects.filter(**{lookup: "x"})
    with pytest.raises(TypeError, match="name must be a str"):
        HeldLock.objects.filter(name=4)
    with pytest.raises(TypeError, match="iterable of str"):
        HeldLock.objects.filter(name__in="invoice:4")


def test_get_count_exists_first(redis_client, hold):
    assert HeldLock.objects.count() == 0
    assert HeldLock.objects.exists() is False
    assert HeldLock.objects.first() is None
    assert not HeldLock.objects.all()
    with pytest.raises(HeldLock.DoesNotExist):
        HeldLock.objects.get(name="job:1")

    for name in ("job:2", "job:1", "job:3", "other"):
        hold.enter_context(distlock(name))

    assert HeldLock.objects.count() == 4
    assert HeldLock.objects.filter(name__startswith="job:").count() == 3
    assert HeldLock.objects.filter(name__startswith="job:").exists()
    assert not HeldLock.objects.filter(name__startswith="nope").exists()
    assert HeldLock.objects.first().name == "job:1"
    assert HeldLock.objects.order_by("-name").first().name == "other"
    assert HeldLock.objects.get(name="job:2").name == "job:2"
    assert HeldLock.objects.filter(name__startswith="oth").get().name == "other"
    with pytest.raises(HeldLock.MultipleObjectsReturned, match="it returned 3"):
        HeldLock.objects.get(name__startswith="job:")
    queryset = HeldLock.objects.all()
    assert len(queryset) == 4
    assert bool(queryset)


def test_ordering(redis_client, hold):
    # Acquired in this order, with these leases: every ordering differs from the others.
    for name, timeout in (("b", 30), ("c", 10), ("a", 20)):
        hold.enter_context(distlock(name, timeout=timeout, auto_renew=False))

    assert _names(HeldLock.objects.all()) == ["a", "b", "c"]
    assert _names(HeldLock.objects.order_by("-name")) == ["c", "b", "a"]
    assert _names(HeldLock.objects.order_by("-pk")) == ["c", "b", "a"]
    assert _names(HeldLock.objects.order_by("acquired_at")) == ["b", "c", "a"]
    assert _names(HeldLock.objects.order_by("-acquired_at")) == ["a", "c", "b"]
    assert _names(HeldLock.objects.order_by("ttl")) == ["c", "a", "b"]
    assert _names(HeldLock.objects.order_by("-ttl")) == ["b", "a", "c"]
    assert _names(HeldLock.objects.order_by("-ttl").order_by()) == ["a", "b", "c"]
    assert _names(HeldLock.objects.order_by("-acquired_at")[1:]) == ["c", "b"]
    assert HeldLock.objects.order_by("-acquired_at").first().name == "a"
    listed = list(HeldLock.objects.order_by("ttl"))
    assert [held.ttl for held in listed] == sorted(held.ttl for held in listed)

    with pytest.raises(FieldError, match="host"):
        HeldLock.objects.order_by("host")
    with pytest.raises(FieldError, match="fence"):
        HeldLock.objects.order_by("-fence")


def test_descending_orders_are_exact_reverses_even_with_ties(redis_client, hold):
    for name in ("b", "a", "d", "c"):
        hold.enter_context(distlock(name, timeout=30))
    end = int(redis_client.zscore(index_of("a"), "a"))
    for name, score in {"a": end, "b": end, "c": end + 5000, "d": end + 5000}.items():
        redis_client.zadd(index_of(name), {name: score}, xx=True)

    assert _names(HeldLock.objects.order_by("ttl")) == ["a", "b", "c", "d"]
    assert _names(HeldLock.objects.order_by("-ttl")) == ["d", "c", "b", "a"]
    assert _names(HeldLock.objects.filter(name__in=["a", "b", "c"]).order_by("-ttl")) == [
        "c",
        "b",
        "a",
    ]
    assert _names(HeldLock.objects.order_by("ttl", "-name")) == ["b", "a", "d", "c"]


@pytest.mark.parametrize("options", ["decode_responses=True", "protocol=3"])
def test_clients_that_decode_or_speak_resp3(topology, redis_client, locks_on, options):
    with (
        locks_on(**topology.distlock_settings(options)),
        distlock("b🔒"),
        distlock("a", timeout=5),
        distlock("c") as c,
    ):
        assert _names(HeldLock.objects.all()) == ["a", "b🔒", "c"]
        assert _names(HeldLock.objects.filter(name__contains="🔒")) == ["b🔒"]
        assert HeldLock.objects.order_by("ttl").first().name == "a"
        assert HeldLock.objects.order_by("-acquired_at").first().name == "c"
        assert HeldLock.objects.get(name="c").fence == c.fence
        assert 4 < HeldLock.objects.get(name="a").ttl <= 5


def test_slicing(redis_client, hold):
    names = [f"lock:{i:02}" for i in range(12)]
    for name in names:
        hold.enter_context(distlock(name))
    queryset = HeldLock.objects.all()

    assert _names(queryset[:5]) == names[:5]
    assert _names(queryset[3:6]) == names[3:6]
    assert _names(queryset[10:]) == names[10:]
    assert _names(queryset[2:9][1:3]) == names[3:5]
    assert _names(queryset[::4]) == names[::4]
    assert queryset[4].name == "lock:04"
    assert queryset.order_by("-name")[0].name == "lock:11"
    assert queryset[2:9].count() == 7
    assert queryset[10:20].count() == 2
    assert queryset[2:9].first().name == "lock:02"
    with pytest.raises(IndexError):
        queryset[12]
    with pytest.raises(ValueError, match="Negative"):
        queryset[-1]
    with pytest.raises(TypeError, match="slice has been taken"):
        queryset[:3].filter(name="lock:01")
    with pytest.raises(TypeError, match="slice has been taken"):
        queryset[:3].order_by("ttl")
    with pytest.raises(TypeError):
        queryset["lock:01"]


def test_querysets_are_lazy_and_cache_their_results(redis_client, hold):
    hold.enter_context(distlock("first"))
    queryset = HeldLock.objects.filter(name__startswith="")
    assert isinstance(queryset, HeldLockQuerySet)
    chained = queryset.order_by("-name")[:10]
    hold.enter_context(distlock("second"))  # after building, before evaluating

    assert _names(chained) == ["second", "first"]
    hold.enter_context(distlock("third"))
    assert _names(chained) == ["second", "first"]  # evaluated once, then cached
    assert chained.count() == 2
    assert _names(chained.all()) == ["third", "second", "first"]  # a fresh read
    assert "third" in repr(HeldLock.objects.all())


def test_expired_holders_disappear(redis_client, hold):
    crashed = distlock("crashed", timeout=0.2, auto_renew=False)
    assert crashed.acquire()  # never released, like a holder that died
    crashed_until_ms = stored_lock(redis_client, "crashed").lease_end_ms
    hold.enter_context(distlock("alive"))
    # An entry left by a holder whose key has long expired.
    redis_client.zadd(index_of("ancient"), {"ancient": 1})
    deadline = time.monotonic() + 5
    while redis_client.exists(lock_key("crashed")) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not redis_client.exists(lock_key("crashed"))
    assert redis_client.zscore(index_of("crashed"), "crashed") == crashed_until_ms  # left

    assert _names(HeldLock.objects.all()) == ["alive"]
    assert HeldLock.objects.count() == 1
    assert redis_client.zrange(index_of("alive"), 0, -1) == [b"alive"]
    for gone in ("ancient", "crashed"):  # pruned by the listing
        assert redis_client.zscore(index_of(gone), gone) is None


def test_lock_gone_between_index_and_values_is_skipped(redis_client, hold):
    for name in ("a", "b", "c"):
        hold.enter_context(distlock(name, raise_on_lost=False))
    # The key of "b" vanishes without its index entry (evicted, or deleted by hand): the
    # window a release that lands between the two reads of a listing also opens.
    redis_client.delete(lock_key("b"))

    assert _names(HeldLock.objects.all()) == ["a", "c"]
    assert _names(HeldLock.objects.all()[:2]) == ["a"]  # the page is short, not shifted
    assert HeldLock.objects.all()[1:].first().name == "c"
    with pytest.raises(HeldLock.DoesNotExist):
        HeldLock.objects.get(name="b")
    # count() reads the index only: it still counts "b" until its lease would have ended.
    assert HeldLock.objects.count() == 3
    assert len(HeldLock.objects.all()) == 2


_FILL = """
local pairs = {}
for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do
  pairs[#pairs + 1] = 'cache:item:' .. i
  pairs[#pairs + 1] = 'x'
end
return redis.call('MSET', unpack(pairs))
"""


@single_server_only  # a private server: commands are counted on it
def test_ten_thousand_locks_among_a_million_keys(private_redis):
    server = private_redis
    client = server.client()
    for start in range(0, 1_000_000, 2000):  # unrelated keys, 2,000 per MSET
        client.eval(_FILL, 0, start, start + 1999)
    assert client.dbsize() == 1_000_000
    names = [f"tenant:{i % 7}:job:{i:05}" for i in range(10_000)]
    locks: list[Lock] = []
    with events_mode("off", URL=server.url, TIMEOUT=120, AUTO_RENEW=False):
        for name in names:
            lock = distlock(name)
            assert lock.acquire(blocking=False)
            locks.append(lock)
        HeldLock.objects.count()  # loads the listing script
        client.config_resetstat()

        started = time.perf_counter()
        first_page = list(HeldLock.objects.all()[:100])
        first_page_seconds = time.perf_counter() - started
        tenant_page = list(HeldLock.objects.filter(name__startswith="tenant:3:")[:100])
        count = HeldLock.objects.count()
        newest = list(HeldLock.objects.order_by("-acquired_at")[:100])
        one = HeldLock.objects.get(name=names[1234])

        calls = _command_calls(client)

    assert [held.name for held in first_page] == sorted(names)[:100]
    assert [held.name for held in tenant_page] == sorted(
        n for n in names if n.startswith("tenant:3:")
    )[:100]
    assert count == 10_000
    assert [held.name for held in newest] == names[::-1][:100]
    assert one.fence == locks[1234].fence
    assert first_page_seconds < 2.0  # about 20 ms on a 2-CPU VM
    assert "keys" not in calls
    assert "scan" not in calls
    # 5 reads of the indexes: 4 read every bucket's (one script for them all on a single
    # server, which ZRANGEs each bucket for the 3 that list names), the get() only its
    # name's bucket. Then the values and lease
    # ends of each page (MGET and ZMSCORE per bucket of the page's names), and one MGET
    # per bucket for ordering by acquired_at. Nothing per lock, nothing over the keyspace.
    # (the first listing may load its script: an EVALSHA answered NOSCRIPT, counted as a
    # call, then an EVAL)
    assert calls["evalsha"] == 4 + 1
    assert calls.get("eval", 0) <= 1
    assert calls["zrange"] == 3 * BUCKETS
    assert calls["mget"] <= 3 * 100 + BUCKETS + 1
    assert calls["zmscore"] <= 3 * 100 + 1


def test_release_requires_force(redis_client, hold):
    lock = hold.enter_context(distlock("job"))
    held = HeldLock.objects.get(name="job")

    with pytest.raises(ValueError, match="force=True"):
        held.release()
    with pytest.raises(ValueError, match="force=True"):
        held.release(force=False)
    assert lock.owned()


@pytest.fixture
def force_releases() -> Iterator[list[dict[str, object]]]:
    received: list[dict[str, object]] = []

    def receiver(sender: object, **kwargs: object) -> None:
        received.append({"sender": sender, **kwargs})

    lock_force_released.connect(receiver)
    yield received
    lock_force_released.disconnect(receiver)


def _wait_until_parked(client: redis.Redis, name: str) -> None:
    """Until a blocking acquirer of ``name`` has told Redis it waits."""
    deadline = time.monotonic() + 5
    while not client.exists(keys_of(name).waiters):
        assert time.monotonic() < deadline, "the waiter never started waiting"
        time.sleep(0.005)


def test_force_release_wakes_a_waiter(redis_client, force_releases, monkeypatch):
    # Waiters re-check at least every wait_cap seconds and at the holder's lease end:
    # make both far away, so only the release's wake-up can hand the lock over in time.
    monkeypatch.setattr(get_backend(), "tuning", Tuning(wait_cap=60.0, waiter_liveness=120.0))
    waiter_got_it = threading.Event()

    def wait_for_lock() -> None:
        with distlock("job", blocking_timeout=50):
            waiter_got_it.set()

    waiter = threading.Thread(target=wait_for_lock)

    def holder() -> None:
        with distlock("job", timeout=60):
            waiter.start()
            _wait_until_parked(redis_client, "job")
            held = HeldLock.objects.get(name="job")

            assert held.release(force=True) is True

            assert waiter_got_it.wait(20)

    with pytest.raises(LockLost):
        holder()
    # Leaving the block above raised LockLost: the holder's release found it gone.
    waiter.join(5)
    assert [(e["held_lock"].name, e["user"], e["released"]) for e in force_releases] == [
        ("job", None, True)
    ]
    assert force_releases[0]["sender"] is HeldLock


def test_force_released_holder_learns_it_through_its_watchdog(redis_client):
    lost = threading.Event()
    seen: list[bool] = []

    def holder() -> None:
        with distlock("job", timeout=0.6, on_lost=lambda lock: lost.set()) as lock:
            assert HeldLock.objects.get(name="job").release(force=True)
            assert lost.wait(5)  # the next renewal (a third of the lease) finds it gone
            seen.append(lock.lost)

    with pytest.raises(LockLost):
        holder()
    assert seen == [True]
    assert not redis_client.exists(lock_key("job"))


def test_force_release_leaves_a_lock_that_changed_hands(redis_client, hold, force_releases):
    first = distlock("job")
    first.acquire()
    stale = HeldLock.objects.get(name="job")
    first.release()
    second = hold.enter_context(distlock("job"))

    assert stale.release(force=True) is False

    assert second.owned()
    assert HeldLock.objects.get(name="job").token == second.token
    assert [e["released"] for e in force_releases] == [False]


@pytest.mark.django_db
def test_a_force_release_that_found_nothing_records_no_event(
    redis_client, hold, django_user_model, locks_on, force_releases
):
    # The audit trail records what happened: a lock that changed hands or expired since
    # it was read is not force-released, so no force_released row says it was.
    from django_distlock.models import LockEvent

    operator = django_user_model.objects.create_user("operator")
    with locks_on(EVENTS="sync"):
        first = distlock("job")
        first.acquire()
        changed_hands = HeldLock.objects.get(name="job")
        first.release()
        second = hold.enter_context(distlock("job"))
        expired = HeldLock.objects.get(name="job")
        second.release()

        assert changed_hands.release(force=True, by=operator) is False
        assert expired.release(force=True, by=operator) is False

        assert not LockEvent.objects.filter(kind="force_released").exists()
        assert LockEvent.objects.filter(name="job").count() == 4  # acquired and released x 2
    # Receivers of the signal are told of the attempt, as what it was.
    assert [(e["user"], e["released"]) for e in force_releases] == [(operator, False)] * 2


@pytest.mark.django_db
def test_force_release_records_who_did_it(redis_client, django_user_model, locks_on):
    from django_distlock.models import LockEvent

    operator = django_user_model.objects.create_user("operator")
    with locks_on(EVENTS="sync"):
        lock = distlock("job", raise_on_lost=False)
        lock.acquire()
        HeldLock.objects.get(name="job").release(force=True, by=operator)
        event = LockEvent.objects.get(kind="force_released")
    assert event.name == "job"
    assert event.user == operator
    assert event.fence == lock.fence
    assert not redis_client.exists(lock_key("job"))
    with pytest.raises(LockLost):
        lock.release()


# -- kinds: a row per hold ----------------------------------------------------------------


def _rows(queryset: object) -> list[tuple[str, str, int | None, int]]:
    return [(h.name, h.mode, h.limit, h.holders) for h in queryset]  # type: ignore[attr-defined]


def _hold_kinds(hold: object) -> dict[str, list[Lock]]:
    """One exclusive lock, one shared lock with two holders, one limited lock (limit 3)
    with two holders."""
    enter = hold.enter_context  # type: ignore[attr-defined]
    return {
        "mutex": [enter(distlock("kinds:mutex", timeout=30))],
        "shared": [enter(distlock("kinds:shared", shared=True, timeout=20)) for _ in range(2)],
        "limited": [enter(distlock("kinds:limited", limit=3, timeout=40)) for _ in range(2)],
    }


def test_one_row_per_hold_with_its_mode_limit_and_holders(redis_client, hold):
    locks = _hold_kinds(hold)

    listed = list(HeldLock.objects.all())

    assert _rows(listed) == [
        ("kinds:limited", "limited", 3, 2),
        ("kinds:limited", "limited", 3, 2),
        ("kinds:mutex", "exclusive", None, 1),
        ("kinds:shared", "shared", None, 2),
        ("kinds:shared", "shared", None, 2),
    ]
    by_token = {held.token: held for held in listed}
    for kind_locks in locks.values():
        for lock in kind_locks:
            held = by_token[lock.token]
            assert held.fence == lock.fence
            assert held.pid == os.getpid()
            assert held.thread == threading.current_thread().name
    # The holds of one lock are next to each other, by token.
    limited = [held.token for held in listed if held.name == "kinds:limited"]
    assert limited == sorted(lock.token for lock in locks["limited"])
    assert by_token[locks["limited"][0].token].lease == 40
    assert 15 < by_token[locks["shared"][1].token].ttl <= 20
    assert [held.mode_label for held in listed] == [
        "limited 2/3",
        "limited 2/3",
        "exclusive",
        "shared",
        "shared",
    ]
    # Two holds of one name are two objects (Django compares models by primary key).
    first, second = HeldLock.objects.filter(name="kinds:shared")
    assert first != second
    assert first == HeldLock.objects.filter(name="kinds:shared")[0]
    assert len({first, second}) == 2


def test_lookups_count_order_and_windows_apply_to_holds(redis_client, hold):
    locks = _hold_kinds(hold)

    assert HeldLock.objects.count() == 5
    assert HeldLock.objects.filter(name__startswith="kinds:s").count() == 2
    assert HeldLock.objects.filter(name__in=["kinds:shared", "kinds:mutex"]).count() == 3
    assert (
        _rows(HeldLock.objects.filter(name="kinds:limited"))
        == [("kinds:limited", "limited", 3, 2)] * 2
    )
    assert len(HeldLock.objects.filter(name__contains="limited")) == 2
    # A lookup matches names, never the tokens of holds.
    token = locks["shared"][0].token
    assert not HeldLock.objects.filter(name__contains=token[:6]).exists()
    with pytest.raises(HeldLock.MultipleObjectsReturned, match="it returned 2"):
        HeldLock.objects.get(name="kinds:shared")
    assert HeldLock.objects.get(name="kinds:mutex").token == locks["mutex"][0].token

    assert _names(HeldLock.objects.order_by("-ttl")[:3]) == ["kinds:limited"] * 2 + ["kinds:mutex"]
    assert _names(HeldLock.objects.order_by("ttl")[:2]) == ["kinds:shared"] * 2
    newest = HeldLock.objects.order_by("-acquired_at").first()
    assert newest.token == locks["limited"][1].token
    assert _names(HeldLock.objects.all()[1:4]) == ["kinds:limited", "kinds:mutex", "kinds:shared"]
    assert HeldLock.objects.all()[3:].count() == 2


def test_holds_are_read_through_clients_that_decode(redis_server, redis_client):
    with (
        events_mode("off", URL=f"{redis_server.url}?decode_responses=True"),
        distlock("s🔒", shared=True) as first,
        distlock("s🔒", shared=True),
        distlock("l", limit=2, timeout=5),
    ):
        assert _rows(HeldLock.objects.all()) == [
            ("l", "limited", 2, 1),
            ("s🔒", "shared", None, 2),
            ("s🔒", "shared", None, 2),
        ]
        assert first.token in {held.token for held in HeldLock.objects.filter(name="s🔒")}
        assert HeldLock.objects.order_by("-acquired_at").first().name == "l"
        assert 4 < HeldLock.objects.get(name="l").ttl <= 5
        assert HeldLock.objects.count() == 3


def test_an_expired_hold_disappears_and_the_others_stay(redis_client, hold):
    crashed = distlock("kinds:shared", shared=True, timeout=0.2, auto_renew=False)
    assert crashed.acquire()  # never released, like a holder that died
    alive = hold.enter_context(distlock("kinds:shared", shared=True, timeout=30))
    time.sleep(0.3)

    assert [held.token for held in HeldLock.objects.all()] == [alive.token]
    assert HeldLock.objects.count() == 1
    assert HeldLock.objects.get(name="kinds:shared").holders == 1
    with pytest.raises(LockLost):
        crashed.release()


def test_a_hold_released_between_the_two_reads_is_skipped(redis_client, hold):
    locks = _hold_kinds(hold)
    gone = locks["shared"][0]
    keys = keys_of("kinds:shared")
    # Its entry vanishes from the holders' hash but not from the index: the window a
    # release landing between the two reads of a listing also opens.
    redis_client.hdel(keys.holders, gone.token)

    tokens = [held.token for held in HeldLock.objects.filter(name="kinds:shared")]
    assert tokens == [locks["shared"][1].token]
    assert HeldLock.objects.filter(name="kinds:shared").count() == 2  # the index only
    redis_client.hset(keys.holders, gone.token, "0\n0\n1\n{}")  # for a clean release


def test_force_release_of_one_shared_hold_leaves_the_others(redis_client, force_releases):
    lost = threading.Event()
    evicted = distlock("kinds:shared", shared=True, timeout=0.6, on_lost=lambda lock: lost.set())
    other = distlock("kinds:shared", shared=True, timeout=30)
    assert evicted.acquire()
    assert other.acquire()
    try:
        held = next(
            h for h in HeldLock.objects.filter(name="kinds:shared") if h.token == evicted.token
        )
        assert held.mode == "shared"

        assert held.release(force=True) is True

        assert lost.wait(5)  # its watchdog finds its hold gone
        assert evicted.lost
        assert [h.token for h in HeldLock.objects.all()] == [other.token]
        assert other.owned()
        assert force_releases[0]["held_lock"].mode == "shared"
        assert held.release(force=True) is False  # nothing left to release
    finally:
        other.release()
        with pytest.raises(LockLost):
            evicted.release()


@pytest.mark.parametrize("mode", [None, "limited"])
def test_force_release_of_a_limited_hold_frees_a_slot(redis_client, mode):
    holders = [distlock("kinds:limited", limit=2, raise_on_lost=False) for _ in range(2)]
    for lock in holders:
        assert lock.acquire()
    latecomer = distlock("kinds:limited", limit=2)
    assert latecomer.acquire(blocking=False) is False
    try:
        backend = get_backend()
        assert force_release(backend, "kinds:limited", holders[0].token, mode) is True
        assert latecomer.acquire(blocking=False)
        latecomer.release()
        assert force_release(backend, "kinds:limited", holders[0].token, mode) is False
        # Read as an exclusive hold, the sorted set is never touched.
        assert force_release(backend, "kinds:limited", holders[1].token, "exclusive") is False
        assert holders[1].owned()
    finally:
        for lock in holders:
            with contextlib.suppress(LockLost):
                lock.release()
    with pytest.raises(ValueError, match="mode must be"):
        force_release(backend, "kinds:limited", "abc", "readers")


def test_force_release_of_an_exclusive_hold_without_its_mode(redis_client, hold):
    lock = distlock("kinds:mutex", raise_on_lost=False)
    assert lock.acquire()
    assert force_release(get_backend(), "kinds:mutex", lock.token) is True
    assert not redis_client.exists(lock_key("kinds:mutex"))
    with pytest.raises(LockLost):
        lock.release()


@pytest.mark.django_db
def test_force_release_of_a_hold_records_its_mode(redis_client, django_user_model):
    from django_distlock.models import LockEvent

    operator = django_user_model.objects.create_user("operator")
    with events_mode("off", EVENTS="sync"):
        lock = distlock("kinds:limited", limit=3, raise_on_lost=False)
        lock.acquire()
        HeldLock.objects.get(name="kinds:limited").release(force=True, by=operator)
        event = LockEvent.objects.get(kind="force_released")
    assert (event.mode, event.limit, event.fence) == ("limited", 3, lock.fence)
    with pytest.raises(LockLost):
        lock.release()


def test_owner_label_names_the_host_pid_and_thread():
    assert owner_label("web-3", 4242, "MainThread") == "web-3:4242 MainThread"
    assert owner_label("", None, "") == "-:- -"
    # The commands escape it for the terminal: a host is written by any Redis client.
    assert escape_for_terminal(owner_label("evil\x1b[2J", 1, "t")) == "evil\\x1b[2J:1 t"
