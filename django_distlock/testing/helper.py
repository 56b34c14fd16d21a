"""``LockTestHelper``: points ``DISTLOCK`` at a test server under a key prefix of its own,
and plays the other side of a test's locks: another holder (:meth:`~LockTestHelper.hold`),
an operator taking a lock away (:meth:`~LockTestHelper.lose`), an outage
(:meth:`~LockTestHelper.unavailable`)."""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import Iterator
from types import TracebackType
from typing import Any, Self

import redis
from django.conf import settings
from django.test.utils import override_settings

from ..engine import (
    Backend,
    Listing,
    Lock,
    LockLost,
    LockQuery,
    check_holds_now,
    force_release,
)
from ..settings import WHERE_KEYS
from .server import HOST, TEST_URL_ENV_VAR, LockServer

__all__ = ["HOLDER_CONTEXT", "LockTestHelper", "fresh_prefix"]

HOLDER_CONTEXT = "django_distlock.testing"
"""The context label of the locks :meth:`LockTestHelper.hold` takes."""

# Where the locks live, besides WHERE_KEYS: none of it applies to the test server.
_TOPOLOGY_KEYS = (*WHERE_KEYS, "SENTINEL_SERVICE", "SENTINEL_KWARGS", "MIN_REPLICAS")


def fresh_prefix() -> str:
    """A key prefix no other test uses: ``distlock-test:<random>:``."""
    return f"distlock-test:{uuid.uuid4().hex[:12]}:"


class LockTestHelper:
    """Locks under test: ``DISTLOCK`` points at the server at ``url`` with a fresh key
    prefix and ``EVENTS="sync"`` from :meth:`apply` (or :meth:`start`) until
    :meth:`stop`; the other keys of your ``DISTLOCK`` (``TIMEOUT``, ``VIEW_ON_BUSY``...)
    stay as they are.

    With pytest, the ``distlock_locks`` fixture gives you one. Elsewhere (a Django
    ``TestCase``, ``unittest``)::

        class PayTests(TestCase):
            def setUp(self):
                self.locks = LockTestHelper.start()   # a private server of its own
                self.addCleanup(self.locks.stop)

            def test_busy(self):
                with self.locks.hold("pay:1"):
                    assert self.client.post("/invoices/1/pay/").status_code == 423
    """

    def __init__(self, url: str, *, prefix: str | None = None) -> None:
        self.url = url
        self.prefix = prefix or fresh_prefix()
        self._server: LockServer | None = None
        self._override: override_settings | None = None
        self._client: redis.Redis | None = None
        self._backend: Backend | None = None

    def __repr__(self) -> str:
        return f"<LockTestHelper {self.url} prefix={self.prefix!r}>"

    @classmethod
    def start(cls, url: str | None = None) -> LockTestHelper:
        """A helper already applied: on ``url``, else on ``$DISTLOCK_TEST_URL``, else on a
        private server of its own, which :meth:`stop` stops."""
        url = url or os.environ.get(TEST_URL_ENV_VAR)
        server = None
        if not url:
            server = LockServer().start()
            url = server.url
        helper = cls(url)
        helper._server = server
        try:
            helper.apply()
        except BaseException:
            helper.stop()
            raise
        return helper

    def __enter__(self) -> Self:
        if self._override is None:
            self.apply()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def apply(self) -> None:
        """Point ``DISTLOCK`` at the helper's server and prefix, with ``EVENTS="sync"``."""
        if self._override is not None:
            raise RuntimeError(f"{self!r} is applied already")
        current = getattr(settings, "DISTLOCK", None) or {}
        kept = {key: value for key, value in current.items() if key not in _TOPOLOGY_KEYS}
        distlock = {**kept, "URL": self.url, "KEY_PREFIX": self.prefix, "EVENTS": "sync"}
        self._override = override_settings(DISTLOCK=distlock)
        self._override.enable()

    def stop(self) -> None:
        """Restore ``DISTLOCK``, close the helper's connections and stop its own server
        (if it started one)."""
        if self._override is not None:
            self._override.disable()
            self._override = None
        if self._backend is not None:
            self._backend.close()
            self._backend = None
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._server is not None:
            self._server.stop()
            self._server = None

    @property
    def backend(self) -> Backend:
        """The helper's own connection to the server, under its prefix (not the one your
        code uses: its locks are another holder's)."""
        if self._backend is None:
            self._client = redis.Redis.from_url(self.url)
            self._backend = Backend(self._client, prefix=self.prefix)
        return self._backend

    @contextlib.contextmanager
    def hold(self, name: str, *, timeout: float = 30, shared: bool = False) -> Iterator[Lock]:
        """Another owner holds ``name`` inside the block (its own connection and owner
        identity): ``lock_view`` answers 423, ``LockedCommand`` refuses,
        ``distlock(name, blocking=False).acquire()`` is ``False``. With ``shared`` it is a
        shared hold, which other shared holds may join."""
        lock = Lock(
            name, backend=self.backend, timeout=timeout, shared=shared, context=HOLDER_CONTEXT
        )
        if not lock.acquire(blocking=False):
            raise AssertionError(f"lock {name!r} is held already: hold() cannot take it")
        try:
            yield lock
        finally:
            with contextlib.suppress(LockLost):  # taken away by lose(): as the test meant
                lock.release()

    def lose(self, name: str) -> int:
        """Take lock ``name`` away from whoever holds it (as an operator's force release
        does) and tell its holders in this process before returning: ``lock.lost``,
        ``on_lost``, the ``lock_lost`` signal and ``lost`` event, and ``LockLost`` when
        they leave ``with``. Returns how many holds were taken away.

        Only holds that auto-renew (the default) are told at once; others find out when
        they next release or extend."""
        records = Listing(self.backend).records(LockQuery(filters=(("exact", name),)))
        taken = sum(
            force_release(self.backend, record.name, record.token, record.mode)
            for record in records
        )
        check_holds_now(name, prefix=self.prefix)
        return taken

    @contextlib.contextmanager
    def unavailable(self) -> Iterator[None]:
        """The lock server cannot be reached by this process's code inside the block:
        ``DISTLOCK`` points at a closed port, so views answer 503 (or run, with
        ``VIEW_FAIL_OPEN``) and ``distlock`` raises ``LockBackendUnavailable``. The server
        itself keeps running (others may be using it); afterwards all works again.
        Locks held already keep their own connections."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as closed:
            closed.bind((HOST, 0))  # bound, never listening: connecting is refused
            port = closed.getsockname()[1]
            current: dict[str, Any] = getattr(settings, "DISTLOCK", None) or {}
            with override_settings(DISTLOCK={**current, "URL": f"redis://{HOST}:{port}/0"}):
                yield

    def held(self) -> list[str]:
        """The names held now under the helper's prefix, sorted (a shared or limited lock
        once, whatever its number of holders)."""
        return sorted({record.name for record in Listing(self.backend).records()})

    def assert_none_held(self) -> None:
        """Fail (``AssertionError``) naming the locks still held under the prefix."""
        held = self.held()
        if held:
            raise AssertionError(f"locks still held: {', '.join(held)}")
