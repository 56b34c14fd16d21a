"""Every code example of README.md and docs/*.md runs here (see tests/support/docs_examples.py)."""

from __future__ import annotations

import contextlib
import doctest
import importlib
import inspect
import re
import shlex
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.messages.storage.fallback import FallbackStorage
from django.contrib.sessions.backends.cache import SessionStore
from django.test import RequestFactory, override_settings

import django_distlock
import django_distlock.engine
import django_distlock.models
import django_distlock.signals
from django_distlock import LockError, distlock
from django_distlock.signals import __all__ as signal_names
from tests.support import REPO_ROOT, docs_examples
from tests.support.docs_examples import markdown_files, parse, run_markdown

pytestmark = pytest.mark.django_db(transaction=True)


class Recorder:
    """A stand-in for the reader's own code: remembers how it was called."""

    def __init__(self, name: str, result: Any = None) -> None:
        self.name = name
        self.result = result
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((args, kwargs))
        return self.result

    def __repr__(self) -> str:
        return f"<{self.name}: {len(self.calls)} calls>"


class AsyncRecorder(Recorder):
    """An ``async def`` stand-in."""

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        return super().__call__(*args, **kwargs)


@pytest.fixture
def reader_project(
    redis_client: Any, redis_server: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, Any]]:
    """What the examples take as the reader's own code and state, plus ``hold()``.

    ``hold(name, **options)`` takes a lock as "someone else" would (another lock object,
    no renewal), for examples that show a busy lock or list held ones. ``REDIS_URL`` is
    the suite's server, for examples that build their own client; ``redis_client`` a
    client of it, for hidden blocks that set up what the prose assumes.
    """
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    held: list[Any] = []

    def hold(name: str, timeout: float = 60, auto_renew: bool = False, **options: Any) -> Any:
        lock = distlock(name, timeout=timeout, auto_renew=auto_renew, **options)
        assert lock.acquire(blocking=False), f"{name} is already held"
        held.append(lock)
        return lock

    user = get_user_model().objects.create_superuser("operator", "op@example.com", "pw")
    request = RequestFactory().get("/", {"page": "1"})
    request.user = user
    request.session = SessionStore()
    request._messages = FallbackStorage(request)  # type: ignore[attr-defined]
    namespace: dict[str, Any] = {
        "__name__": "docs_example",
        "hold": hold,
        "redis_client": redis_client,
        "request": request,
        "invoice": SimpleNamespace(pk=42, number="INV-42"),
        "tenant": SimpleNamespace(pk=7),
        "charge": Recorder("charge"),
        "acharge": AsyncRecorder("acharge"),
        "pay": Recorder("pay"),
        "sync_catalog": Recorder("sync_catalog"),
        "payment_gateway": SimpleNamespace(charge=Recorder("gateway", SimpleNamespace(ok=True))),
        "statsd": SimpleNamespace(incr=Recorder("statsd.incr")),
    }
    signals = {name: getattr(django_distlock.signals, name) for name in signal_names}
    receivers = {name: list(signal.receivers) for name, signal in signals.items()}
    with override_settings(DISTLOCK={"EVENTS": "sync"}):
        yield namespace
    for name, signal in signals.items():
        signal.receivers = receivers[name]
        signal.sender_receivers_cache.clear()
    for lock in held:
        with contextlib.suppress(LockError):  # an example force-released it, or it expired
            lock.release()


def _relative(path: Path) -> str:
    return path.relative_to(REPO_ROOT).as_posix()


@pytest.mark.parametrize("path", markdown_files(), ids=_relative)
def test_examples_run(path: Path, reader_project: dict[str, Any], tmp_path: Path) -> None:
    ran = run_markdown(path, reader_project, tmp_path)
    assert ran > 0


def test_every_public_name_has_an_example() -> None:
    public = {
        *django_distlock.__all__,
        *django_distlock.models.__all__,
        *signal_names,
        *django_distlock.engine.__all__,
        "locked_response",
        "unavailable_response",
        "flush_events",
        "prune_events",
        "get_config",
        "observer_for",
    }
    missing = public - docs_examples.documented_names()
    assert not missing, f"no example in README.md or docs/ uses {sorted(missing)}"


