"""The I/O-free acquire algorithm, driven step by step without a server."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest

from django_distlock.engine import (
    AUTO_REPLICAS,
    LockBackendError,
    LockBackendUnavailable,
    LockKeys,
    Tuning,
)
from django_distlock.engine.protocol.ops import (
    AwaitWakeUp,
    Call,
    CallEndingWait,
    Pause,
    Replicated,
    StartWait,
    Wake,
)
from django_distlock.engine.protocol.scripts import ACQUIRE, MANY_ACQUIRE, PASS_ON, RELEASE
from django_distlock.engine.protocol.steps import (
    Acquired,
    GroupRequest,
    NotAcquired,
    NotReplicated,
    acquire_many_steps,
    acquire_steps,
    owner_metadata,
    release_steps,
)

KEYS = LockKeys.for_name("p:", "job")
TOKEN = "0123456789abcdef" * 2
WAITER = TOKEN[:16]
UNFAIR_WAIT = StartWait((KEYS.wake(WAITER), KEYS.signal))
DONE = [1, b""]
"""What PASS_ON answers when no fair waiter is to be woken."""
RELEASED = b"released"
"""What RELEASE answers when no fair waiter is to be woken."""


def steps(**overrides):
    kwargs = {
        "keys": KEYS,
        "name": "job",
        "token": TOKEN,
        "lease": 1.5,
        "owner": '{"host":"h"}',
        "fair": False,
        "blocking": False,
        "deadline": None,
        "tuning": Tuning(),
    }
    kwargs.update(overrides)
    generator = acquire_steps(**kwargs)
    return generator, next(generator)


def finish(generator, reply):
    with pytest.raises(StopIteration) as stop:
        generator.send(reply)
    return stop.value.value


def abandon(generator):
    """Interrupt suspended steps and answer their clean-up until they finish (steps left
    suspended would run their clean-up at garbage collection)."""
    op = generator.throw(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):  # noqa: PT012
        while True:
            op = generator.send(
                (RELEASED if op.script is RELEASE else DONE)
                if isinstance(op, Call)
                else (DONE, False)
                if isinstance(op, CallEndingWait)
                else Wake.TIMER
            )


def test_default_waits_stay_below_the_client_socket_timeout():
    # redis-py clients time reads out after 5 s by default: a wait that the client
    # times must be shorter, and a waiter re-checks at least this often.
    tuning = Tuning()
    assert 0 < tuning.wait_cap < 5
    assert tuning.waiter_liveness > tuning.wait_cap


def test_owner_metadata_names_this_process():
    owner = json.loads(owner_metadata(thread="worker-1", context="ctx ü", auto_renew=False))
    assert owner == {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "thread": "worker-1",
        "context": "ctx ü",
        "auto_renew": False,
    }


def test_one_round_trip_takes_a_free_lock():
    generator, op = steps()
    assert isinstance(op, Call)
    assert op.script is ACQUIRE
    assert op.keys == KEYS.all()
    assert op.args[:4] == (TOKEN, 1500, '{"host":"h"}', "job")
    before = time.monotonic()
    outcome = finish(generator, b"taken 1700000000000001 1700000000000001")
    assert isinstance(outcome, Acquired)
    assert outcome.fence == 1700000000000001
    assert outcome.acquired_at_us == 1700000000000001
    assert outcome.sent_at <= before  # the lease is counted from before the request


def test_a_fence_alone_is_a_lock_taken_at_that_time():
    """ACQUIRE's common reply: the fence alone, equal to the acquisition time."""
    generator, _ = steps()
    outcome = finish(generator, b"taken 1700000000000002")
    assert isinstance(outcome, Acquired)
    assert (outcome.fence, outcome.acquired_at_us) == (1700000000000002, 1700000000000002)


@pytest.mark.parametrize(
    ("reply", "released"),
    [(b"released", True), (b"not held", False), ([b"released", b""], True), ("released", True)],
)
def test_release_reads_both_reply_shapes(reply, released):
    generator = release_steps(KEYS, TOKEN, 3000)
    op = next(generator)
    assert op.script is RELEASE
    assert finish(generator, reply) is released


def test_lease_is_rounded_up_to_whole_milliseconds():
    generator, op = steps(lease=0.0011)
    assert op.args[1] == 2
    finish(generator, [b"busy", 1, b""])


