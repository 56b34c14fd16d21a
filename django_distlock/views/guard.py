"""What a guarded view does around the view itself, shared by ``lock_view`` and
``LockViewMixin``, sync and async: fill the lock name from the request, take the lock
without waiting (unless asked to), and answer instead of running the view when it is
busy or Redis is down."""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import Http404, HttpRequest
from django.views import View

from ..engine import (
    Lock,
    LockBackendUnavailable,
    NameTemplate,
    TemplateError,
    clean_label,
    validate_name,
    validate_seconds,
)
from ..locks import check_kind, distlock
from ..settings import get_config
from .responses import settings_on_busy, settings_on_unavailable

__all__ = ["Guard", "NameFiller", "bound_view", "dotted_path"]

logger = logging.getLogger("django_distlock.views")

OnBusy = Callable[[HttpRequest, str, float | None], Any]
OnUnavailable = Callable[[HttpRequest, str], Any]
ViewFunction = Callable[..., Any]
Args = tuple[Any, ...]
Kwargs = dict[str, Any]

HELD = object()
"""The lock is held: run the view under it (:meth:`Guard.after_acquire`)."""
UNGUARDED = object()
"""Redis is down and the guard fails open: run the view without the lock."""


def dotted_path(view: Any) -> str:
    """The context label of a guarded view: its dotted path, cut to fit a label."""
    view_class = getattr(view, "view_class", None)  # View.as_view()
    if view_class is None:
        instance = bound_view(view)
        view_class = type(instance) if instance is not None else None
    target = view_class if view_class is not None else view
    module = getattr(target, "__module__", None) or "?"
    qualname = getattr(target, "__qualname__", None) or type(target).__qualname__
    return clean_label(f"{module}.{qualname}")


def bound_view(view: Any) -> View | None:
    """The class-based view instance behind a method wrapped by ``method_decorator``
    (which hands decorators a ``partial`` of the bound method)."""
    func = view.func if isinstance(view, functools.partial) else view
    instance = getattr(func, "__self__", None)
    return instance if isinstance(instance, View) else None


