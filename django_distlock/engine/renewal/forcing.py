"""Force release: an operator ends a hold they saw in a listing, by its token, and its
holder's process hears of it at once.

How the holder hears of it: a force release that ended a hold publishes a notice (the
name, the token, who did it) on one channel per key prefix, ``<prefix>force-released``.
Every process that holds auto-renewed locks of a backend keeps one subscription to that
channel (:func:`listen`, started by the watchdog), and tells the holder of the named
token at once. Nothing is sent or kept per held lock, and nothing is sent at all while
nobody force-releases. On a Redis Cluster a ``PUBLISH`` reaches the subscribers of
every node, so one subscription on any primary hears every slot's notices (a sharded
``SPUBLISH`` would need a subscription per shard holding a lock, for messages that are
rare by nature). A notice missed (the subscription reconnecting after a failover) is
not lost for good: the holder's next renewal finds the lock gone.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from .. import process
from ..exceptions import LockError
from ..keys import EXCLUSIVE, LIMITED, SHARED, LockKeys, validate_name
from ..protocol.hold import Hold, LostCause
from ..protocol.steps import release_steps
from ..transport.backend import Backend
from ..transport.drivers import SyncDriver
from .decisions import mark_lost, settled, tell_holder
from .notifier import notifier

__all__ = [
    "FORCED_CHANNEL",
    "force_release",
    "forced_reason",
    "listen",
    "listening",
    "subscriptions",
]

logger = logging.getLogger("django_distlock")

FORCED_CHANNEL = "force-released"
"""The channel of force-release notices, under the backend's key prefix."""

LISTEN_IDLE = 10.0
"""Seconds a subscription is kept after its backend's last watched hold ended."""
POLL = 1.0
"""Seconds a listener waits for a notice before it looks whether it is still needed."""
RECONNECT = 0.5
"""Seconds between attempts to subscribe again after the connection failed."""


def forced_reason(by: str) -> str:
    """How a hold's loss to a force release is told (``LockLost``, ``on_lost``'s
    ``lock.lost_reason``, the ``lost`` event's reason)."""
    return f"it was force-released by {by or 'an operator'}"


def force_release(
    backend: Backend, name: str, token: str, mode: str | None = None, *, by: str = ""
) -> bool:
    """End the hold of lock ``name`` with ``token`` (the one an operator saw), if it is
    still there, and wake a waiter: the lock itself for an exclusive hold, that holder's
    slot of a shared or limited lock (the other holders keep theirs). ``False`` when it
    was released or changed hands since: nothing is touched then.

    The evicted holder's process is told at once (see the module docstring): its loss
    has cause :attr:`LostCause.FORCED` and a reason naming ``by`` (who force-released
    it, e.g. ``"user 'alice'"``).

    ``mode`` is the hold's (a :class:`~.records.LockRecord`'s ``mode``); unknown
    (``None``), both ways are tried, each a compare-and-delete on the token (two round
    trips at most)."""
    name = validate_name(name)
    if not isinstance(token, str) or not token:
        raise ValueError(f"force-releasing {name!r} needs the token it was read with")
    if mode not in (None, EXCLUSIVE, SHARED, LIMITED):
        raise ValueError(f"mode must be {EXCLUSIVE!r}, {SHARED!r}, {LIMITED!r} or None")
    keys = LockKeys.for_name(backend.prefix, name)
    liveness_ms = backend.tuning.waiter_liveness_ms
    driver = SyncDriver(backend, name)
    if mode is not None:
        released = driver.run(release_steps(keys, token, liveness_ms, mode))
    else:
        # The exclusive script leaves a lock held shared alone, and the holders' script a
        # lock held exclusively: at most one of them can release anything.
        released = driver.run(release_steps(keys, token, liveness_ms, EXCLUSIVE)) or driver.run(
            release_steps(keys, token, liveness_ms, SHARED)
        )
    if released:
        _publish(backend, keys, {"name": name, "token": token, "by": by})
    return bool(released)


def _publish(backend: Backend, keys: LockKeys, notice: dict[str, str]) -> None:
    # The hold is gone already: a notice that cannot be sent only makes its holder learn
    # it at its next renewal, so it is logged, never raised.
    channel = backend.prefix + FORCED_CHANNEL
    try:
        server = backend.routes().for_key(keys.lock)
        deadline = time.monotonic() + backend.tuning.renewal_attempt
        server.request([("PUBLISH", channel, json.dumps(notice))], deadline)
    except Exception as exc:  # noqa: BLE001 - see above
        logger.warning(
            "django-distlock: force-released lock %r, but could not tell its holder at once "
            "(%s); it learns at its next renewal",
            notice["name"],
            exc,
        )


