"""The lock engine: Redis locks with fencing, notification-based waiting and lease
renewal, for sync and async code, and the listing of the locks held. It does not import
Django: the Django layer (settings, views, commands, events, the admin) is built on it.

Its ``__all__`` is the whole public API, and the Django layer uses nothing else: the lock
objects (``Lock``, ``LockGroup``) and where they live (``Backend``, ``Tuning``), what an
observer is told (``Event``, ``Observer``, ``LostCause``), the exceptions, names and
their checks (``LockKeys``, ``NameTemplate``, the limits and modes), the listing
(``Listing``, ``LockQuery``, ``Page``, ``LockRecord``, ``force_release``), process and
test hooks (``forget_after_fork``, ``check_holds_now``, ``BackgroundWorker``), the
eviction check, who holds a lock now (``current_holder``), and the extension point for
layers that keep state beside a lock (``BesideLock``, running a ``Script``: the task
integrations' queue claims are built on it, outside the engine). The rooms below it
(``protocol``, ``transport``, ``listing``, ``renewal``, ``locks``) are its internals:
docs/architecture.md draws them.

>>> import redis
>>> from django_distlock.engine import Backend, Lock
>>> backend = Backend(redis.Redis(), async_client=redis.asyncio.Redis)
>>> with Lock("invoice:42", backend=backend) as lock:   # doctest: +SKIP
...     print(lock.fence)
"""

from .background import BackgroundWorker
from .exceptions import (
    LockBackendError,
    LockBackendUnavailable,
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    LockNotReplicated,
)
from .keys import (
    AUTO_REPLICAS,
    EXCLUSIVE,
    LIMITED,
    MAX_CONTEXT_LENGTH,
    MAX_NAME_LENGTH,
    MAX_SECONDS,
    MODES,
    SHARED,
    LockKeys,
    clean_label,
    validate_name,
    validate_prefix,
    validate_replicas,
    validate_seconds,
)
from .listing.query import Listing, LockQuery, Page, current_holder, force_release
from .listing.records import LockRecord
from .locks.beside import BesideLock
from .locks.group import LockGroup
from .locks.lock import Lock
from .process import forget_after_fork
from .protocol.hold import Event, LostCause, Observer
from .protocol.ops import Script
from .renewal.watchdog import check_holds_now
from .templates import NameTemplate, TemplateError
from .transport.backend import Backend
from .transport.eviction import SAFE_EVICTION_POLICY, unsafe_eviction_policy
from .tuning import Tuning

__all__ = [
    "AUTO_REPLICAS",
    "EXCLUSIVE",
    "LIMITED",
    "MAX_CONTEXT_LENGTH",
    "MAX_NAME_LENGTH",
    "MAX_SECONDS",
    "MODES",
    "SAFE_EVICTION_POLICY",
    "SHARED",
    "Backend",
    "BackgroundWorker",
    "BesideLock",
    "Event",
    "Listing",
    "Lock",
    "LockBackendError",
    "LockBackendUnavailable",
    "LockError",
    "LockGroup",
    "LockKeys",
    "LockLost",
    "LockNotAcquired",
    "LockNotOwned",
    "LockNotReplicated",
    "LockQuery",
    "LockRecord",
    "LostCause",
    "NameTemplate",
    "Observer",
    "Page",
    "Script",
    "TemplateError",
    "Tuning",
    "check_holds_now",
    "clean_label",
    "current_holder",
    "force_release",
    "forget_after_fork",
    "unsafe_eviction_policy",
    "validate_name",
    "validate_prefix",
    "validate_replicas",
    "validate_seconds",
]
