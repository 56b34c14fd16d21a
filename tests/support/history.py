"""Histories of lock operations, as the randomized fault runs record them and the checker
(``tests/support/checker.py``) reads them: Jepsen's model, one record per operation.

Every client process appends :class:`Operation` records to a JSON-lines file of its own
(:class:`Recorder`); a run's history is all of them merged (:func:`read_history`). Times
are ``time.monotonic()`` of one machine (every process of a run is on it), so the
records of different processes can be ordered.

An operation's ``outcome`` is Jepsen's: ``"ok"`` (it happened), ``"fail"`` (it certainly
did not happen: a busy lock, a stale fence refused) or ``"info"`` (unknown: the client
could not tell, e.g. ``LockBackendUnavailable`` on an acquire whose request may have
reached the server).

Kinds and what their fields mean:

- ``acquire``: ``start`` when called, ``end`` when it returned. ``ok``: the lock is held,
  ``fence`` and ``token`` set; ``fail``: not acquired (``detail`` says why: busy,
  timeout); ``info``: an error whose effect is unknown. ``blocking_timeout`` as passed
  (``None``: waits forever; ``0``: non-blocking), ``lease`` the lock's ``timeout``.
- ``release``: ``ok`` released; ``fail`` the lock was found lost (``LockLost``/
  ``LockNotOwned``); ``info`` unknown (Redis unreachable).
- ``lost``: the client was told its hold ended without a release (``on_lost``, a
  ``LockLost`` at release, ``lock.lost`` seen true); ``end`` is when it learned it,
  ``extra["lease_until"]`` the lease end it believed in then (the holder's own record of
  its lease, renewals included).
- ``read``: a read of the shared register guarded by the lock; ``value`` what it read.
- ``write``: a write of the register; ``value`` what it wrote (``read + 1``), ``fence``
  the fence it wrote with (fenced runs); ``ok`` accepted, ``fail`` refused as stale
  (``StaleFence``), ``info`` unknown.

A client that may die in the middle of a write records it first, as an ``info`` write
with detail :data:`PENDING` and the value it is about to commit, then its outcome: the
runner drops the pending record when the outcome is there, and keeps it (a write that may
have taken effect) when the client was killed in between.

``client`` names the process (and task) that ran the operation; ``hold`` numbers the
client's holds, so that an acquire, its register operations, its release or loss share
one ``(client, hold)``.

The faults of a run are not operations: the nemesis logs them
(:class:`tests.support.chaos.nemesis.Fault`, with what each reached and which node served
each lock's key around it), and the checker takes them beside the history.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "PENDING",
    "Kind",
    "Operation",
    "Outcome",
    "Recorder",
    "read_history",
    "write_history",
]

Kind = Literal["acquire", "release", "lost", "read", "write"]
Outcome = Literal["ok", "fail", "info"]

PENDING = "pending"
"""The ``detail`` of a write recorded before its commit (see the module docstring)."""


@dataclass(frozen=True)
class Operation:
    """One operation of one client (see the module docstring for each kind)."""

    client: str
    hold: int
    kind: Kind
    lock: str
    start: float
    end: float
    outcome: Outcome
    mode: str = "exclusive"
    """``exclusive``, ``shared`` or ``limited`` (with ``limit``)."""
    limit: int = 1
    fence: int | None = None
    token: str | None = None
    value: int | None = None
    lease: float | None = None
    blocking_timeout: float | None = None
    fenced: bool = False
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> Operation:
        return cls(**json.loads(line))


class Recorder:
    """Appends one client's operations to ``path`` (one JSON line each, flushed at once,
    so that a client SIGKILLed mid-run leaves every completed operation behind)."""

    def __init__(self, path: str | os.PathLike[str], client: str) -> None:
        self.client = client
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self._holds = 0

    def next_hold(self) -> int:
        """A new hold number for this client."""
        self._holds += 1
        return self._holds

    def record(
        self, kind: Kind, lock: str, start: float, outcome: Outcome, **fields: Any
    ) -> Operation:
        """Record an operation that started at ``start`` and ends now."""
        operation = Operation(
            client=self.client,
            kind=kind,
            lock=lock,
            start=start,
            end=time.monotonic(),
            outcome=outcome,
            **fields,
        )
        self._file.write(operation.to_json() + "\n")
        self._file.flush()
        return operation

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def read_history(paths: Iterable[str | os.PathLike[str]]) -> list[Operation]:
    """Every operation in the JSON-lines files ``paths``, by start time. A last line cut
    short by a killed process is skipped."""
    operations: list[Operation] = []
    for path in paths:
        operations.extend(_read(Path(path)))
    operations.sort(key=lambda op: (op.start, op.end))
    return operations


def _read(path: Path) -> Iterator[Operation]:
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            try:
                yield Operation.from_json(line)
            except (ValueError, TypeError):
                continue


def write_history(path: str | os.PathLike[str], operations: Iterable[Operation]) -> None:
    """Write ``operations`` to ``path`` (hand-made histories, replays)."""
    with open(path, "w", encoding="utf-8") as out:
        for operation in operations:
            out.write(operation.to_json() + "\n")
