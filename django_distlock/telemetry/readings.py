"""What the metrics backends (:mod:`.prometheus` for Prometheus, :mod:`.otel` for
OpenTelemetry) read from an event alike: its ``lock`` label, what it counts as (the result
of an acquire or a renewal), which holds are still running, the histograms' buckets, and
:class:`Recorder`, the dispatch of each kind of event to a backend's handlers.

Django-free, like the engine: both backends can observe a hand-built
:class:`~django_distlock.engine.Backend` too.

Labels carry a lock's name *template* (or a coarser group), never the name itself:
``invoice:{id}`` would otherwise make a time series per invoice.

>>> label = labeller("template")
>>> label(Event("acquired", "report:2026-11-23", 1, "", "h", 1, "t", template="report:{day}"))
'report:{day}'
>>> label(Event("acquired", "invoice:42", 1, "", "h", 1, "t"))
'invoice'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ..engine import Event

__all__ = [
    "ACQUIRE_RESULTS",
    "HOLD_BUCKETS",
    "LABEL_MODES",
    "RENEW_RESULTS",
    "WAIT_BUCKETS",
    "LiveHolds",
    "Recorder",
    "acquire_result",
    "labeller",
    "renew_result",
]

LABEL_MODES = ("template", "prefix", "none")
"""What ``DISTLOCK["METRICS_LABEL"]`` may say the ``lock`` label holds."""

ACQUIRE_RESULTS = ("acquired", "busy", "timeout", "error")
"""How an acquire ends: got the lock; busy and not waiting; waited ``blocking_timeout``
in vain; raised (Redis unreachable or refusing, too few replicas acknowledged)."""

RENEW_RESULTS = ("ok", "error", "lost")
"""How a watchdog renewal ends: the lease was renewed; Redis did not answer (retried
while the lease lasts); the lock was no longer ours."""

WAIT_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
)  # fmt: skip
"""Bucket bounds (seconds) of the acquire-time histograms: an uncontended acquire takes
well under a millisecond on a LAN, a contended one up to its ``blocking_timeout``."""

HOLD_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600,
)  # fmt: skip
"""Bucket bounds (seconds) of the hold-time histograms: a view holds its lock for
milliseconds, a nightly job for an hour."""

_ACQUIRE_OUTCOMES = {"acquired", "contended", "error", "not_replicated"}


def _template_label(event: Event) -> str:
    return event.template or event.name.partition(":")[0]


def _prefix_label(event: Event) -> str:
    return (event.template or event.name).partition(":")[0]


def _no_label(event: Event) -> str:
    return ""


_LABELLERS: dict[str, Callable[[Event], str]] = {
    "template": _template_label,
    "prefix": _prefix_label,
    "none": _no_label,
}


def labeller(mode: str) -> Callable[[Event], str]:
    """The ``lock`` label of an event for ``mode`` (one of :data:`LABEL_MODES`):

    - ``"template"``: the template the name was filled from (``"report:{day}"``, for
      the locks of a decorator or of ``lock_view``); for a name given as is, the name
      up to its first ``:`` (``"invoice:42"`` -> ``"invoice"``; the whole name when it
      has none), since nothing tells a constant from an f-string;
    - ``"prefix"``: the template (or name) up to its first ``:``;
    - ``"none"``: ``""`` for every lock (Prometheus treats an empty label as absent).
    """
    try:
        return _LABELLERS[mode]
    except KeyError:
        raise ValueError(f"unknown label mode {mode!r}; use one of {LABEL_MODES}") from None


def acquire_result(event: Event) -> str | None:
    """What ``event`` says about an acquire, one of :data:`ACQUIRE_RESULTS`; ``None``
    when it is not the end of one."""
    kind = event.kind
    if kind not in _ACQUIRE_OUTCOMES:
        return None
    if kind == "acquired":
        return "acquired"
    if kind == "contended":
        return "timeout" if event.cause == "timeout" else "busy"
    return "error"


def renew_result(event: Event) -> str | None:
    """What ``event`` says about a watchdog renewal, one of :data:`RENEW_RESULTS`;
    ``None`` when it is not one."""
    if event.kind == "renewed":
        return "ok"
    if event.kind == "renew_failed":
        return "lost" if event.cause == "gone" else "error"
    return None


T = TypeVar("T")


class LiveHolds(Generic[T]):
    """The holds of this process that have not ended yet, each with what a backend
    keeps for it (a span, a label).

    A hold starts with its ``acquired`` event and ends once, with the first of
    ``released``, ``lost`` or ``release_failed`` (a release Redis did not answer: the
    holder gave the lock up, and it expires at its lease end). Events of holds taken
    before the backend started observing end nothing. Kept by the metrics thread; read
    from others (:meth:`values`, for OpenTelemetry's collection).
    """

    __slots__ = ("_holds",)

    def __init__(self) -> None:
        self._holds: dict[tuple[str, int | None, str], T] = {}

    def start(self, event: Event, value: T) -> None:
        """Remember the hold ``event`` (an ``acquired`` one) starts, with ``value``."""
        self._holds[event.name, event.fence, event.thread] = value

    def end(self, event: Event) -> T | None:
        """Forget the hold ``event`` ends; return its value, ``None`` if it was not live."""
        return self._holds.pop((event.name, event.fence, event.thread), None)

    def values(self) -> list[T]:
        """What is kept for each live hold: a snapshot (one step under the GIL, safe
        while other threads start and end holds)."""
        return list(self._holds.values())

    def __len__(self) -> int:
        return len(self._holds)


class Recorder(Generic[T]):
    """What a backend's recorder shares: the ``lock`` label of its mode (``label``), the
    live holds (each with the ``T`` the backend keeps for it), and the dispatch of each
    kind of event to :meth:`acquired`, :meth:`failed` (an acquire that did not get the
    lock), :meth:`ended` (a hold's end) or :meth:`renewed` (a watchdog renewal); other
    kinds are not measured. Called on the metrics thread as ``recorder(event, noted)``
    (:func:`~django_distlock.telemetry.recorder.deferred`)."""

    __slots__ = ("_handlers", "_label", "_live")

    def __init__(self, label: str) -> None:
        self._label = labeller(label)
        self._live: LiveHolds[T] = LiveHolds()
        failed, ended, renewed = self.failed, self.ended, self.renewed
        self._handlers: dict[str, Callable[[Event, Any], None]] = {
            "acquired": self.acquired,
            "contended": failed,
            "error": failed,
            "not_replicated": failed,
            "released": ended,
            "lost": ended,
            "release_failed": ended,
            "renewed": renewed,
            "renew_failed": renewed,
        }

    def __call__(self, event: Event, noted: Any = None) -> None:
        """Record ``event``; ``noted`` is what was noted where it happened."""
        handler = self._handlers.get(event.kind)
        if handler is not None:
            handler(event, noted)

    def acquired(self, event: Event, noted: Any) -> None:
        """An acquire got the lock."""
        raise NotImplementedError

    def failed(self, event: Event, noted: Any) -> None:
        """An acquire ended without the lock (:func:`acquire_result` says how)."""
        raise NotImplementedError

    def ended(self, event: Event, noted: Any) -> None:
        """A hold ended: released, lost, or given up by a release Redis did not answer."""
        raise NotImplementedError

    def renewed(self, event: Event, noted: Any) -> None:
        """A watchdog renewal ended (:func:`renew_result` says how)."""
        raise NotImplementedError
