"""The fault-injection tests use the engine tests' backends and sync/async ``api``
(proxies and forked children are fixtures of ``tests/conftest.py``, shared with
``tests/harness/``)."""

from __future__ import annotations

from tests.engine.conftest import (  # noqa: F401 - fixtures shared with the engine tests
    api,
    backend,
    backend_on,
    dead_backend,
    kind_topology,
    make_backend,
    recorder,
)
