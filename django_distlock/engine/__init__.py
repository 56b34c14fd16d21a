"""The lock engine: Redis locks with fencing, notification-based waiting and lease
renewal, for sync and async code, and the listing of the locks held. It does not import
Django: the Django layer (settings, views, commands, events, the admin) is built on it.

>>> import redis
>>> from django_distlock.engine import Backend, Lock
>>> backend = Backend(redis.Redis(), async_client=redis.asyncio.Redis)
>>> with Lock("invoice:42", backend=backend) as lock:   # doctest: +SKIP
...     print(lock.fence)
"""

from .backend import Backend, Event, Observer
from .exceptions import (
    LockBackendError,
    LockBackendUnavailable,
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
    LockNotReplicated,
)
from .hold import LostCause
from .keys import MAX_CONTEXT_LENGTH, MAX_NAME_LENGTH, MAX_SECONDS, LockKeys, validate_name
from .listing import Listing, LockQuery, Page
from .lock import Lock
from .many import LockGroup
from .records import LockRecord
from .templates import NameTemplate, TemplateError
from .tuning import Tuning

__all__ = [
    "MAX_CONTEXT_LENGTH",
    "MAX_NAME_LENGTH",
    "MAX_SECONDS",
    "Backend",
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
    "TemplateError",
    "Tuning",
    "validate_name",
]
