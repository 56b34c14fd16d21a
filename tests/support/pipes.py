"""Reading a child's output after some of it was read line by line.

``Popen.communicate`` reads the pipes' file descriptors directly, so lines that an earlier
``process.stdout.readline()`` pulled into the text wrapper's buffer, but did not return, are
lost to it. A child that writes its first lines at once (a demo command with
``--step-seconds 0``) hands several to one ``readline``; CI lost ``step 2/2`` that way.
"""

from __future__ import annotations

import subprocess
import threading


def finish(process: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """The rest of ``process``'s stdout and stderr, read through its file objects (their
    buffers included) until it exits; the pipes are closed after. Raises
    ``subprocess.TimeoutExpired`` if it runs past ``timeout``. Both pipes are drained at
    once, so a child that fills one cannot block."""
    outputs: dict[str, str] = {}
    readers = [
        threading.Thread(target=lambda key=key, pipe=pipe: outputs.__setitem__(key, pipe.read()))
        for key, pipe in (("out", process.stdout), ("err", process.stderr))
        if pipe is not None
    ]
    for reader in readers:
        reader.daemon = True
        reader.start()
    process.wait(timeout=timeout)
    for reader in readers:
        reader.join(timeout)
    for pipe in (process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()
    return outputs.get("out", ""), outputs.get("err", "")