class _Listener:
    """One subscription to a backend's force-release channel, on a daemon thread; it
    ends once the process has watched no hold of that backend for ``LISTEN_IDLE``
    seconds."""

    def __init__(self, backend: Backend, watched: Callable[[], list[Hold]]) -> None:
        self._backend = weakref.ref(backend)
        self._channel = backend.prefix + FORCED_CHANNEL
        self._watched = watched
        self.closed = False
        self.subscribed = threading.Event()
        self._subscriber: Any = None
        self.subscriptions = 0
        """How many times it subscribed (again after a connection was lost)."""
        self._thread = threading.Thread(target=self._run, name="distlock-forced", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the subscription (its backend is closed); the thread ends with it."""
        self.closed = True
        _close(self._subscriber)

    def _run(self) -> None:
        idle_since: float | None = None
        attempt = 0
        while not self.closed:
            subscriber = self._subscribe(attempt)
            attempt += 1
            if subscriber is None:
                time.sleep(RECONNECT)
                if not self._holds():
                    self.closed = True
                continue
            self._subscriber = subscriber
            if self.closed:  # stopped while it subscribed
                _close(subscriber)
                return
            try:
                while not self.closed:
                    message = subscriber.get_message(timeout=POLL)
                    if message is not None and message.get("type") == "message":
                        self._heard(message["data"])
                        continue
                    if self._holds():
                        idle_since = None
                    elif idle_since is None:
                        idle_since = time.monotonic()
                    elif time.monotonic() - idle_since > LISTEN_IDLE:
                        self.closed = True
                        return
            except Exception as exc:  # noqa: BLE001 - resubscribe, whatever broke
                if not self.closed:
                    logger.info("django-distlock: force-release notices interrupted: %s", exc)
            finally:
                self.subscribed.clear()
                _close(subscriber)

    def _subscribe(self, attempt: int) -> Any:
        backend = self._backend()
        if backend is None:
            self.closed = True
            return None
        subscriber = None
        try:
            routes = backend.routes()
            if attempt:
                routes.refresh()
            primaries = routes.primaries()
            subscriber = primaries[attempt % len(primaries)].subscriber()
            subscriber.subscribe(self._channel)
            # The confirmation proves the subscription is active on the server.
            deadline = time.monotonic() + 5.0
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("no confirmation of the subscription")
                message = subscriber.get_message(timeout=left)
                if message is not None and message.get("type") == "subscribe":
                    break
        except Exception as exc:  # noqa: BLE001 - retried while holds are watched
            logger.info("django-distlock: cannot subscribe to force-release notices: %s", exc)
            _close(subscriber)
            return None
        self.subscriptions += 1
        self.subscribed.set()
        return subscriber

    def _holds(self) -> list[Hold]:
        backend = self._backend()
        return [hold for hold in self._watched() if hold.backend is backend]

    def _heard(self, data: Any) -> None:
        try:
            notice = json.loads(data)
            token, by = str(notice["token"]), str(notice.get("by", ""))
        except (ValueError, TypeError, KeyError):
            logger.warning("django-distlock: ignored a malformed force-release notice %r", data)
            return
        for hold in self._holds():
            if hold.token != token or hold.giving_back or settled(hold):
                continue
            hold.note_loss(LostCause.FORCED, forced_reason(by))
            if mark_lost(hold):
                notifier().submit(tell_holder, hold)


def _close(subscriber: Any) -> None:
    if subscriber is None:
        return
    try:
        subscriber.close()
        subscriber.connection_pool.disconnect()
    except Exception:  # noqa: BLE001, S110 - closing what already failed
        pass


_listeners: weakref.WeakKeyDictionary[Backend, _Listener] = weakref.WeakKeyDictionary()
_stopped_on_close: weakref.WeakSet[Backend] = weakref.WeakSet()
_listeners_lock = threading.Lock()


def listen(backend: Backend, watched: Callable[[], list[Hold]]) -> None:
    """Keep this process subscribed to ``backend``'s force-release notices while
    ``watched()`` (the watchdogs' holds) has holds of it; a dictionary look-up when it
    is already. A backend without a sync client is not listened to (its holders learn
    of a force release at their next renewal)."""
    listener = _listeners.get(backend)
    if listener is not None and not listener.closed:
        return
    try:
        backend.routes()
    except LockError:
        return  # no sync client
    with _listeners_lock:
        listener = _listeners.get(backend)
        if listener is None or listener.closed:
            _listeners[backend] = _Listener(backend, watched)
            if backend not in _stopped_on_close:
                _stopped_on_close.add(backend)
                backend.on_close(functools.partial(_stop_listening, weakref.ref(backend)))


def _stop_listening(backend_ref: weakref.ref[Backend]) -> None:
    backend = backend_ref()
    if backend is None:
        return
    _stopped_on_close.discard(backend)
    listener = _listeners.get(backend)
    if listener is not None:
        listener.stop()


def subscriptions(backend: Backend) -> int:
    """How many times this process's current listener of ``backend`` subscribed (1, then
    one more after each lost connection). For tests and diagnostics."""
    listener = _listeners.get(backend)
    return 0 if listener is None else listener.subscriptions


def listening(backend: Backend, timeout: float = 0.0) -> bool:
    """True once this process is subscribed to ``backend``'s force-release notices
    (waiting up to ``timeout`` seconds): from then on a force release is told to its
    holder here at once. For tests and diagnostics."""
    listener = _listeners.get(backend)
    return listener is not None and listener.subscribed.wait(timeout)


def _forget_after_fork() -> None:
    # A forked child holds none of its parent's locks and has none of its threads.
    global _listeners, _listeners_lock, _stopped_on_close
    _listeners = weakref.WeakKeyDictionary()
    _stopped_on_close = weakref.WeakSet()
    _listeners_lock = threading.Lock()


process.forget_after_fork(_forget_after_fork)
