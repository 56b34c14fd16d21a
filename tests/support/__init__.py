"""Support code for the tests; no test module lives here.

Django-free, also used by ``bench/`` and the demo: private Redis and PostgreSQL servers
on one process harness (:mod:`.servers`, :mod:`.redis_servers`,
:mod:`.postgres_servers`), whole Sentinel, Cluster and replicated topologies
(:mod:`.topologies`), a TCP proxy that stalls, cuts or delays connections
(:mod:`.proxy`) and a runner for functions in forked children (:mod:`.forking`).

For the tests only: helpers to drive and inspect the engine (:mod:`.engine`, with the
worker processes of :mod:`.workers`, and those of :mod:`.kind_workers` for the lock
kinds, which ``bench/kinds.py`` uses too), the topologies a behaviour test runs on and its
clients of them (:mod:`.probe`), the check that no test leaves a lock held by
nobody (:mod:`.hygiene`), guarded views (:mod:`.view_urls`), the runner of the docs'
examples (:mod:`.docs_examples`), the browser fixtures (:mod:`.browser`), reading metrics
and the worker processes of the multiprocess metrics test (:mod:`.metrics`,
:mod:`.metrics_workers`), two Django apps the tests install (``commands_app``,
``fencing_app``), and a Django project with a Celery mistake that only subprocesses load
(``celery_project``).
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
