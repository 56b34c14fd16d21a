"""Fixtures for the fault-injection tests: the engine tests' backends and sync/async
``api``, plus proxies and forked children that are always cleaned up."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.engine.conftest import (  # noqa: F401 - fixtures shared with the engine tests
    api,
    backend,
    dead_backend,
    make_backend,
    recorder,
)
from tests.support.forking import ForkedChild, fork_child
from tests.support.proxy import TcpProxy
from tests.support.redis_servers import RedisServer


@pytest.fixture
def make_proxy() -> Iterator[Callable[[RedisServer], TcpProxy]]:
    """``make_proxy(server)``: a :class:`TcpProxy` in front of ``server``, closed after
    the test."""
    proxies: list[TcpProxy] = []

    def make(server: RedisServer) -> TcpProxy:
        proxy = TcpProxy("127.0.0.1", server.port)
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.close()


@pytest.fixture
def fork() -> Iterator[Callable[[Callable[[], Any]], ForkedChild[Any]]]:
    """``fork(func)``: run ``func`` in a forked child (see ``tests.support.forking``);
    children still running after the test are killed."""
    children: list[ForkedChild[Any]] = []

    def start(func: Callable[[], Any]) -> ForkedChild[Any]:
        child = fork_child(func)
        children.append(child)
        return child

    yield start
    for child in children:
        child.kill()