def test_every_doc_has_examples_and_none_is_empty() -> None:
    for path in markdown_files():
        blocks = parse(path)
        assert blocks, f"{path} has no examples"
        for block in blocks:
            assert block.text.strip(), f"{block.origin} is empty"


def test_undefined_names_are_caught() -> None:
    source = inspect.cleandoc(
        """
        import os

        def f(x):
            return os.sep + x + helper(x)

        class C:
            field = Missing
        """
    )
    assert docs_examples.undefined_globals(source, {"os": None}) == ["Missing", "helper"]
    assert docs_examples.undefined_globals("await thing()", {}) == ["thing"]


def test_signature_blocks_are_compared(reader_project: dict[str, Any]) -> None:
    def sample(name: str, *, wait: float = 0, fair: bool = False) -> None: ...

    namespace = {"sample": sample}
    docs_examples.check_signature("sample(name, *, wait=0, fair=False)", namespace, "x")
    with pytest.raises(AssertionError, match="documented"):
        docs_examples.check_signature("sample(name, *, wait=1, fair=False)", namespace, "x")


def test_command_output_is_compared(reader_project: dict[str, Any]) -> None:
    reader_project["hold"]("docs:held", context="somewhere")
    command = docs_examples.Command(
        "python manage.py distlock show docs:held", ["context: elsewhere"]
    )
    with pytest.raises(AssertionError, match="elsewhere"):
        docs_examples.run_command(command, "x")
    command.output = ["context: somewhere", "fence: 1795344044155350"]
    docs_examples.run_command(command, "x")
    busy = docs_examples.Command("manage.py distlock show docs:free", ["CommandError: no lock 'x'"])
    with pytest.raises(AssertionError, match="shown"):
        docs_examples.run_command(busy, "x")


def test_parse_reads_hidden_blocks_and_indented_fences(tmp_path: Path) -> None:
    doc = tmp_path / "probe.md"
    doc.write_text(
        "text\n<!-- docs-test\nx = 1\n-->\n- item\n\n  ```python\n  y = x\n  ```\n",
        encoding="utf-8",
    )
    blocks = parse(doc)
    assert [(b.language, b.text, b.line) for b in blocks] == [
        ("hidden", "x = 1\n", 2),
        ("python", "y = x\n", 7),
    ]


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown file."""
    anchors = set()
    in_code = False
    for line in path.read_text(encoding="utf-8").splitlines():
        in_code ^= line.lstrip().startswith("```")
        if line.startswith("#") and not in_code:
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def test_links_between_docs_resolve() -> None:
    """Every relative link of the README and docs names a file that exists, and a heading
    of it when it has an ``#anchor``."""
    checked = 0
    for path in [*markdown_files(), REPO_ROOT / "CHANGELOG.md", REPO_ROOT / "bench" / "README.md"]:
        text = path.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            resolved = (path.parent / file).resolve() if file else path
            assert resolved.exists(), f"{path.name}: link to missing {target}"
            if anchor:
                assert anchor in _anchors(resolved), f"{path.name}: no heading #{anchor}"
            checked += 1
    assert checked > 10


# docs/tasks.md and docs/celery.md are being rewritten in another change (issue 28, the
# tasks queue): add them here once their install lines are in one of the forms below.
INSTALL_LINES_CHECKED = list(markdown_files())
_USER_EXTRAS = {"hiredis", "celery", "tasks", "prometheus", "otel", "testing"}


