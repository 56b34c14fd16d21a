"""``lock_view`` and ``LockViewMixin``: views that never run twice at once for one object.

The decorator and the mixin share one guard: it fills the lock name from the request,
takes a :func:`~django_distlock.distlock` lock without waiting (unless asked to), and
answers 423 when the lock is busy or 503 when Redis is down. Sync views hold the lock
with the sync API, async views with the async API; the wrapper is chosen once, when the
view is decorated.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import math
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.core.exceptions import ImproperlyConfigured
from django.http import Http404, HttpRequest, HttpResponse
from django.views import View

from .engine import Lock
from .engine.exceptions import LockBackendUnavailable
from .engine.keys import clean_label, validate_name, validate_seconds
from .engine.templates import NameTemplate, TemplateError
from .locks import distlock
from .settings import configured_hook, get_config

__all__ = [
    "UNAVAILABLE_RETRY_AFTER",
    "LockViewMixin",
    "lock_view",
    "locked_response",
    "unavailable_response",
]

logger = logging.getLogger(__name__)

UNAVAILABLE_RETRY_AFTER = 5
"""``Retry-After`` seconds of the 503 answered while Redis cannot be reached."""

LockName = str | Callable[..., str]
OnBusy = Callable[[HttpRequest, str, float | None], Any]
OnUnavailable = Callable[[HttpRequest, str], Any]
ViewT = TypeVar("ViewT", bound=Callable[..., Any])


def locked_response(request: HttpRequest, name: str, retry_after: float | None) -> HttpResponse:
    """The default answer of a guarded view whose lock is busy: ``423 Locked`` with
    ``Retry-After`` (the holder's remaining lease, rounded up, at least one second).

    Custom ``on_busy`` callables can delegate to it and adjust the response::

        def on_busy(request, name, retry_after):
            response = locked_response(request, name, retry_after)
            response["Cache-Control"] = "no-store"
            return response
    """
    seconds = _retry_after_seconds(retry_after)
    response = HttpResponse(
        f"Locked: {name!r} is in use; retry in {seconds} s.\n",
        status=423,
        content_type="text/plain; charset=utf-8",
    )
    response["Retry-After"] = str(seconds)
    return response


def _retry_after_seconds(retry_after: float | None) -> int:
    if retry_after is None or not math.isfinite(retry_after):
        return 1
    return max(1, math.ceil(retry_after))


def unavailable_response(request: HttpRequest, name: str) -> HttpResponse:
    """The default answer of a guarded view when Redis cannot be reached: ``503`` with
    ``Retry-After`` (``UNAVAILABLE_RETRY_AFTER`` seconds). Custom ``on_unavailable``
    callables can delegate to it."""
    response = HttpResponse(
        f"Service unavailable: the lock service for {name!r} cannot be reached.\n",
        status=503,
        content_type="text/plain; charset=utf-8",
    )
    response["Retry-After"] = str(UNAVAILABLE_RETRY_AFTER)
    return response


def _configured_hook(key: str, default: Callable[..., Any]) -> Callable[..., Any]:
    """The callable ``DISTLOCK[key]`` names, else ``default``. Read at request time, so
    that ``override_settings`` applies."""
    hook = configured_hook(key)
    return default if hook is None else hook


def _settings_on_busy(request: HttpRequest, name: str, retry_after: float | None) -> Any:
    return _configured_hook("VIEW_ON_BUSY", locked_response)(request, name, retry_after)


def _settings_on_unavailable(request: HttpRequest, name: str) -> Any:
    return _configured_hook("VIEW_ON_UNAVAILABLE", unavailable_response)(request, name)


def _dotted_path(view: Any) -> str:
    """The context label of a guarded view: its dotted path, cut to fit a label."""
    view_class = getattr(view, "view_class", None)  # View.as_view()
    if view_class is None:
        instance = _bound_view(view)
        view_class = type(instance) if instance is not None else None
    target = view_class if view_class is not None else view
    module = getattr(target, "__module__", None) or "?"
    qualname = getattr(target, "__qualname__", None) or type(target).__qualname__
    return clean_label(f"{module}.{qualname}")


def _bound_view(view: Any) -> View | None:
    """The class-based view instance behind a method wrapped by ``method_decorator``
    (which hands decorators a ``partial`` of the bound method)."""
    func = view.func if isinstance(view, functools.partial) else view
    instance = getattr(func, "__self__", None)
    return instance if isinstance(instance, View) else None


class _Namer:
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


class _Guard:
    """What a guarded view does around the view itself; shared by sync and async."""

    __slots__ = (
        "auto_renew",
        "blocking_timeout",
        "context",
        "fail_open",
        "fair",
        "namer",
        "on_busy",
        "on_unavailable",
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
    ) -> None:
        self.context = context or ""
        self.namer = _Namer(name, context)
        self.blocking_timeout = validate_seconds(
            blocking_timeout, "blocking_timeout", allow_zero=True
        )
        self.timeout = None if timeout is None else validate_seconds(timeout, "timeout")
        self.auto_renew = _optional_bool(auto_renew, "auto_renew")
        self.fair = _optional_bool(fair, "fair", optional=False)
        if on_busy is not None and not callable(on_busy):
            raise TypeError(f"on_busy must be callable or None, not {type(on_busy).__name__}")
        self.on_busy: OnBusy = on_busy if on_busy is not None else _settings_on_busy
        if on_unavailable is not None and not callable(on_unavailable):
            raise TypeError(
                f"on_unavailable must be callable or None, not {type(on_unavailable).__name__}"
            )
        self.on_unavailable: OnUnavailable = (
            on_unavailable if on_unavailable is not None else _settings_on_unavailable
        )
        self.fail_open = _optional_bool(fail_open, "fail_open")

    def lock_for(self, request: HttpRequest, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Lock:
        return distlock(
            self.namer(request, args, kwargs),
            timeout=self.timeout,
            blocking_timeout=self.blocking_timeout,
            auto_renew=self.auto_renew,
            fair=self.fair,
            context=self.context,
        )

    def runs_unguarded(self, lock: Lock, error: LockBackendUnavailable) -> bool:
        """With Redis down: True to run the view without the lock (fail open), else
        False (the caller answers 503). Logged either way."""
        fail_open = self.fail_open if self.fail_open is not None else get_config().view_fail_open
        if fail_open:
            logger.warning(
                "django-distlock: running %s without lock %r (fail_open): %s",
                self.context,
                lock.name,
                error,
            )
        else:
            logger.warning(
                "django-distlock: answering 503 for %s, lock %r: %s",
                self.context,
                lock.name,
                error,
            )
        return fail_open

    def run(
        self,
        view: Callable[..., Any],
        request: HttpRequest,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        lock = self.lock_for(request, args, kwargs)
        try:
            acquired = lock.acquire()
        except LockBackendUnavailable as error:
            if self.runs_unguarded(lock, error):
                return view(request, *args, **kwargs)
            return self.on_unavailable(request, lock.name)
        if not acquired:
            return self.on_busy(request, lock.name, lock.retry_after)
        # Leaving behaves exactly like leaving ``with lock``: a lost lock raises LockLost.
        with contextlib.ExitStack() as stack:
            stack.push(lock)
            request.distlock = lock  # type: ignore[attr-defined]
            return view(request, *args, **kwargs)

    async def arun(
        self,
        view: Callable[..., Any],
        request: HttpRequest,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        lock = self.lock_for(request, args, kwargs)
        try:
            acquired = await lock.aacquire()
        except LockBackendUnavailable as error:
            if self.runs_unguarded(lock, error):
                return await view(request, *args, **kwargs)
            response = self.on_unavailable(request, lock.name)
            return await response if inspect.isawaitable(response) else response
        if not acquired:
            response = self.on_busy(request, lock.name, lock.retry_after)
            return await response if inspect.isawaitable(response) else response
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_exit(lock)
            request.distlock = lock  # type: ignore[attr-defined]
            return await view(request, *args, **kwargs)


def _optional_bool(value: Any, argument: str, *, optional: bool = True) -> bool | None:
    if (value is None and optional) or isinstance(value, bool):
        return value
    raise TypeError(f"{argument} must be a bool, not {type(value).__name__}")


def lock_view(
    name: LockName,
    *,
    blocking_timeout: float = 0,
    timeout: float | None = None,
    auto_renew: bool | None = None,
    fair: bool = False,
    on_busy: OnBusy | None = None,
    on_unavailable: OnUnavailable | None = None,
    fail_open: bool | None = None,
) -> Callable[[ViewT], ViewT]:
    """Run a view under a distributed lock, so it never runs twice at once for one object.

    ``name`` is a template filled from the view's URL keyword arguments and ``request``
    with ``str.format`` rules, or a callable ``name(request, *args, **kwargs) -> str``::

        @lock_view("invoice:{invoice_id}")
        def pay(request, invoice_id): ...

        @lock_view("cart:{request.user.pk}", blocking_timeout=2)
        async def checkout(request): ...

        @method_decorator(lock_view("report:{day}"), name="dispatch")
        class ReportView(View): ...

    When the lock is busy (after waiting ``blocking_timeout`` seconds, default 0)
    ``on_busy(request, name, retry_after)`` answers: this argument, else the callable
    named by ``DISTLOCK["VIEW_ON_BUSY"]``, else :func:`locked_response` (423 with
    ``Retry-After``). When Redis cannot be reached ``on_unavailable(request, name)``
    answers (this argument, else ``DISTLOCK["VIEW_ON_UNAVAILABLE"]``, else
    :func:`unavailable_response`: 503 with ``Retry-After``), unless ``fail_open``
    (default ``DISTLOCK["VIEW_FAIL_OPEN"]``) runs the view unguarded.
    ``timeout``, ``auto_renew`` and ``fair`` are passed to :func:`distlock`; the lock's
    context label is the view's dotted path. A lock lost while the view ran raises
    ``LockLost`` when the view returns, as leaving ``with distlock(...)`` does.

    While the view runs, ``request.distlock`` is the held lock, so the view can fence
    its writes: ``Invoice.objects.filter(pk=pk).fenced_update(request.distlock, ...)``.
    """
    _Guard(  # reject bad options at import time, not on the first request
        name,
        context=None,
        blocking_timeout=blocking_timeout,
        timeout=timeout,
        auto_renew=auto_renew,
        fair=fair,
        on_busy=on_busy,
        on_unavailable=on_unavailable,
        fail_open=fail_open,
    )

    def decorator(view: ViewT) -> ViewT:
        if not callable(view):
            raise TypeError(f"lock_view decorates views, not {type(view).__name__}")
        guard = _Guard(
            name,
            context=_dotted_path(view),
            blocking_timeout=blocking_timeout,
            timeout=timeout,
            auto_renew=auto_renew,
            fair=fair,
            on_busy=on_busy,
            on_unavailable=on_unavailable,
            fail_open=fail_open,
        )
        guard.namer.check_signature(view)
        instance = _bound_view(view)
        # An async class-based view's dispatch() is a plain method returning a coroutine.
        if iscoroutinefunction(view) or (instance is not None and instance.view_is_async):

            @functools.wraps(view)
            async def async_wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
                return await guard.arun(view, request, args, kwargs)

            return markcoroutinefunction(async_wrapper)  # type: ignore[return-value]

        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            return guard.run(view, request, args, kwargs)

        return wrapper  # type: ignore[return-value]

    return decorator


class LockViewMixin:
    """Run a class-based view's ``dispatch`` under a distributed lock (see
    :func:`lock_view`); put it before ``View`` in the bases::

        class PayInvoice(LockViewMixin, View):
            lock_name = "invoice:{pk}"
            lock_blocking_timeout = 2

            def post(self, request, pk): ...

    ``lock_name`` (required) is a template filled from the URL keyword arguments and
    ``request``, or a method ``lock_name(self, request, *args, **kwargs) -> str``.
    Override :meth:`lock_busy` (busy lock) or :meth:`lock_unavailable` (Redis down) to
    answer differently. Async views (all
    handlers ``async def``) hold the lock with the async API.
    """

    lock_name: LockName | None = None
    lock_timeout: float | None = None
    lock_blocking_timeout: float = 0
    lock_auto_renew: bool | None = None
    lock_fair: bool = False
    lock_fail_open: bool | None = None

    def lock_busy(self, request: HttpRequest, name: str, retry_after: float | None) -> Any:
        """The response when the lock is busy: ``DISTLOCK["VIEW_ON_BUSY"]``'s, else
        :func:`locked_response` (423 with ``Retry-After``)."""
        return _settings_on_busy(request, name, retry_after)

    def lock_unavailable(self, request: HttpRequest, name: str) -> Any:
        """The response when Redis cannot be reached: ``DISTLOCK["VIEW_ON_UNAVAILABLE"]``'s,
        else :func:`unavailable_response` (503 with ``Retry-After``)."""
        return _settings_on_unavailable(request, name)

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        """Take the lock, then dispatch as usual (a coroutine for async views)."""
        view = type(self)
        if self.lock_name is None:
            raise ImproperlyConfigured(
                f"{view.__qualname__} uses LockViewMixin but has no lock_name; set it to "
                "a template such as 'invoice:{pk}' or define "
                "lock_name(self, request, *args, **kwargs)"
            )
        guard = _Guard(
            self.lock_name,
            context=clean_label(f"{view.__module__}.{view.__qualname__}"),
            blocking_timeout=self.lock_blocking_timeout,
            timeout=self.lock_timeout,
            auto_renew=self.lock_auto_renew,
            fair=self.lock_fair,
            on_busy=self.lock_busy,
            on_unavailable=self.lock_unavailable,
            fail_open=self.lock_fail_open,
        )
        handler = super().dispatch  # type: ignore[misc]
        if getattr(view, "view_is_async", False):
            return guard.arun(handler, request, args, kwargs)
        return guard.run(handler, request, args, kwargs)
