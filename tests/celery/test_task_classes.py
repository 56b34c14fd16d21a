"""``unique_while_queued`` needs the ``LockedTask`` class, which refuses duplicates when
they are published: a task without it is ``django_distlock.E007`` in ``manage.py check``,
and a worker refuses to start with it, before any duplicate is queued.

The project that makes the mistake (:mod:`tests.support.celery_project`) runs in
subprocesses only; the in-process test makes its own app current for the time of one
check, and its tasks are not shared (``app.task`` shares a task with every app finalized
later), so that the suite's other checks stay clean."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from celery import Celery
from django.core.checks import Error, run_checks

from django_distlock.celery import LockedTask, locked_task
from tests.settings import REDIS_URL_ENV_VAR
from tests.support import REPO_ROOT
from tests.support.celery_app import app as suite_app
from tests.support.celery_workers import CeleryProcess

PROJECT = "tests.support.celery_project"
PROJECT_ENV = {"DJANGO_SETTINGS_MODULE": f"{PROJECT}.settings"}
MISTAKE = f"{PROJECT}.billing.tasks.import_account"


@pytest.fixture
def current(request: pytest.FixtureRequest) -> Iterator[Celery]:
    """A fresh app, Celery's current one for the test (the suite's app again after)."""
    app = Celery(request.node.name, set_as_current=False)
    app.set_current()
    yield app
    suite_app.set_current()


def distlock_errors() -> list[Error]:
    return [m for m in run_checks(tags=["distlock"]) if m.id.startswith("django_distlock.")]


def test_the_check_names_the_task_and_both_fixes(current):
    @current.task(name="billing.import_account", shared=False)
    @locked_task("import:{account_id}", on_busy="skip", unique_while_queued=True)
    def import_account(account_id):
        return account_id

    @current.task(name="billing.import_account_once", shared=False, base=LockedTask)
    @locked_task("import:{account_id}", on_busy="skip", unique_while_queued=True)
    def import_account_once(account_id):
        return account_id

    @current.task(name="billing.import_account_locked", shared=False)
    @locked_task("import:{account_id}", on_busy="skip")
    def import_account_locked(account_id):
        return account_id

    [error] = distlock_errors()
    assert error.id == "django_distlock.E007"
    assert "'billing.import_account'" in error.msg
    assert "unique_while_queued=True" in error.msg
    assert "base=LockedTask" in error.hint
    assert "task_cls='django_distlock.celery:LockedTask'" in error.hint


def test_an_app_whose_task_class_is_locked_task_passes(current):
    current.task_cls = "django_distlock.celery:LockedTask"

    @current.task(name="billing.import_account_by_app", shared=False)
    @locked_task("import:{account_id}", on_busy="skip", unique_while_queued=True)
    def import_account(account_id):
        return account_id

    assert distlock_errors() == []


def project_env() -> dict[str, str]:
    return {
        **os.environ,
        **PROJECT_ENV,
        "PYTHONPATH": str(REPO_ROOT),
        REDIS_URL_ENV_VAR: os.environ[REDIS_URL_ENV_VAR],
    }


def test_manage_py_check_finds_the_task_in_an_installed_apps_tasks_module():
    """The project's URLs import no task: the check finds it where a worker does."""
    result = subprocess.run(
        [sys.executable, "-m", "django", "check"],
        cwd=REPO_ROOT,
        env=project_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "(django_distlock.E007)" in result.stderr
    assert f"'{MISTAKE}'" in result.stderr
    assert "base=LockedTask" in result.stderr


def test_a_worker_refuses_to_start(celery_dbs, tmp_path):
    worker = CeleryProcess.worker(
        "solo", log_dir=tmp_path, name="refused", queues="refused", env=PROJECT_ENV, app=PROJECT
    )
    try:
        with pytest.raises(RuntimeError, match="did not start"):
            worker.start()
    finally:
        worker.stop()
    log = worker.log()
    assert worker.process is not None
    assert worker.process.returncode == 1, log
    assert " ready." not in log
    assert "django_distlock.E007" in log
    assert f"'{MISTAKE}'" in log
    assert "base=LockedTask" in log
