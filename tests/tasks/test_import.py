"""``django_distlock.tasks`` imports without any tasks framework installed, and says what
to install only when ``locked_task`` is used."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.support import REPO_ROOT


def test_the_package_imports_without_the_framework():
    """A finder that refuses ``django.tasks`` and the backport stands for a project
    on Django 5.2 without ``django-distlock[tasks]``."""
    script = textwrap.dedent(
        """
        import sys

        class NoTasks:
            def find_spec(self, name, path=None, target=None):
                if name.startswith(("django.tasks", "django_tasks")):
                    raise ModuleNotFoundError(f"No module named {name!r}")
                return None

        sys.meta_path.insert(0, NoTasks())
        import django_distlock.tasks as tasks

        print(tasks.SKIPPED)
        try:
            tasks.locked_task("report", on_busy="skip")(lambda: None)
        except ImportError as error:
            print(error)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    skipped, error = result.stdout.splitlines()
    assert skipped == "django_distlock.tasks.SKIPPED"
    assert "pip install django-tasks django-tasks-db" in error
