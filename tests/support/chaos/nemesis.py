"""The nemesis of a chaos run: a seeded schedule of faults (:func:`schedule`), carried
out one at a time by a thread (:class:`Nemesis`) and logged (:class:`Fault`).

The schedule is a pure function of the seed, the fault kinds and the run's length:
``random.Random(seed)`` picks when each fault starts, which kind, how long it lasts and
a seed for choosing its target, so a failing run is replayed with the same seed. What
each kind does to a topology is in :mod:`.sites`; the client faults are here:

- ``client-pause``: SIGSTOP a client process, SIGCONT it after the duration (a GC pause;
  durations go past the lease, so its lock may be taken meanwhile);
- ``client-kill``: SIGKILL a client process (the runner starts a new one in its place);
- ``holder-pause``: a ``client-pause`` of the client holding a lock now (any client if
  none does): not among the default kinds, for runs that must pause holders
  (``tests/faults/test_mutations.py``);
- ``client-interrupt`` (the caller's own fault, :data:`CALLER_FAULTS`): SIGUSR1 to a
  client process, whose next lock call is interrupted at a random point of its own
  choosing (``tests/support/chaos/workloads.py``): a sync client gets a
  ``KeyboardInterrupt`` raised from a signal handler at whatever bytecode it is in; an
  async client's hold is cancelled by an ``asyncio.timeout`` expiring, a failing
  ``TaskGroup`` sibling or ``cancel()`` twice. The client records the interruption and
  carries on with its next hold.

The caller's faults, and the sites' transient server errors (``server-busy``,
``server-loading``: :data:`~.sites.TRANSIENT_FAULTS`), are drawn only when a run asks
for them (``fault_kinds(site, caller=True)``), so that the schedules of the older seeds
stay what they were.

Every fault is healed when it ends, and :meth:`Nemesis.stop` heals whatever is still
injected before it returns.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "CALLER_FAULTS",
    "CLIENT_FAULTS",
    "DURATIONS",
    "Clients",
    "Fault",
    "Nemesis",
    "Planned",
    "Site",
    "fault_kinds",
    "schedule",
]

# Seconds each fault kind lasts, as (low, high); (0, 0) for an instant fault.
DURATIONS: dict[str, tuple[float, float]] = {
    "client-pause": (0.3, 2.5),
    "holder-pause": (0.3, 2.5),
    "client-kill": (0.0, 0.0),
    "server-pause": (0.1, 0.6),
    "server-restart": (0.2, 1.0),
    "replica-pause": (0.3, 2.0),
    "replica-kill": (0.3, 1.5),
    "proxy-delay": (0.3, 1.5),
    "proxy-stall": (0.2, 1.5),
    "proxy-cut": (0.0, 0.0),
    "proxy-lose-reply": (0.0, 0.0),
    "client-kill-connections": (0.0, 0.0),
    "maxmemory": (0.3, 1.5),
    "failover": (0.0, 0.0),
    "primary-crash": (0.0, 0.0),
    "slot-migration": (0.5, 1.5),
    "client-interrupt": (0.0, 0.0),
    # Under Sentinel's and Cluster's failure detection (1 s), lest a busy server look dead.
    "server-busy": (0.3, 0.9),
    "server-loading": (0.3, 1.0),
}
CLIENT_FAULTS = ("client-pause", "client-kill")
CALLER_FAULTS = ("client-interrupt",)
_PROCESS_FAULTS = (*CLIENT_FAULTS, *CALLER_FAULTS, "holder-pause")


@dataclass(frozen=True)
class Planned:
    """One fault of the schedule: ``at`` seconds after the run's start."""

    at: float
    kind: str
    duration: float
    seed: int


@dataclass
class Fault:
    """A fault as it was carried out: monotonic ``start`` and ``end`` (``end`` is when it
    was healed; equal for an instant fault), its ``target`` and what happened."""

    kind: str
    target: str
    start: float
    end: float
    detail: str = ""
    reaches: tuple[str, ...] = ()
    """What the fault reached: nodes (``port N``), client names, or ``connections``
    (every client's connections to the servers)."""
    serving: dict[str, str] = dataclasses.field(default_factory=dict)
    """The node serving each lock name's key when the fault began."""
    serving_after: dict[str, str] = dataclasses.field(default_factory=dict)
    """The same when it ended."""

    def to_dict(self) -> dict[str, Any]:
        """For JSON."""
        return dataclasses.asdict(self)


class Clients(Protocol):
    """The runner's client processes, as the nemesis acts on them."""

    def live(self) -> list[str]:
        """Names of the clients now running."""
        ...

    def pause(self, name: str) -> None:
        """SIGSTOP client ``name``."""
        ...

    def resume(self, name: str) -> None:
        """SIGCONT client ``name``."""
        ...

    def kill(self, name: str) -> None:
        """SIGKILL client ``name`` and start another in its place."""
        ...

    def interrupt(self, name: str) -> None:
        """Signal client ``name`` to interrupt its next lock call (SIGUSR1)."""
        ...

    def pid(self, name: str) -> int:
        """The process id of client ``name``."""
        ...