def _extras() -> set[str]:
    text = (REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8")
    return set(tomllib.loads(text)["project"]["optional-dependencies"])


def _version() -> str:
    text = (REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)["project"]["version"]


def _install_commands(text: str) -> Iterator[tuple[str, str]]:
    """Every ``pip install`` command of a Markdown text (code blocks and inline code),
    with the 300 characters before it."""
    pattern = r"```[^\n]*\n(.*?)```|`([^`]+)`"
    for match in re.finditer(pattern, text, re.S):
        code = match.group(1) if match.group(1) is not None else match.group(2)
        lines = code.splitlines() if match.group(1) is not None else [" ".join(code.split())]
        for line in lines:
            found = re.search(r"\bpip3? install\b[^;)]*", line)  # to the end of the command
            if found:
                yield found.group(0), text[max(match.start() - 300, 0) : match.start()]


def test_install_lines_work_as_written_today() -> None:
    """django-distlock is not on PyPI: an install line is from a checkout (a local path,
    with extras that exist), the wheel built from it (of this version), or a third-party
    package; ``pip install django-distlock``
    appears only where the docs say it is for once it is published."""
    extras = _extras()
    assert extras >= _USER_EXTRAS
    checked = 0
    for path in INSTALL_LINES_CHECKED:
        for command, before in _install_commands(path.read_text(encoding="utf-8")):
            words = shlex.split(command, comments=True)[2:]
            for requirement in (word for word in words if not word.startswith("-")):
                name, _, rest = requirement.partition("[")
                named = set(filter(None, rest.rstrip("]").split(",")))
                assert named <= extras, f"{path.name}: {command!r} names unknown extras"
                if name.endswith(".whl"):  # the wheel python -m build writes, this version
                    assert Path(name).name == f"django_distlock-{_version()}-py3-none-any.whl"
                elif name.startswith((".", "/")):
                    assert "-e" in words or name.startswith("/"), f"{path.name}: {command!r}"
                elif name.lower().replace("_", "-") == "django-distlock":
                    assert "published" in before[-200:], (
                        f"{path.name}: {command!r} does not work until the package is on "
                        "PyPI; install from a checkout, or say it is for once published"
                    )
                checked += 1
    assert checked >= 5


def test_the_installation_lists_every_extra() -> None:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    installation = readme.split("## Installation", 1)[1].split("\n## ", 1)[0]
    for extra in sorted(_USER_EXTRAS):
        assert f"`{extra}`" in installation, f"the Installation does not list {extra!r}"
    line = re.search(r'pip install -e "\./django-distlock\[([\w,]+)\]"', installation)
    assert line is not None
    assert set(line.group(1).split(",")) == _USER_EXTRAS


@pytest.mark.parametrize(
    "module_name",
    [
        "django_distlock.commands.durations",
        "django_distlock.engine",
        "django_distlock.engine.transport.backend",
        "django_distlock.engine.keys",
        "django_distlock.engine.listing.records",
        "django_distlock.engine.templates",
        "django_distlock.commands.supervisor",
        "django_distlock.commands.terminal",
        "django_distlock.managers",
        "django_distlock.telemetry.readings",
    ],
)
def test_docstring_examples_run(module_name: str) -> None:
    """The docstring examples that need no lock held run as doctests too (the others are
    marked ``+SKIP`` and have their executed twins in the docs)."""
    module = importlib.import_module(module_name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0


def test_the_readme_compares_handoffs_like_with_like() -> None:
    """The README's handoff figures are bench/results.md's, each implementation at the
    same percentiles (one server, from ``release()`` returning)."""
    readme = " ".join((REPO_ROOT / "README.md").read_text(encoding="utf-8").split())
    handoff = readme.split("**Handoff**", 1)[1].split("- **", 1)[0]
    shown = re.findall(
        r"(django-distlock|redis-py's `Lock`|python-redis-lock) p50 ([\d.]+) ms, p99 ([\d.]+) ms",
        handoff,
    )
    rows = {"django-distlock": "distlock", "redis-py's `Lock`": "redis-py Lock (sleep=0.1)"}
    results = (REPO_ROOT / "bench" / "results.md").read_text(encoding="utf-8")
    assert {name for name, _p50, _p99 in shown} == {*rows, "python-redis-lock"}
    for name, *figures in shown:
        implementation = rows.get(name, name)
        row = re.search(
            rf"^\| {re.escape(implementation)} +\| +single server \|"
            r" +[\d,]+ \| +[\d.]+ \| +[\d.]+ \| +([\d.]+) \| +([\d.]+) \|",
            results,
            re.M,
        )
        assert row is not None, implementation
        for figure, measured in zip(figures, row.groups(), strict=True):
            decimals = len(figure.partition(".")[2])
            assert abs(float(figure) - float(measured)) <= 0.5 * 10**-decimals + 1e-9, (
                f"README says {name} {figure} ms, bench/results.md {measured} ms"
            )