def test_non_blocking_attempt_never_waits():
    generator, op = steps(blocking=False)
    assert op.args[5] == ""  # not registered as a waiter
    assert finish(generator, [b"busy", 1500, b""]) == NotAcquired(1.5)
    generator, _ = steps(blocking=False)
    assert finish(generator, [b"busy", -1, b""]) == NotAcquired(None)


def test_a_waiter_waits_on_the_wake_up_list_bounded_by_the_holder_lease():
    generator, op = steps(blocking=True)
    assert op.args[5] == TOKEN[:16]
    wait = generator.send([b"busy", 20, b""])
    # Its own list first (ending the wait pushes there), then the shared signal.
    assert wait == UNFAIR_WAIT
    timer = generator.send(None)
    assert isinstance(timer, AwaitWakeUp)
    # The holder's PTTL + 1 ms, counted from when the failed attempt was sent.
    assert 0.015 < timer.timeout <= 0.021
    # Timer ran out (holder crashed): re-check at once, ending the BLPOP in the same
    # round trip.
    op = generator.send(Wake.TIMER)
    assert isinstance(op, CallEndingWait)
    assert op.call.script is ACQUIRE
    assert op.call.args[8] == "1"  # the script ends our BLPOP...
    assert op.call.keys[6] == KEYS.wake(WAITER)  # ...by a push to our own list
    assert generator.send(([b"busy", 60_000, b""], False)) == UNFAIR_WAIT
    timer = generator.send(None)
    # A long lease is re-checked at the cap.
    assert Tuning().wait_cap - 0.01 < timer.timeout <= Tuning().wait_cap
    abandon(generator)


def test_fair_waiters_wait_on_their_own_list():
    generator, op = steps(blocking=True, fair=True)
    assert op.args[7] == "1"
    assert generator.send([b"busy", 100, b""]) == StartWait((KEYS.wake(WAITER),))
    abandon(generator)


def test_a_wait_never_outlasts_the_deadline():
    generator, _ = steps(blocking=True, deadline=time.monotonic() + 0.05)
    generator.send([b"busy", 60_000, b""])
    timer = generator.send(None)
    assert 0 < timer.timeout <= 0.05
    abandon(generator)


def test_giving_up_after_a_consumed_wake_up_passes_it_on():
    generator, _ = steps(blocking=True, deadline=time.monotonic() + 0.02)
    generator.send([b"busy", 60_000, b""])  # StartWait
    generator.send(None)  # AwaitWakeUp
    assert isinstance(generator.send(Wake.WOKEN), Call)  # woken: try again
    time.sleep(0.03)
    op = generator.send([b"busy", 60_000, b""])  # someone barged in, and the deadline passed
    assert op.script is PASS_ON
    assert op.args[2] == "1"  # we consumed a wake-up we will not use
    assert finish(generator, DONE) == NotAcquired(60.0)


def test_acquiring_after_the_timer_ends_the_wait_in_the_same_step():
    generator, _ = steps(blocking=True)
    generator.send([b"busy", 60_000, b""])  # StartWait
    generator.send(None)  # AwaitWakeUp
    op = generator.send(Wake.TIMER)  # timer ran out: the BLPOP is still outstanding
    assert isinstance(op, CallEndingWait)
    assert isinstance(finish(generator, (b"taken 7 7", False)), Acquired)


def test_a_wake_up_consumed_as_the_timer_fired_retries_at_once():
    generator, _ = steps(blocking=True)
    generator.send([b"busy", 60_000, b""])  # StartWait
    generator.send(None)  # AwaitWakeUp
    generator.send(Wake.TIMER)  # CallEndingWait
    op = generator.send(([b"busy", 60_000, b""], True))  # busy again, but a release woke us
    assert isinstance(op, Call)
    assert op.script is ACQUIRE
    abandon(generator)


@pytest.mark.parametrize("interruption", [KeyboardInterrupt, TimeoutError])
def test_an_interrupted_acquire_gives_the_lock_back(interruption):
    """The script may have run without us seeing the reply: release our own token."""
    generator, _ = steps(blocking=False)
    op = generator.throw(interruption())
    assert op.script is RELEASE
    assert op.args[0] == TOKEN
    with pytest.raises(interruption):
        generator.send(b"not held")


