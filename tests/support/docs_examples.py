"""Run the code examples of a Markdown file, so that the docs cannot drift from the code.

A file is run top to bottom in one namespace, like a doctest:

- A ```` ```python ```` block is executed. Top-level ``await``/``async with`` run on a fresh
  event loop. Every global name the block uses, also inside the functions and classes it
  defines, must exist once it has run: examples import what they use.
- A block whose first line is ``# path/to/module.py`` becomes that module of a throwaway
  project on ``sys.path``: its packages are created, its app is installed when it is
  ``<app>/models.py`` or a management command (models get their tables), and what it
  defines is visible to the blocks after it. ``# settings.py`` blocks are checked instead
  (``DISTLOCK`` must validate, and equal the defaults when it lists every key).
- ```` ```python signature ```` blocks show a callable's signature: parameter names, kinds
  and defaults must match the callable named before the parenthesis (resolved in the
  file's namespace).
- ```` ```console ```` (``$ `` lines), ```` ```bash ```` and ```` ```cron ```` commands
  that run ``manage.py`` are run with ``call_command``. A documented ``CommandError: ...``
  must be raised with the same words up to the first one that varies (holds a digit),
  and documented output lines without digits must appear in the real output. Other
  shell commands must be listed, with the test that runs them, in ``RUN_ELSEWHERE``.
- ``<!-- docs-test ... -->`` comments are hidden Python run in the same namespace: the
  state an example assumes (a lock held by someone else) and checks of what it did.
- Blocks of any other language must be listed in ``NOT_CODE`` with what they are.
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import contextlib
import importlib.util
import inspect
import io
import re
import shlex
import symtable
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings

from django_distlock.connections import lock_servers
from django_distlock.settings import DEFAULTS, _build, get_config
from tests.support import REPO_ROOT

FENCE = re.compile(r"^(?P<indent> *)```(?P<info>[^`]*)$")
HEADER = re.compile(r"^# (?P<path>[\w/]+\.py)\s*$")

# Shell commands the docs show that these tests do not run, and what runs them.
RUN_ELSEWHERE = {
    "python3 testproject/demo.py": "tests/test_demo.py starts the demo and requests its pages",
    "python3 tests/run.py": ".ci/run is this command",
    "python -m build ./django-distlock": "tests/packaging/conftest.py builds the checkout so",
    "pip install ./django-distlock/dist/": "tests/packaging/test_wheel.py installs the built "
    "wheel into a clean venv",
    "pip install -e ./django-distlock": "an install from a checkout; tests/run.py installs"
    " the same way (pip install -e .[test]) before running this suite",
    'pip install -e "./django-distlock[': "an install from a checkout with extras; "
    "tests/run.py installs the test extra, which has what every extra brings (test_docs "
    "checks that the extras named exist)",
    ".venv/bin/pip install -e '.[bench]'": "the bench extra; bench/README.md",
    ".venv/bin/python bench/": "benchmarks are run by hand, their output is bench/results.md",
    "manage.py distlock run": "runs a program of yours; "
    "tests/management/commands/test_distlock.py runs it with real programs, signals and "
    "exit codes",
    "echo $?": "the exit status of the command before it, shown in its output",
    "celery -A proj": "tests/celery/ runs real celery worker and beat processes",
    "mkdir -p /run/myproject/prometheus": "a gunicorn deployment's set-up; "
    "tests/telemetry/test_multiprocess.py runs worker processes in multiprocess mode",
    "PROMETHEUS_MULTIPROC_DIR=/run/myproject/prometheus gunicorn": "the same",
    "manage.py db_worker": "tests/tasks/test_workers.py runs db_worker processes "
    "(tests/support/task_workers.py)",
}

# Fenced blocks that are not code, by (file, first line of the block).
NOT_CODE = {
    (
        "docs/architecture.md",
        "  Django faces    views/  commands/ (locked, listing, release, run) and the distlock",
    ): ("a picture of the layers"),
    ("docs/architecture.md", "  engine/__init__   the public names (its __all__), nothing else"): (
        "a picture of the engine's rooms"
    ),
    ("docs/commands.md", "manage.py distlock list [--prefix P]"): "usage synopsis",
    ("docs/fencing.md", "UPDATE billing_invoice SET status = 'paid', fence = <lock.fence>"): (
        "the SQL fenced_update() runs, in outline"
    ),
    ("docs/views.md", "?: (django_distlock.E001) DISTLOCK has an unknown key 'TIMEOUTS'"): (
        "manage.py check output"
    ),
    (
        "docs/celery.md",
        "?: (django_distlock.E007) Celery task 'billing.tasks.import_account' uses "
        "unique_while_queued=True, but its class is not LockedTask: its duplicates would be "
        "queued, and its first run would fail",
    ): "manage.py check output",
    ("docs/celery.md", "celery worker refuses to start:"): "celery worker output",
    (
        "docs/metrics.md",
        "?: (django_distlock.E006) DISTLOCK['METRICS'] enables 'prometheus', but "
        "prometheus_client is not installed",
    ): "manage.py check output (tests/telemetry/test_telemetry.py checks the message)",
}


@dataclass
class Block:
    """A fenced block (or a hidden ``docs-test`` comment) of a Markdown file."""

    path: str
    line: int
    info: str
    text: str

    @property
    def language(self) -> str:
        return self.info.split()[0] if self.info.split() else ""

    @property
    def origin(self) -> str:
        return f"{self.path}:{self.line}"


def parse(path: Path) -> list[Block]:
    """The fenced blocks and hidden ``<!-- docs-test -->`` comments of ``path``, in order."""
    relative = (
        path.relative_to(REPO_ROOT).as_posix() if path.is_relative_to(REPO_ROOT) else path.name
    )
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        fence = FENCE.match(line)
        if line.strip().startswith("<!-- docs-test"):
            start = index
            body = [line.strip().removeprefix("<!-- docs-test")]
            while "-->" not in body[-1]:
                index += 1
                body.append(lines[index])
            body[-1] = body[-1].split("-->")[0]
            text = textwrap.dedent("\n".join(body)).strip("\n")
            blocks.append(Block(relative, start + 1, "hidden", text + "\n"))
        elif fence:
            indent = len(fence["indent"])
            start = index
            body = []
            index += 1
            while not lines[index].strip().startswith("```"):
                body.append(lines[index][indent:] if lines[index].strip() else "")
                index += 1
            blocks.append(Block(relative, start + 1, fence["info"].strip(), "\n".join(body) + "\n"))
        index += 1
    return blocks


def markdown_files() -> list[Path]:
    """README.md and every guide under docs/."""
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]


def undefined_globals(source: str, namespace: dict[str, Any]) -> list[str]:
    """Global names ``source`` uses (in any scope) that neither it nor anything before defines."""
    try:
        table = symtable.symtable(source, "<example>", "exec")
    except SyntaxError:  # top-level await: look at it as the body of a coroutine
        table = symtable.symtable(
            "async def __example__():\n" + textwrap.indent(source, "    "), "<example>", "exec"
        ).get_children()[0]
    known_builtins = vars(builtins)
    missing: set[str] = set()

    def visit(scope: symtable.SymbolTable, top: bool) -> None:
        for symbol in scope.get_symbols():
            name = symbol.get_name()
            bound_here = top and (symbol.is_assigned() or symbol.is_imported())
            lookup = symbol.is_referenced() and (symbol.is_global() or top) and not bound_here
            if lookup and name not in namespace and name not in known_builtins:
                missing.add(name)
        for child in scope.get_children():
            visit(child, False)

    visit(table, table.get_type() == "module")
    return sorted(missing)


def run_python(source: str, namespace: dict[str, Any], origin: str) -> None:
    """Execute ``source`` in ``namespace``; top-level ``await`` runs on a fresh event loop."""
    code = compile(source, origin, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    if code.co_flags & inspect.CO_COROUTINE:
        asyncio.run(eval(code, namespace))
    else:
        exec(code, namespace)


def check_settings(source: str, origin: str) -> None:
    """A ``# settings.py`` example: what it sets must be valid for django-distlock."""
    values: dict[str, Any] = {}
    exec(compile(source, origin, "exec"), values)
    if "DISTLOCK" in values:
        config = _build(values["DISTLOCK"])
        if set(values["DISTLOCK"]) == set(DEFAULTS):
            assert values["DISTLOCK"] == DEFAULTS, f"{origin}: the settings reference drifted"
            assert config.timeout == DEFAULTS["TIMEOUT"]
    if "INSTALLED_APPS" in values:
        assert "django_distlock" in values["INSTALLED_APPS"], origin
    for alias, cache in values.get("CACHES", {}).items():
        assert cache["BACKEND"].startswith(("django_redis.", "django_valkey.")), (origin, alias)
    shown = {key: values[key] for key in ("CACHES", "DISTLOCK") if key in values}
    if shown:  # and django-distlock finds where locks live in them (no connection made)
        with override_settings(**shown):
            lock_servers(get_config())