class Site(Protocol):
    """A running topology, as the nemesis acts on it (see :mod:`.sites`)."""

    fault_kinds: Sequence[str]
    transient_kinds: Sequence[str]

    def inject(self, kind: str, duration: float, rng: random.Random) -> tuple[str, str]:
        """Inject a fault of ``kind`` for ``duration`` seconds and heal it; returns
        ``(target, detail)``."""
        ...

    def heal(self) -> None:
        """Undo whatever fault is still injected."""
        ...

    def serving(self) -> dict[str, str]:
        """The node (``port N``) serving each lock name's key now."""
        ...

    def reaches(self, kind: str, target: str, detail: str) -> tuple[str, ...]:
        """What a fault of ``kind`` on ``target`` reached (see :attr:`Fault.reaches`)."""
        ...

    def holder_pids(self) -> set[int]:
        """The process ids holding a lock now."""
        ...


def schedule(
    seed: int,
    kinds: Sequence[str],
    seconds: float,
    *,
    mean_gap: float = 1.0,
    at_least_once: Sequence[str] = (),
) -> list[Planned]:
    """The faults of a run of ``seconds``: one at a time, ``kinds`` chosen uniformly,
    gaps exponential with mean ``mean_gap``; none starts in the last second, so that
    every fault ends (and is healed) around the run's end.

    Each kind of ``at_least_once`` (among ``kinds``) the draw left out then takes the
    place of a fault of another kind, chosen by the same generator (its start and target
    seed kept, its duration drawn for the new kind): a run meets its topology's own
    faults whatever its seed. Without it the schedule is what it always was."""
    rng = random.Random(seed)
    planned: list[Planned] = []
    at = rng.uniform(0.2, 0.2 + mean_gap)
    while at < seconds - 1.0:
        kind = rng.choice(list(kinds))
        duration = round(rng.uniform(*DURATIONS[kind]), 3)
        planned.append(Planned(round(at, 3), kind, duration, rng.getrandbits(32)))
        at += duration + rng.expovariate(1 / mean_gap)
    required = [kind for kind in dict.fromkeys(at_least_once) if kind in kinds]
    for kind in required:
        if any(fault.kind == kind for fault in planned):
            continue
        others = [i for i, fault in enumerate(planned) if fault.kind not in required]
        if not others:
            break
        index = rng.choice(others)
        duration = round(rng.uniform(*DURATIONS[kind]), 3)
        planned[index] = dataclasses.replace(planned[index], kind=kind, duration=duration)
    return planned


class Nemesis:
    """Carries out ``plan`` (from :func:`schedule`) on ``site`` and ``clients`` in a
    thread, from :meth:`start` on; :attr:`faults` is the log. A fault whose injection
    raises is logged with the error (kind ``...``, detail ``error: ...``) and the run goes
    on: the topology is healed before the next one."""

    def __init__(self, plan: Sequence[Planned], site: Site, clients: Clients) -> None:
        self.plan = list(plan)
        self.site = site
        self.clients = clients
        self.faults: list[Fault] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nemesis", daemon=True)
        self._began = 0.0
        self._paused: str | None = None

    def start(self) -> None:
        """Start carrying out the plan, its times counted from now."""
        self._began = time.monotonic()
        self._thread.start()

    def stop(self, timeout: float = 60.0) -> None:
        """Stop after the fault in progress and heal everything."""
        self._stop.set()
        self._thread.join(timeout)
        self._heal()

    def _run(self) -> None:
        for planned in self.plan:
            if self._stop.wait(max(0.0, self._began + planned.at - time.monotonic())):
                return
            serving = self.site.serving()
            start = time.monotonic()
            try:
                target, detail = self._inject(planned)
            except Exception as error:
                target, detail = "?", f"error: {error!r}"
                self.errors.append(f"{planned}: {traceback.format_exc()}")
                self._heal()
            end = time.monotonic()
            reaches = (
                (target,)
                if planned.kind in (*CLIENT_FAULTS, "holder-pause")
                else self.site.reaches(planned.kind, target, detail)
            )
            fault = Fault(planned.kind, target, start, end, detail, reaches, serving)
            fault.serving_after = self.site.serving()
            self.faults.append(fault)

    def _inject(self, planned: Planned) -> tuple[str, str]:
        rng = random.Random(planned.seed)
        if planned.kind not in _PROCESS_FAULTS:
            return self.site.inject(planned.kind, planned.duration, rng)
        live = sorted(self.clients.live())
        if not live:
            return "none", "no client running"
        if planned.kind == "holder-pause":
            holders = self.site.holder_pids()
            live = [name for name in live if self.clients.pid(name) in holders] or live
        name = rng.choice(live)
        if planned.kind == "client-kill":
            self.clients.kill(name)
            return name, ""
        if planned.kind == "client-interrupt":
            self.clients.interrupt(name)
            return name, "SIGUSR1"
        self._paused = name
        self.clients.pause(name)
        self._stop.wait(planned.duration)
        self.clients.resume(name)
        self._paused = None
        return name, ""

    def _heal(self) -> None:
        if self._paused is not None:
            self.clients.resume(self._paused)
            self._paused = None
        self.site.heal()


def fault_kinds(site: Site, *, caller: bool = False) -> list[str]:
    """Every fault kind the nemesis can inject on ``site``; with ``caller``, the caller's
    own faults and the transient server errors too."""
    kinds = [*CLIENT_FAULTS, *site.fault_kinds]
    if caller:
        kinds += [*CALLER_FAULTS, *site.transient_kinds]
    return kinds
