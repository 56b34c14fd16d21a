"""How a task is locked: the options of :func:`~django_distlock.tasks.locked_task`,
validated when the task is defined, and the name template bound to its signature."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..engine import NameTemplate, validate_name, validate_seconds

__all__ = ["ON_BUSY", "Locking", "OnBusy"]

OnBusy = Literal["skip", "defer", "wait"]
ON_BUSY: tuple[str, ...] = ("skip", "defer", "wait")


@dataclass(frozen=True, slots=True)
class Locking:
    """A locked task's options, checked (``TypeError``/``ValueError`` naming the option)."""

    template: str
    is_template: bool
    """Whether the name is filled from the arguments (metrics label it by template)."""
    name_for: Callable[[Sequence[Any], Mapping[str, Any]], str]
    on_busy: str
    wait: float | None
    timeout: float | None
    unique_while_queued: bool
    unique_timeout: float

    @classmethod
    def build(
        cls,
        name: Any,
        func: Callable[..., Any],
        *,
        on_busy: Any,
        blocking_timeout: Any,
        timeout: Any,
        unique_while_queued: Any,
        unique_timeout: Any,
    ) -> Locking:
        """Validate everything now, so that a task that cannot work fails where it is
        defined; ``func`` is the task's function, whose signature fills the template."""
        if on_busy not in ON_BUSY:
            raise ValueError(
                f"on_busy must be one of {', '.join(map(repr, ON_BUSY))}, not {on_busy!r}"
            )
        if not isinstance(unique_while_queued, bool):
            raise TypeError(
                f"unique_while_queued must be a bool, not {type(unique_while_queued).__name__}"
            )
        template = NameTemplate(name)
        if template.is_constant:
            validate_name(name, "name")
        if blocking_timeout is not None:
            wait = validate_seconds(blocking_timeout, "blocking_timeout", allow_zero=True)
        else:
            wait = None if on_busy == "wait" else 0.0
        return cls(
            template=name,
            is_template=not template.is_constant,
            name_for=template.namer(inspect.signature(func), f"{func.__qualname__}()"),
            on_busy=on_busy,
            wait=wait,
            timeout=None if timeout is None else validate_seconds(timeout, "timeout"),
            unique_while_queued=unique_while_queued,
            unique_timeout=validate_seconds(unique_timeout, "unique_timeout"),
        )
