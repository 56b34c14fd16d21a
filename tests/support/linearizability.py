"""Is one register's history linearizable? Wing & Gong's search with Lowe's memoization
(a small knossos), for the register the checker (:mod:`tests.support.checker`) finds under
a fenced lock.

The model: a register holding an int (``initial`` at first), read and written by
:class:`~tests.support.history.Operation` records of kind ``read`` and ``write``. An
``ok`` operation took effect once, at some instant between its ``start`` and ``end``; an
``info`` write may have taken effect, at any instant after its ``start`` (even after the
end of the history), or never. The history is linearizable if some order of those
instants, where each read returns what the last write before it wrote, exists. ``fail``
operations and ``info`` reads constrain nothing and are left out, and so is an ``info``
write no ``ok`` read can have seen (no read of its value ends after it starts): taking
effect, it could only be overwritten unseen.

The search places, one after the other, operations that no unplaced ``ok`` operation
ended before (Wing & Gong), and remembers each ``(placed, value, unused info writes)``
state it has been in, never exploring one twice (Lowe). It runs segment by segment: the
history is cut wherever no ``ok`` operation is in flight, and the states a segment can end
in, the register's value and the ``info`` writes that have not yet taken effect, are where
the next one starts. Exact, and small per segment; a segment of more than
``max_operations`` operations (its ``info`` writes included), or a search visiting more than
``max_states`` states, gives up with :attr:`Verdict.TOO_LONG`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from tests.support.history import Operation

__all__ = ["MAX_OPERATIONS", "MAX_STATES", "Linearization", "Verdict", "check_register"]

MAX_OPERATIONS = 100
"""Operations per segment past which :func:`check_register` gives up."""
MAX_STATES = 200_000
"""States per segment past which :func:`check_register` gives up."""


class Verdict(StrEnum):
    """What :func:`check_register` concluded."""

    LINEARIZABLE = "linearizable"
    NOT_LINEARIZABLE = "not linearizable"
    TOO_LONG = "too long to check"


@dataclass(frozen=True)
class Linearization:
    """What :func:`check_register` found. ``operations``: for ``NOT_LINEARIZABLE``, the
    operations none of which could come next at the furthest point the search reached
    (``value`` the register's value there); for ``TOO_LONG``, the segment given up on."""

    verdict: Verdict
    operations: tuple[Operation, ...] = ()
    value: int | None = None

    @property
    def linearizable(self) -> bool:
        """Whether the history was found linearizable (not: given up on)."""
        return self.verdict is Verdict.LINEARIZABLE


State = tuple[int | None, frozenset[int]]
"""The register's value and the ``info`` writes (indices) that have not taken effect."""


class _TooLong(Exception):
    pass


def check_register(
    operations: Sequence[Operation],
    *,
    initial: int = 0,
    max_operations: int = MAX_OPERATIONS,
    max_states: int = MAX_STATES,
) -> Linearization:
    """Whether the reads and writes of one register in ``operations`` are linearizable
    (see the module docstring)."""
    done = sorted(
        (op for op in operations if op.outcome == "ok" and op.kind in ("read", "write")),
        key=lambda op: (op.start, op.end),
    )
    seen_until: dict[int | None, float] = {}
    for op in done:
        if op.kind == "read":
            seen_until[op.value] = max(seen_until.get(op.value, -math.inf), op.end)
    maybe = sorted(
        (
            op
            for op in operations
            if op.outcome == "info"
            and op.kind == "write"
            and seen_until.get(op.value, -math.inf) > op.start
        ),
        key=lambda op: op.start,
    )
    states: set[State] = {(initial, frozenset())}
    joined = 0  # info writes started before the current segment's end
    for segment, cut in _segments(done):
        fresh = frozenset(range(joined, joined + _started_before(maybe[joined:], cut)))
        joined += len(fresh)
        search = _Search(segment, maybe, max_states)
        carried = frozenset().union(*(unused for _, unused in states)) | fresh
        if len(segment) + len(carried) > max_operations:
            return Linearization(Verdict.TOO_LONG, tuple(segment))
        try:
            for value, unused in states:
                search.run(value, unused | fresh)
        except _TooLong:
            return Linearization(Verdict.TOO_LONG, tuple(segment))
        if not search.finals:
            return Linearization(Verdict.NOT_LINEARIZABLE, search.stuck(), search.stuck_value)
        states = search.finals
    return Linearization(Verdict.LINEARIZABLE)


def _segments(done: list[Operation]) -> list[tuple[list[Operation], float]]:
    """``done`` (by start) cut where no operation is in flight: each segment with the
    start of the next one (infinity for the last)."""
    segments: list[tuple[list[Operation], float]] = []
    current: list[Operation] = []
    reach = float("-inf")
    for op in done:
        if current and op.start > reach:
            segments.append((current, op.start))
            current = []
        current.append(op)
        reach = max(reach, op.end)
    if current:
        segments.append((current, float("inf")))
    return segments


def _started_before(maybe: Sequence[Operation], cut: float) -> int:
    count = 0
    while count < len(maybe) and maybe[count].start < cut:
        count += 1
    return count


class _Search:
    """Wing & Gong's search over one segment, memoized; ``finals`` collects the states it
    can end in."""

    def __init__(self, ops: list[Operation], maybe: list[Operation], max_states: int) -> None:
        self.ops = ops
        self.maybe = maybe
        self.max_states = max_states
        self.full = (1 << len(ops)) - 1
        self.seen: set[tuple[int, int | None, frozenset[int]]] = set()
        self.finals: set[State] = set()
        self.deepest = -1
        self.stuck_mask = 0
        self.stuck_value: int | None = None

    def run(self, value: int | None, unused: frozenset[int]) -> None:
        self._visit(0, value, unused)

    def _visit(self, mask: int, value: int | None, unused: frozenset[int]) -> None:
        key = (mask, value, unused)
        if key in self.seen:
            return
        self.seen.add(key)
        if len(self.seen) > self.max_states:
            raise _TooLong
        if mask == self.full:
            self.finals.add((value, unused))
            return
        if mask.bit_count() > self.deepest:
            self.deepest, self.stuck_mask, self.stuck_value = mask.bit_count(), mask, value
        horizon = self._horizon(mask)
        for index, op in enumerate(self.ops):
            if op.start > horizon:
                break
            if mask >> index & 1:
                continue
            if op.kind == "write":
                self._visit(mask | 1 << index, op.value, unused)
            elif op.value == value:
                self._visit(mask | 1 << index, value, unused)
        for index in unused:
            if self.maybe[index].start <= horizon:
                self._visit(mask, self.maybe[index].value, unused - {index})

    def _horizon(self, mask: int) -> float:
        """The earliest end among the unplaced operations: whatever started later must
        come after that one."""
        return min(op.end for index, op in enumerate(self.ops) if not mask >> index & 1)

    def stuck(self) -> tuple[Operation, ...]:
        horizon = self._horizon(self.stuck_mask)
        return tuple(
            op
            for index, op in enumerate(self.ops)
            if not self.stuck_mask >> index & 1 and op.start <= horizon
        )
