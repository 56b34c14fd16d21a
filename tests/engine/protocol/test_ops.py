"""The requests steps yield and how their errors read."""

from __future__ import annotations

import pytest
from redis.exceptions import ConnectionError, ResponseError

from django_distlock.engine.protocol.ops import interrupted


@pytest.mark.parametrize(
    "wrapped",
    [False, True],
    ids=["as-replied", "redis-py-8.2-sentinel"],
)
def test_a_wait_a_failover_ended_reads_as_interrupted_however_redis_py_reports_it(wrapped):
    """A demoted primary ends every ``BLPOP`` with ``UNBLOCKED``. redis-py 8.2's Sentinel
    connection turns that reply into ``ConnectionError("The previous master is now a
    slave")`` raised while handling it; earlier versions raise the reply itself. Both
    are a failover to ride out, not a lost server."""
    unblocked = ResponseError("UNBLOCKED force unblock from blocking operation")
    error: BaseException = unblocked
    if wrapped:
        try:
            try:
                raise unblocked
            except ResponseError:
                raise ConnectionError("The previous master is now a slave") from None
        except ConnectionError as exc:
            error = exc
    assert interrupted(error)
    assert not interrupted(ConnectionError("Connection reset by peer"))