def check_signature(source: str, namespace: dict[str, Any], origin: str) -> None:
    """A signature block, ``name(params)``, against the real callable's signature."""
    match = re.fullmatch(r"\s*([\w.]+)\((.*)\)\s*", source, re.DOTALL)
    assert match, f"{origin}: a signature block is name(parameters)"
    target: Any = eval(match[1], namespace)
    documented = ast.parse(f"def f({match[2]}): pass").body[0]
    assert isinstance(documented, ast.FunctionDef)
    args = documented.args
    shown: list[tuple[str, str, Any]] = []
    defaults = [None] * (len(args.args) - len(args.defaults)) + list(args.defaults)
    for arg, default in zip(args.args, defaults, strict=True):
        shown.append((arg.arg, "POSITIONAL_OR_KEYWORD", _literal(default)))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        shown.append((arg.arg, "KEYWORD_ONLY", _literal(default)))
    real = [
        (p.name, p.kind.name, p.default if p.default is not p.empty else _REQUIRED)
        for p in inspect.signature(target).parameters.values()
    ]
    assert shown == real, f"{origin}: documented {shown}, real {real}"


_REQUIRED = object()


def _literal(node: ast.expr | None) -> Any:
    return _REQUIRED if node is None else ast.literal_eval(node)


@dataclass
class Command:
    """One shell command of an example, with the output shown under it."""

    line: str
    output: list[str] = field(default_factory=list)


