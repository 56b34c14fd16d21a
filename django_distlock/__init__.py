"""django-distlock: correct, fast, observable distributed locks on Redis for Django.

>>> from django_distlock import distlock
>>> with distlock("invoice:42"):          # doctest: +SKIP
...     pay(invoice)

The Django-facing names are imported on first use, so that importing the Django-free
engine (``django_distlock.engine``) never imports Django. ``django_distlock.__version__``
is the installed distribution's version (``importlib.metadata``).
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import TYPE_CHECKING, Any

from .engine import (
    LockBackendError,
    LockBackendUnavailable,
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    LockNotReplicated,
)

if TYPE_CHECKING:
    from .commands.locked import LockedCommand, LockedCommandMixin
    from .fencing import FencedQuerySet, FenceField, StaleFence
    from .locks import distlock, distlock_many
    from .views import LockViewMixin, lock_view

__all__ = [
    "FenceField",
    "FencedQuerySet",
    "LockBackendError",
    "LockBackendUnavailable",
    "LockError",
    "LockLost",
    "LockNotAcquired",
    "LockNotOwned",
    "LockNotReplicated",
    "LockViewMixin",
    "LockedCommand",
    "LockedCommandMixin",
    "StaleFence",
    "distlock",
    "distlock_many",
    "lock_view",
]

_LAZY = {
    "distlock": ".locks",
    "distlock_many": ".locks",
    "lock_view": ".views",
    "LockViewMixin": ".views",
    "LockedCommand": ".commands.locked",
    "LockedCommandMixin": ".commands.locked",
    "FenceField": ".fencing",
    "FencedQuerySet": ".fencing",
    "StaleFence": ".fencing",
}


def __getattr__(name: str) -> Any:
    if name == "__version__":  # the installed distribution's, so it is never out of step
        return importlib.metadata.version("django-distlock")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
