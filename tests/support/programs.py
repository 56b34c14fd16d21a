"""Programs for the ``distlock run`` tests (``tests/commands/test_supervisor.py`` and
``tests/management/commands/test_distlock.py``): a shell script whose child keeps working,
the case a supervisor that signals or waits for one PID gets wrong."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.engine import wait_until


@dataclass(frozen=True)
class WritingScript:
    """``sh -c 'WRITER & ...'``: the shell is the program (the leader of its process
    group), the writer its child, appending a line to ``written`` every 20 ms."""

    command: list[str]
    written: Path
    pid_file: Path

    def writer_pid(self) -> int:
        """The writer's PID, once it has written its first line."""
        wait_until(lambda: self.lines() > 0)
        return int(self.pid_file.read_text().split()[0])

    def process_group(self) -> int:
        """The writer's process group (the shell's, that is the program's)."""
        wait_until(lambda: self.lines() > 0)
        return int(self.pid_file.read_text().split()[1])

    def lines(self) -> int:
        """How many lines the writer has written so far."""
        return len(self.written.read_text().splitlines()) if self.written.exists() else 0

    def still_writing(self, within: float = 0.3) -> bool:
        """Whether the writer adds a line within ``within`` seconds."""
        before = self.lines()
        time.sleep(within)
        return self.lines() > before

    def writer_exists(self) -> bool:
        """Whether the writer's PID still names a process (a zombie counts: it is still
        a member of its group until someone reaps it)."""
        try:
            os.kill(self.writer_pid(), 0)
        except ProcessLookupError:
            return False
        return True

    def kill_writer(self) -> None:
        """Clean-up: a writer left behind by a failing test does not outlive it."""
        fields = self.pid_file.read_text().split() if self.pid_file.exists() else []
        if fields:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(fields[0]), signal.SIGKILL)


def writing_script(
    directory: Path, *, then: str = "wait", ignore_sigterm: bool = False, lines: int | None = None
) -> WritingScript:
    """A shell script that starts a writer in the background, then runs ``then`` (``wait``
    for it, or ``exit 3`` at once). The writer writes ``lines`` lines (``None``: until it is
    killed) and ignores SIGTERM if ``ignore_sigterm``."""
    written, pid_file = directory / "written", directory / "writer.pid"
    writer = f"""
import os, signal, time
if {ignore_sigterm!r}:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open({str(pid_file)!r}, "w") as out:
    out.write(f"{{os.getpid()}} {{os.getpgrp()}}")
limit, count = {lines!r}, 0
while limit is None or count < limit:
    with open({str(written)!r}, "a") as out:
        out.write(f"{{time.time()}}\\n")
    count += 1
    time.sleep(0.02)
"""
    script = f"{shlex.quote(sys.executable)} -c {shlex.quote(writer)} & {then}"
    return WritingScript(["sh", "-c", script], written, pid_file)
