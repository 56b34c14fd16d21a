"""The lock engine: Redis locks with fencing, notification-based waiting and lease
renewal, for sync and async code. It does not import Django.

>>> import redis
>>> from django_distlock.engine import Backend, Lock
>>> backend = Backend(redis.Redis(), async_client=redis.asyncio.Redis)
>>> with Lock("invoice:42", backend=backend) as lock:   # doctest: +SKIP
...     print(lock.fence)
"""

from .backend import Backend, Event, Observer
from .core import Tuning
from .exceptions import (
    LockBackendError,
    LockBackendUnavailable,
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
)
from .keys import MAX_NAME_LENGTH, MAX_SECONDS, LockKeys, validate_name
from .lock import Lock

__all__ = [
    "MAX_NAME_LENGTH",
    "MAX_SECONDS",
    "Backend",
    "Event",
    "Lock",
    "LockBackendError",
    "LockBackendUnavailable",
    "LockError",
    "LockKeys",
    "LockLost",
    "LockNotAcquired",
    "LockNotOwned",
    "Observer",
    "Tuning",
    "validate_name",
]