def shell_commands(block: Block) -> list[Command]:
    """The commands of a console (``$`` lines), bash or cron block."""
    commands: list[Command] = []
    for line in block.text.splitlines():
        if block.language == "console":
            if line.startswith("$ "):
                commands.append(Command(line[2:]))
            elif commands:
                commands[-1].output.append(line)
        elif line.strip() and not line.lstrip().startswith("#"):
            text = line.split(None, 5)[5] if block.language == "cron" else line
            commands.append(Command(text))
    return commands


def manage_py_args(line: str) -> list[str] | None:
    """The arguments after ``manage.py`` in a shell line, or None when it does not run it."""
    for part in line.split("&&"):
        words = shlex.split(part, comments=True)
        for index, word in enumerate(words):
            if word.endswith("manage.py"):
                return words[index + 1 :]
    return None


def _words_before_variable(text: str) -> str:
    words = []
    for word in text.split():
        if any(char.isdigit() for char in word):
            break
        words.append(word)
    return " ".join(words)


def _normalized(line: str) -> str:
    return re.sub(r"-+", "-", " ".join(line.split()))


def run_command(command: Command, origin: str) -> None:
    """Run a documented ``manage.py`` command and compare with the output shown."""
    args = manage_py_args(command.line)
    assert args is not None
    stdout, stderr = io.StringIO(), io.StringIO()
    expected_error = next((o for o in command.output if o.startswith("CommandError: ")), None)
    if expected_error:
        with pytest.raises(CommandError) as raised:
            call_command(*args, stdout=stdout, stderr=stderr)
        shown = _words_before_variable(expected_error.removeprefix("CommandError: "))
        assert str(raised.value).startswith(shown), f"{origin}: shown {shown!r}, got {raised.value}"
        return
    call_command(*args, stdout=stdout, stderr=stderr)
    output = {_normalized(line) for line in (stdout.getvalue() + stderr.getvalue()).splitlines()}
    for line in command.output:
        if line.strip() and not any(char.isdigit() for char in line):
            assert _normalized(line) in output, f"{origin}: {line!r} not in {output}"