class NameFiller:
    """Turns a request into a lock name: a template or a callable."""

    __slots__ = ("context", "name", "template")

    def __init__(self, name: Any, context: str | None) -> None:
        self.name = name
        self.context = context
        self.template: NameTemplate | None = None
        if callable(name):
            return
        if not isinstance(name, str):
            raise TypeError(
                f"lock name{self._of_view()} must be a str template or a callable, "
                f"not {type(name).__name__}"
            )
        try:
            self.template = NameTemplate(name)
        except ValueError as exc:
            raise ImproperlyConfigured(f"{exc}{self._of_view()}") from None

    def _of_view(self) -> str:
        return f" of view {self.context}" if self.context else ""

    def check_signature(self, view: Callable[..., Any]) -> None:
        """Report template fields the view can never receive, at decoration time."""
        if self.template is None:
            return
        try:
            parameters = list(inspect.signature(view).parameters.values())
        except (TypeError, ValueError):
            return
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
            return
        known = {p.name for p in parameters[1:]} | {"request"}  # the first gets the request
        for field, root in self.template.unknown_fields(known):
            if root and not root.isdigit():
                raise ImproperlyConfigured(
                    f"lock name {self.name!r}{self._of_view()} uses {{{field}}}, "
                    f"but the view takes no argument {root!r}; use a URL keyword "
                    "argument of the view or request (e.g. {request.user.pk})"
                )

    def __call__(self, request: HttpRequest, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The lock name for this request; ``Http404`` when the URL's values cannot make
        a valid one (too long, NUL, not UTF-8): such a URL names no object to lock, as a
        URL that matches no pattern names no page."""
        try:
            if self.template is None:
                return validate_name(self.name(request, *args, **kwargs), "lock name")
            return self.template.fill({**kwargs, "request": request}, args)
        except TemplateError as exc:
            raise ImproperlyConfigured(
                f"{exc}{self._of_view()} (URL keyword arguments: {sorted(kwargs)}, plus request)"
            ) from exc
        except ValueError as exc:
            raise Http404(f"this URL gives no valid lock name: {exc}") from None


class Guard:
    """What a guarded view does around the view itself; shared by sync and async."""

    __slots__ = (
        "auto_renew",
        "blocking_timeout",
        "context",
        "fail_open",
        "fair",
        "limit",
        "namer",
        "on_busy",
        "on_unavailable",
        "reentrant",
        "shared",
        "timeout",
    )

    def __init__(
        self,
        name: Any,
        *,
        context: str | None,
        blocking_timeout: Any,
        timeout: Any,
        auto_renew: Any,
        fair: Any,
        on_busy: Any,
        on_unavailable: Any,
        fail_open: Any,
        limit: Any = None,
        shared: Any = False,
        reentrant: Any = False,
    ) -> None:
        self.context = context or ""
        self.namer = NameFiller(name, context)
        check_kind(limit=limit, shared=shared, reentrant=reentrant)
        self.limit: int | None = limit
        self.shared: bool = shared
        self.reentrant: bool = reentrant
        self.blocking_timeout = validate_seconds(
            blocking_timeout, "blocking_timeout", allow_zero=True
        )
        self.timeout = None if timeout is None else validate_seconds(timeout, "timeout")
        self.auto_renew = optional_bool(auto_renew, "auto_renew")
        self.fair = optional_bool(fair, "fair", optional=False)
        if on_busy is not None and not callable(on_busy):
            raise TypeError(f"on_busy must be callable or None, not {type(on_busy).__name__}")
        self.on_busy: OnBusy = on_busy if on_busy is not None else settings_on_busy
        if on_unavailable is not None and not callable(on_unavailable):
            raise TypeError(
                f"on_unavailable must be callable or None, not {type(on_unavailable).__name__}"
            )
        self.on_unavailable: OnUnavailable = (
            on_unavailable if on_unavailable is not None else settings_on_unavailable
        )
        self.fail_open = optional_bool(fail_open, "fail_open")

    def lock_for(self, request: HttpRequest, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Lock:
        lock = distlock(
            self.namer(request, args, kwargs),
            timeout=self.timeout,
            blocking_timeout=self.blocking_timeout,
            auto_renew=self.auto_renew,
            fair=self.fair,
            context=self.context,
            limit=self.limit,
            shared=self.shared,
            reentrant=self.reentrant,
        )
        if self.namer.template is not None:
            lock.template = self.namer.template.template  # what metrics label it by
        return lock

    def runs_unguarded(self, lock: Lock, error: LockBackendUnavailable) -> bool:
        """With Redis down: True to run the view without the lock (fail open), else
        False (the caller answers 503). Logged either way."""
        fail_open = self.fail_open if self.fail_open is not None else get_config().view_fail_open
        if fail_open:
            message = "django-distlock: running %s without lock %r (fail_open): %s"
        else:
            message = "django-distlock: answering 503 for %s, lock %r: %s"
        logger.warning(message, self.context, lock.name, error)
        return fail_open

    def after_acquire(
        self, request: HttpRequest, lock: Lock, outcome: bool | LockBackendUnavailable
    ) -> Any:
        """What follows an acquire that returned ``outcome`` (or raised it): :data:`HELD`
        (run the view under the lock), :data:`UNGUARDED` (run it without: fail open), or
        the answer instead of the view (from an async view's hooks, maybe awaitable)."""
        if isinstance(outcome, LockBackendUnavailable):
            if self.runs_unguarded(lock, outcome):
                return UNGUARDED
            return self.on_unavailable(request, lock.name)
        if not outcome:
            return self.on_busy(request, lock.name, lock.retry_after)
        return HELD

    def run(self, view: ViewFunction, request: HttpRequest, args: Args, kwargs: Kwargs) -> Any:
        lock = self.lock_for(request, args, kwargs)
        try:
            outcome: bool | LockBackendUnavailable = lock.acquire()
        except LockBackendUnavailable as error:
            outcome = error
        then = self.after_acquire(request, lock, outcome)
        if then is UNGUARDED:
            return view(request, *args, **kwargs)
        if then is not HELD:
            return then
        # Leaving behaves exactly like leaving ``with lock``: a lost lock raises LockLost.
        with contextlib.ExitStack() as stack:
            stack.push(lock)
            request.distlock = lock  # type: ignore[attr-defined]
            return view(request, *args, **kwargs)

    async def arun(
        self, view: ViewFunction, request: HttpRequest, args: Args, kwargs: Kwargs
    ) -> Any:
        lock = self.lock_for(request, args, kwargs)
        try:
            outcome: bool | LockBackendUnavailable = await lock.aacquire()
        except LockBackendUnavailable as error:
            outcome = error
        then = self.after_acquire(request, lock, outcome)
        if then is UNGUARDED:
            return await view(request, *args, **kwargs)
        if then is not HELD:
            return await then if inspect.isawaitable(then) else then
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_exit(lock)
            request.distlock = lock  # type: ignore[attr-defined]
            return await view(request, *args, **kwargs)


def optional_bool(value: Any, argument: str, *, optional: bool = True) -> bool | None:
    if (value is None and optional) or isinstance(value, bool):
        return value
    raise TypeError(f"{argument} must be a bool, not {type(value).__name__}")