def test_an_interruption_while_waiting_ends_the_wait_first():
    generator, _ = steps(blocking=True, fair=True)
    generator.send([b"busy", 60_000, b""])  # StartWait
    generator.send(None)  # AwaitWakeUp
    op = generator.throw(KeyboardInterrupt())
    assert isinstance(op, CallEndingWait)
    assert op.call.script is PASS_ON
    assert op.call.args[0] == WAITER  # leave the fair queue
    assert op.call.args[3] == "1"  # and end the BLPOP, in one round trip
    assert op.call.keys[6] == KEYS.wake(WAITER)
    with pytest.raises(KeyboardInterrupt):
        generator.send((DONE, False))


def test_a_plain_attempt_ends_no_wait():
    generator, op = steps(blocking=True)
    assert op.args[8] == ""
    abandon(generator)


def test_giving_up_passes_on_a_wake_up_the_ended_wait_consumed():
    """The BLPOP was still in flight when we ended it and found a wake-up meant for the
    next waiter: hand it on."""
    generator, _ = steps(blocking=True, deadline=time.monotonic() + 0.02)
    generator.send([b"busy", 60_000, b""])  # StartWait
    generator.send(None)  # AwaitWakeUp
    time.sleep(0.03)
    op = generator.send(Wake.TIMER)  # the timer ran out, so did the deadline: re-check
    assert isinstance(op, CallEndingWait)
    # Still busy, and the wait already ended with that re-check: nothing to hand on, but
    # we leave those who wait, so that a release wakes nobody for us.
    op = generator.send(([b"busy", 60_000, b""], False))
    assert op.script is PASS_ON
    assert op.args[2] == "0"  # no wake-up consumed
    assert op.args[5] == WAITER
    assert finish(generator, DONE) == NotAcquired(60.0)

    generator, _ = steps(blocking=True, deadline=time.monotonic() + 0.02)
    generator.send([b"busy", 60_000, b""])  # StartWait
    generator.send(None)  # AwaitWakeUp
    op = generator.throw(TimeoutError())
    assert isinstance(op, CallEndingWait)  # ends the wait while leaving
    op = generator.send((DONE, True))  # ... and that BLPOP had consumed a wake-up
    assert op.script is PASS_ON
    assert op.args[2] == "1"
    with pytest.raises(TimeoutError):
        generator.send(DONE)


@pytest.mark.parametrize(
    "stray", [0, 1, 1700000000000001, b"OK", "OK", None, b"1700000000000001", [1, b"7", b"7"]]
)
def test_a_reply_that_is_not_tagged_is_never_a_hold(stray):
    """A stray integer or ``OK`` (another request's reply) must not read as "taken": the
    acquire fails closed, giving back whatever its token may hold."""
    generator, _ = steps()
    op = generator.send(stray)
    assert op.script is RELEASE
    assert op.args[0] == TOKEN
    with pytest.raises(LockBackendError, match="unexpected reply"):
        generator.send(RELEASED)


def test_a_release_reply_that_is_not_tagged_is_an_error():
    generator = release_steps(KEYS, TOKEN, 3000)
    next(generator)
    with pytest.raises(LockBackendError, match="unexpected reply"):
        generator.send(1)


def test_a_wait_ended_by_a_failover_is_ridden_out_within_the_deadline():
    """``UNBLOCKED`` (a planned failover): try again at once; while the new primary
    settles, attempts that fail as unavailable are paced and retried with the same token."""
    generator, _ = steps(blocking=True, deadline=time.monotonic() + 5)
    generator.send([b"busy", 60_000, b""])  # StartWait
    generator.send(None)  # AwaitWakeUp
    op = generator.send(Wake.INTERRUPTED)
    assert isinstance(op, Call)
    assert op.script is ACQUIRE
    op = generator.throw(LockBackendUnavailable("READONLY"))
    assert op == Pause(Tuning().failover_pause)
    op = generator.send(None)
    assert isinstance(op, Call)
    assert op.script is ACQUIRE
    assert op.args[0] == TOKEN
    assert isinstance(finish(generator, b"taken 7"), Acquired)


def test_a_failover_is_not_ridden_out_past_the_deadline():
    generator, _ = steps(blocking=True, deadline=time.monotonic() + 0.01)
    generator.send([b"busy", 60_000, b""])  # StartWait
    generator.send(None)  # AwaitWakeUp
    generator.send(Wake.INTERRUPTED)
    time.sleep(0.02)
    op = generator.throw(LockBackendUnavailable("READONLY"))
    assert op.script is RELEASE  # the attempt may have run: give it back, then raise
    with pytest.raises(LockBackendUnavailable):
        generator.send(RELEASED)


