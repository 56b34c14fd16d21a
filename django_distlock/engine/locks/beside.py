"""The engine's extension point: state a layer built on locks keeps beside one lock name,
and the scripts that read and write it together with the lock's own key.

A :class:`BesideLock` names keys of other kinds in the lock's slot
(``PREFIX{bb}:KIND:NAME``, :meth:`~..keys.LockKeys.beside`) and runs a :class:`Script`
(or a plain command) on the server holding them, in one round trip, under the engine's
request rules: every reply read, Redis errors raised as ``LockError``, on a Redis
Cluster the node serving the slot (redirects followed), ``NOSCRIPT`` answered with
``EVAL``. It accepts only the lock's key and keys it named itself, so nothing is written
outside the backend's prefix or the lock's slot.

The package's own task integrations keep their queue claims this way
(:mod:`django_distlock.runs.claims`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..keys import LockKeys
from ..listing.query import current_holder
from ..listing.records import LockRecord
from ..protocol.ops import Call, Script
from ..transport.drivers import SyncDriver

if TYPE_CHECKING:
    from ..transport.backend import Backend

__all__ = ["BesideLock"]


class BesideLock:
    """Keys beside lock ``name`` of ``backend``, and the scripts run on them (sync).

    >>> beside = BesideLock(backend, "import:7")                    # doctest: +SKIP
    >>> claim = beside.key("myapp-claim")                           # doctest: +SKIP
    >>> beside.run(CLAIM, (claim, beside.lock), ("task-1",))        # doctest: +SKIP
    """

    __slots__ = ("_driver", "_keys", "_named", "backend", "lock", "name")

    def __init__(self, backend: Backend, name: str) -> None:
        self.backend = backend
        self.name = name
        self._keys = LockKeys.for_name(backend.prefix, name)
        self.lock = self._keys.lock
        """The lock's own key (a script may read it: who holds the lock, if anyone)."""
        self._named = {self.lock}
        self._driver = SyncDriver(backend, name)

    def key(self, kind: str) -> str:
        """The key of ``kind`` beside the lock (lowercase letters, digits and ``-``, none
        of the engine's own kinds; ``ValueError`` otherwise)."""
        key = self._keys.beside(kind)
        self._named.add(key)
        return key

    def run(self, script: Script, keys: Sequence[str], args: Sequence[str | int] = ()) -> Any:
        """Run ``script`` with ``keys`` (the lock's key and keys from :meth:`key`, at least
        one) and ``args``; its reply as redis-py reads it (bytes for strings)."""
        return self._driver.call(Call(script, self._own(keys), tuple(args)))

    def execute(self, key: str, *command: Any) -> Any:
        """Run one plain command (``"SET", key, ...``) on the server holding ``key`` (the
        lock's key or one from :meth:`key`)."""
        self._own((key,))
        return self._driver.execute(key, *command)

    def holder(self) -> LockRecord | None:
        """Who holds the lock (exclusive) now, if anyone: :func:`current_holder`."""
        return current_holder(self.backend, self.name)

    def _own(self, keys: Sequence[str]) -> tuple[str, ...]:
        keys = tuple(keys)
        strangers = [key for key in keys if key not in self._named]
        if not keys or strangers:
            raise ValueError(
                f"keys beside lock {self.name!r} are its own key and those key() named, "
                f"not {strangers or 'none'}"
            )
        return keys
