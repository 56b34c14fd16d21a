"""The shared registers of a chaos run: one ``Invoice`` row (``tests/support/fencing_app``)
per lock name in a SQLite file, its ``amount`` the register's value.

A hold does a read-modify-write: read ``amount``, write ``amount + 1``, either unfenced
(a plain ``update``: a write by a holder that lost its lock is accepted, so overlapping
holds lose increments, which the history shows) or fenced (``fenced_update``: a write
older than the row's fence is refused with ``StaleFence``). A fenced write also counts
the row's accepted writes in ``status`` (``"0"``, ``"1"``...) and reads that version back
in the same transaction: the history orders accepted writes by it (``extra["seq"]``).

Client processes configure Django themselves (:func:`configure`), since they do not run
under pytest; the runner creates the file (``python -m tests.support.chaos.registers
DB NAME...``) and reads the final values and the counts of accepted writes with the standard
library (:func:`final_values`, :func:`accepted_writes`).
"""

from __future__ import annotations

import contextlib
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["Registers", "accepted_writes", "configure", "final_values", "prepare"]

TABLE = "fencing_app_invoice"
# Writers queue on SQLite's lock; a client SIGSTOPped inside a write keeps the others
# waiting for as long as the pause, so the wait must outlast the longest pause.
BUSY_SECONDS = 30


def configure(database: str | Path) -> None:
    """Set up Django in a client process: the fencing app on the SQLite file
    ``database``."""
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "tests.support.fencing_app"],
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": str(database),
                # IMMEDIATE: a transaction that reads then writes the register takes the
                # write lock first, so two of them queue rather than fail on upgrade.
                "OPTIONS": {"timeout": BUSY_SECONDS, "transaction_mode": "IMMEDIATE"},
            }
        },
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        USE_TZ=True,
    )
    django.setup()


def prepare(database: str | Path, names: list[str]) -> None:
    """Create the table and one row per register name, all at 0 (Django configured on
    ``database``)."""
    from django.core.management import call_command

    from tests.support.fencing_app.models import Invoice

    call_command("migrate", "fencing_app", verbosity=0)
    for name in names:
        Invoice.objects.create(number=name, amount=0, status="0")


class Registers:
    """Reads and writes of the register rows from a client process (Django configured).
    Sync methods: async clients call them through ``sync_to_async``. Made after
    :func:`configure` (models cannot be imported before ``django.setup()``)."""

    def __init__(self) -> None:
        from tests.support.fencing_app.models import Invoice

        self.model = Invoice

    def read(self, name: str) -> int:
        """The register's value."""
        amount: int = self.model.objects.values_list("amount", flat=True).get(number=name)
        return amount

    def write(self, name: str, value: int) -> None:
        """Set the register to ``value``, unfenced."""
        self.model.objects.filter(number=name).update(amount=value)

    def increment_fenced(
        self, name: str, fence: int, before_commit: Callable[[int], None]
    ) -> tuple[int, int]:
        """Read the register and write it + 1 with ``fence``, in one transaction, as
        docs/fencing.md says a read-modify-write must (``StaleFence``, nothing written, if
        the row holds a newer fence); returns the value read and the row's version after
        the write. ``before_commit(value)`` is called with the value read once the write
        is made, before it commits."""
        from django.db import transaction
        from django.db.models import BigIntegerField, CharField, F
        from django.db.models.functions import Cast

        rows = self.model.objects.filter(number=name)
        with transaction.atomic():
            value: int = rows.select_for_update().values_list("amount", flat=True).get()
            rows.fenced_update(
                fence,
                amount=value + 1,
                status=Cast(Cast(F("status"), BigIntegerField()) + 1, CharField(max_length=20)),
            )
            before_commit(value)
            # The transaction holds the row (SQLite: the database) until commit: this is
            # our write's version, not a later one.
            return value, int(rows.values_list("status", flat=True).get())


def final_values(database: str | Path) -> dict[str, int]:
    """Each register's value at the end of a run (read without Django)."""
    with contextlib.closing(sqlite3.connect(database, timeout=BUSY_SECONDS)) as connection:
        rows = connection.execute(f"SELECT number, amount FROM {TABLE}").fetchall()
    return {name: amount for name, amount in rows}


def accepted_writes(database: str | Path) -> dict[str, int]:
    """Each register's count of accepted fenced writes at the end of a run: the database's
    own count (``status``), writes whose client never learned the outcome included."""
    with contextlib.closing(sqlite3.connect(database, timeout=BUSY_SECONDS)) as connection:
        rows = connection.execute(f"SELECT number, status FROM {TABLE}").fetchall()
    return {name: int(status) for name, status in rows}


if __name__ == "__main__":
    database_path, *register_names = sys.argv[1:]
    configure(database_path)
    prepare(database_path, register_names)