class Project:
    """The throwaway project that ``# path.py`` blocks are written into."""

    def __init__(self, directory: Path, namespace: dict[str, Any]) -> None:
        self.directory = directory
        self.namespace = namespace
        self.apps: list[str] = []
        self.modules: list[str] = []
        self.tables: list[type] = []
        self.overrides: list[override_settings] = []

    def add_module(self, path: str, source: str, origin: str) -> None:
        """Write ``path`` (installing its app when needed), run it, export its names."""
        parts = path.removesuffix(".py").split("/")
        for depth in range(1, len(parts)):
            package = self.directory.joinpath(*parts[:depth])
            package.mkdir(exist_ok=True)
            (package / "__init__.py").touch()
        app = parts[0]
        if app not in self.apps and (parts[1:] == ["models"] or "management" in parts):
            self.apps.append(app)
            # first, so that its commands win over the suite's test apps of the same name
            override = override_settings(INSTALLED_APPS=[app, *settings.INSTALLED_APPS])
            override.enable()
            self.overrides.append(override)
        file = self.directory / path
        file.write_text(source, encoding="utf-8")
        name = ".".join(parts)
        spec = importlib.util.spec_from_file_location(name, file)
        assert spec
        assert spec.loader
        module = importlib.util.module_from_spec(spec)
        module.__dict__.update(
            {key: value for key, value in self.namespace.items() if not key.startswith("__")}
        )
        sys.modules[name] = module
        self.modules.append(name)
        spec.loader.exec_module(module)
        if parts[1:] == ["models"]:
            self._create_tables(app)
        self.namespace.update(
            {key: value for key, value in vars(module).items() if not key.startswith("_")}
        )

    def _create_tables(self, app: str) -> None:
        existing = set(connection.introspection.table_names())
        with connection.schema_editor() as editor:
            for model in apps.get_app_config(app).get_models():
                if model._meta.db_table not in existing:
                    editor.create_model(model)
                    self.tables.append(model)

    def close(self) -> None:
        """Drop the tables, uninstall the apps, forget the modules."""
        with connection.schema_editor() as editor:
            for model in reversed(self.tables):
                editor.delete_model(model)
        for override in reversed(self.overrides):
            override.disable()
        for app in self.apps:
            apps.all_models.pop(app, None)
        apps.clear_cache()
        for name in [*self.modules, *self.apps]:
            for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
                del sys.modules[module]


@contextlib.contextmanager
def project(directory: Path, namespace: dict[str, Any]) -> Iterator[Project]:
    """A throwaway project importable from ``directory``, removed afterwards."""
    sys.path.insert(0, str(directory))
    built = Project(directory, namespace)
    try:
        yield built
    finally:
        built.close()
        sys.path.remove(str(directory))


def run_markdown(path: Path, namespace: dict[str, Any], directory: Path) -> int:
    """Run every example of ``path`` in ``namespace``; returns how many were run."""
    ran = 0
    with project(directory, namespace) as built:
        for block in parse(path):
            ran += _run_block(block, namespace, built)
    return ran


def _run_block(block: Block, namespace: dict[str, Any], built: Project) -> int:
    origin = block.origin
    if block.language in ("python", "hidden"):
        if block.info == "python signature":
            check_signature(block.text, namespace, origin)
            return 1
        header = HEADER.match(block.text.splitlines()[0])
        if header and header["path"] == "settings.py":
            check_settings(block.text, origin)
            return 1
        if header:
            built.add_module(header["path"], block.text, origin)
        else:
            run_python(block.text, namespace, origin)
        missing = undefined_globals(block.text, namespace)
        assert not missing, f"{origin}: uses {missing} without defining or importing them"
        return 1
    if block.language in ("console", "bash", "cron"):
        for command in shell_commands(block):
            elsewhere = [key for key in RUN_ELSEWHERE if key in command.line]
            if elsewhere:
                continue
            assert manage_py_args(command.line) is not None, (
                f"{origin}: `{command.line}` is neither run here nor listed in RUN_ELSEWHERE"
            )
            run_command(command, origin)
        return 1
    first_line = block.text.splitlines()[0] if block.text.strip() else ""
    assert (block.path, first_line) in NOT_CODE, (
        f"{origin}: a ```{block.info} block that is neither run nor listed in NOT_CODE"
    )
    return 0


def documented_names() -> set[str]:
    """Every identifier used by the Python examples of the README and docs."""
    names: set[str] = set()
    for path in markdown_files():
        for block in parse(path):
            if block.language == "python":
                names.update(re.findall(r"[A-Za-z_]\w*", block.text))
    return names