def test_an_unreachable_server_is_not_ridden_out_without_a_failover():
    generator, _ = steps(blocking=True, deadline=time.monotonic() + 5)
    op = generator.throw(LockBackendUnavailable("connection refused"))
    assert op.script is RELEASE
    with pytest.raises(LockBackendUnavailable):
        generator.send(RELEASED)


@pytest.mark.parametrize(
    "reply",
    [[b"busy"], [b"busy", 20], [b"kind"], [b"taken", 7], [b"taken"], [b"busy", b"x", b""]],
    ids=["busy-bare", "busy-no-head", "kind-bare", "taken-no-time", "taken-bare", "busy-not-ms"],
)
def test_an_acquire_reply_of_the_wrong_shape_is_a_backend_error(reply):
    """A tagged reply missing its fields is read into no answer at all: the caller gets a
    LockBackendError (never an IndexError or a ValueError, never a hold), once whatever
    its token may hold is given back."""
    generator, _ = steps()
    op = generator.send(reply)
    assert op.script is RELEASE
    assert op.args[0] == TOKEN
    with pytest.raises(LockBackendError, match="unexpected reply to an acquire"):
        generator.send(RELEASED)


@pytest.mark.parametrize("reply", [b"OK", [1], 1], ids=["ok", "short", "integer"])
def test_a_pass_on_reply_of_the_wrong_shape_wakes_nobody(reply):
    """Leaving the wait reads PASS_ON's ``{1, head}`` by its field: another shape is an
    error the clean-up absorbs (the acquire's outcome stands), never a wake-up pushed to a
    waiter named by whatever its second element is, nor an IndexError."""
    generator, _ = steps(blocking=True, deadline=time.monotonic() + 0.02)
    generator.send([b"busy", 60_000, b""])  # StartWait
    generator.send(None)  # AwaitWakeUp
    assert isinstance(generator.send(Wake.WOKEN), Call)  # woken: try again
    time.sleep(0.03)
    op = generator.send([b"busy", 60_000, b""])  # someone barged in, and the deadline passed
    assert op.script is PASS_ON
    assert finish(generator, reply) == NotAcquired(60.0)


@pytest.mark.parametrize(
    "reply",
    [[b"busy", 20, 1], [b"busy", 20, b"x", b"0"], [b"taken", 7], [b"taken", 7, b"f"], b"OK"],
    ids=["busy-no-writer", "busy-not-index", "taken-no-fence", "taken-not-fence", "untagged"],
)
def test_a_group_acquire_reply_of_the_wrong_shape_is_a_backend_error(reply):
    """MANY_ACQUIRE's answer is read by its fields too: a reply of another shape raises
    LockBackendError, never an IndexError or a ValueError."""
    request = GroupRequest(TOKEN, 1.5, '{"host":"h"}', False, None, Tuning())
    generator = acquire_many_steps([[KEYS]], request)
    assert next(generator).script is MANY_ACQUIRE
    with pytest.raises(LockBackendError, match="unexpected reply to an acquire"):  # noqa: PT012
        op = generator.send(reply)
        while True:  # the clean-up's calls, answered as done
            op = generator.send(RELEASED if op.script is RELEASE else DONE)


# -- a group's acquire (distlock_many) follows the same failover and replica rules --------

OTHER_KEYS = LockKeys.for_name("p:", "other")


def group_steps(*, replicas=None, **overrides):
    request = GroupRequest(
        token=TOKEN,
        lease=1.5,
        owner='{"host":"h"}',
        blocking=overrides.pop("blocking", False),
        deadline=overrides.pop("deadline", None),
        tuning=Tuning(),
        replicas=replicas,
    )
    generator = acquire_many_steps([[KEYS, OTHER_KEYS]], request)
    return generator, next(generator)


def test_a_group_wait_ended_by_a_failover_is_ridden_out_like_one_lock():
    generator, op = group_steps(blocking=True, deadline=time.monotonic() + 5)
    assert op.script is MANY_ACQUIRE
    generator.send([b"busy", 60_000, 1, b""])  # StartWait
    generator.send(None)  # AwaitWakeUp
    op = generator.send(Wake.INTERRUPTED)
    assert op.script is MANY_ACQUIRE
    op = generator.throw(LockBackendUnavailable("READONLY"))
    assert op == Pause(Tuning().failover_pause)
    op = generator.send(None)
    assert op.script is MANY_ACQUIRE
    assert op.args[0] == TOKEN
    outcome = finish(generator, [b"taken", 1_000, 7, 8])
    assert outcome.fences == [7, 8]


