"""``lock_view`` and ``LockViewMixin``: views that never run twice at once for one object.

The decorator and the mixin share one guard (:mod:`django_distlock.views.guard`): it
fills the lock name from the request, takes a :func:`~django_distlock.distlock` lock
without waiting (unless asked to), and answers 423 when the lock is busy or 503 when
Redis is down (:mod:`django_distlock.views.responses`, whose functions are importable from
here too). Sync views hold the lock with the sync API, async views with the async API;
the wrapper is chosen once, when the view is decorated.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

from ..engine import clean_label
from ..locks import check_kind
from .guard import Guard, OnBusy, OnUnavailable, bound_view, dotted_path
from .responses import (
    UNAVAILABLE_RETRY_AFTER,
    locked_response,
    settings_on_busy,
    settings_on_unavailable,
    unavailable_response,
)

LockName = str | Callable[..., str]
ViewT = TypeVar("ViewT", bound=Callable[..., Any])

__all__ = [
    "UNAVAILABLE_RETRY_AFTER",
    "LockViewMixin",
    "lock_view",
    "locked_response",
    "unavailable_response",
]


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
    limit: int | None = None,
    shared: bool = False,
    reentrant: bool = False,
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

    Kinds (at most one, as for :func:`distlock`; a bad combination raises ``ValueError``
    when the view is decorated): ``limit=N`` lets up to N requests run the view at once
    for one name, and the next one gets the busy answer (423, ``Retry-After`` from the
    holder whose lease ends first); ``shared=True`` takes a shared hold, so that views
    reading an object run together while one holding it exclusively (a plain
    ``lock_view`` of the same name) keeps them out; ``reentrant=True`` lets code the
    view calls take the same name again with ``distlock(name, reentrant=True)``::

        @lock_view("export:{account_id}", limit=2)
        def export(request, account_id): ...

    While the view runs, ``request.distlock`` is the held lock, so the view can fence
    its writes: ``Invoice.objects.filter(pk=pk).fenced_update(request.distlock, ...)``.
    """
    options: dict[str, Any] = {
        "blocking_timeout": blocking_timeout,
        "timeout": timeout,
        "auto_renew": auto_renew,
        "fair": fair,
        "on_busy": on_busy,
        "on_unavailable": on_unavailable,
        "fail_open": fail_open,
        "limit": limit,
        "shared": shared,
        "reentrant": reentrant,
    }
    Guard(name, context=None, **options)  # bad options fail at import, not on a request

    def decorator(view: ViewT) -> ViewT:
        if not callable(view):
            raise TypeError(f"lock_view decorates views, not {type(view).__name__}")
        guard = Guard(name, context=dotted_path(view), **options)
        guard.namer.check_signature(view)
        instance = bound_view(view)
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
    ``lock_limit``, ``lock_shared`` and ``lock_reentrant`` choose the kind of lock, as
    ``limit``, ``shared`` and ``reentrant`` do for :func:`lock_view` (checked when the
    class is defined).
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
    lock_limit: int | None = None
    lock_shared: bool = False
    lock_reentrant: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        try:
            check_kind(limit=cls.lock_limit, shared=cls.lock_shared, reentrant=cls.lock_reentrant)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{cls.__module__}.{cls.__qualname__}: {exc}") from None

    def lock_busy(self, request: HttpRequest, name: str, retry_after: float | None) -> Any:
        """The response when the lock is busy: ``DISTLOCK["VIEW_ON_BUSY"]``'s, else
        :func:`locked_response` (423 with ``Retry-After``)."""
        return settings_on_busy(request, name, retry_after)

    def lock_unavailable(self, request: HttpRequest, name: str) -> Any:
        """The response when Redis cannot be reached: ``DISTLOCK["VIEW_ON_UNAVAILABLE"]``'s,
        else :func:`unavailable_response` (503 with ``Retry-After``)."""
        return settings_on_unavailable(request, name)

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        """Take the lock, then dispatch as usual (a coroutine for async views)."""
        view = type(self)
        if self.lock_name is None:
            raise ImproperlyConfigured(
                f"{view.__qualname__} uses LockViewMixin but has no lock_name; set it to "
                "a template such as 'invoice:{pk}' or define "
                "lock_name(self, request, *args, **kwargs)"
            )
        guard = Guard(
            self.lock_name,
            context=clean_label(f"{view.__module__}.{view.__qualname__}"),
            blocking_timeout=self.lock_blocking_timeout,
            timeout=self.lock_timeout,
            auto_renew=self.lock_auto_renew,
            fair=self.lock_fair,
            on_busy=self.lock_busy,
            on_unavailable=self.lock_unavailable,
            fail_open=self.lock_fail_open,
            limit=self.lock_limit,
            shared=self.lock_shared,
            reentrant=self.lock_reentrant,
        )
        handler = super().dispatch  # type: ignore[misc]
        if getattr(view, "view_is_async", False):
            return guard.arun(handler, request, args, kwargs)
        return guard.run(handler, request, args, kwargs)
