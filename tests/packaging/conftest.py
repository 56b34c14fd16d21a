"""The built distributions, made once per run for the packaging tests."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import REPO_ROOT


@dataclass(frozen=True)
class Built:
    """What ``python -m build`` wrote: one sdist and one wheel."""

    sdist: Path
    wheel: Path


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """``python -m build`` of the checkout, as a release is made: the sdist, then the wheel
    built from that sdist, each in an isolated build environment."""
    outdir = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(outdir), str(REPO_ROOT)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    (sdist,) = outdir.glob("*.tar.gz")
    (wheel,) = outdir.glob("*.whl")
    return Built(sdist=sdist, wheel=wheel)