def test_a_group_no_replica_acknowledged_is_given_back_and_refused():
    generator, op = group_steps(replicas=(AUTO_REPLICAS, 100))
    assert op.replicas == (AUTO_REPLICAS, 100)
    op = generator.send(Replicated([b"taken", 1_000, 7, 8], 0, 1))
    released = []
    while isinstance(op, Call) and op.script is RELEASE:
        released.append(op.keys[0])
        try:
            op = generator.send(RELEASED)
        except StopIteration as stop:
            outcome = stop.value
            break
    assert sorted(released) == sorted([KEYS.lock, OTHER_KEYS.lock])
    assert outcome == NotReplicated(0, 1, 100, name="job")


def test_a_group_waiter_not_replicated_tries_again_while_it_rides_out():
    generator, op = group_steps(replicas=(1, 100), blocking=True, deadline=time.monotonic() + 5)
    op = generator.send(Replicated([b"taken", 1_000, 7, 8], 0, 1))
    while isinstance(op, Call) and op.script is RELEASE:
        op = generator.send(RELEASED)
    assert op == Pause(Tuning().failover_pause)
    op = generator.send(None)
    assert op.script is MANY_ACQUIRE
    outcome = finish(generator, Replicated([b"taken", 1_000, 9, 10], 1, 1))
    assert outcome.fences == [9, 10]


def test_a_group_woken_and_found_busy_again_waits_for_its_timer():
    """The group's wait follows one lock's rule: an attempt after a wake-up uses it, so
    the next timer re-checks once and waits again (the group's own copy of the loop kept
    the used wake-up and retried a second time at once)."""
    generator, _ = group_steps(blocking=True)
    wait = StartWait((KEYS.wake(WAITER), KEYS.signal))
    assert generator.send([b"busy", 60_000, 1, b""]) == wait
    generator.send(None)  # AwaitWakeUp
    assert generator.send(Wake.WOKEN).script is MANY_ACQUIRE  # woken: try again
    assert generator.send([b"busy", 60_000, 1, b""]) == wait  # someone else took it
    generator.send(None)  # AwaitWakeUp
    op = generator.send(Wake.TIMER)
    assert isinstance(op, CallEndingWait)
    assert op.call.script is MANY_ACQUIRE
    assert generator.send(([b"busy", 60_000, 1, b""], False)) == wait
    abandon(generator)


def test_a_group_woken_for_one_name_and_found_busy_on_another_hands_the_wake_up_on():
    """A group woken by a release of its first name, whose attempt then finds its second
    name busy, did not use that wake-up: it hands it on to the first name's next waiter
    (and leaves that name's waiters) before it waits for the second."""
    generator, _ = group_steps(blocking=True)
    assert generator.send([b"busy", 60_000, 1, b""]) == StartWait((KEYS.wake(WAITER), KEYS.signal))
    generator.send(None)  # AwaitWakeUp
    assert generator.send(Wake.WOKEN).script is MANY_ACQUIRE
    op = generator.send([b"busy", 60_000, 2, b""])  # "job" is free now, "other" is not
    assert op.script is PASS_ON
    assert op.keys[0] == KEYS.lock
    assert op.args == ("", Tuning().waiter_liveness_ms, "1", "", "", WAITER)
    assert generator.send(DONE) == StartWait((OTHER_KEYS.wake(WAITER), OTHER_KEYS.signal))
    abandon(generator)


def test_a_group_leaving_hands_on_a_wake_up_and_its_writer_place_in_one_call():
    """Leaving undoes all it left on a lock in one PASS_ON, as one lock does: the writers
    it joined, a wake-up it consumed there and its place among those who wait (the
    group's own clean-up took two calls)."""
    generator, _ = group_steps(blocking=True, deadline=time.monotonic() + 0.02)
    generator.send([b"busy", 60_000, 1, b"1"])  # StartWait, among the writers of "job"
    generator.send(None)  # AwaitWakeUp
    time.sleep(0.03)
    assert isinstance(generator.send(Wake.TIMER), CallEndingWait)  # re-check, past the deadline
    op = generator.send(([b"busy", 60_000, 1, b"1"], True))  # still busy, and woken
    assert op.script is PASS_ON
    assert op.keys[0] == KEYS.lock
    assert op.args == ("", Tuning().waiter_liveness_ms, "1", "", WAITER, WAITER)
    assert finish(generator, DONE) == NotAcquired(60.0)
