"""``FenceField`` and ``fenced_update()`` on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time

import pytest
from asgiref.sync import async_to_sync
from django import forms
from django.db import connections, transaction

from django_distlock import LockNotOwned, distlock, distlock_many
from django_distlock.fencing import FencedQuerySet, FenceField, StaleFence
from tests.support.fencing_app.models import Invoice, Note, TwoFences

pytestmark = pytest.mark.usefixtures("redis_client", "events_off")
BOTH = pytest.mark.django_db(databases=["default", "pg"])


@pytest.fixture(params=["default", "pg"])
def alias(request: pytest.FixtureRequest) -> str:
    """The database the test writes to: SQLite, then PostgreSQL."""
    return request.param


def invoices(alias: str) -> FencedQuerySet:
    return Invoice.objects.using(alias)


@BOTH
def test_a_holder_paused_past_its_lease_cannot_overwrite_the_next_holder(alias):
    invoice = invoices(alias).create(number="42")
    first = distlock("invoice:42", timeout=0.3, auto_renew=False)
    assert first.acquire()
    assert invoices(alias).filter(pk=invoice.pk).fenced_update(first, status="draft") == 1

    # The first holder stalls (GC pause, stopped VM) while its lease runs out; the second
    # gets the lock as soon as it expires and writes.
    second = distlock("invoice:42", blocking_timeout=10)
    assert second.acquire()
    assert second.fence > first.fence
    assert invoices(alias).filter(pk=invoice.pk).fenced_update(second, status="paid") == 1

    # The first wakes up, unaware, and writes with its old fence: refused.
    with pytest.raises(StaleFence) as info:
        invoices(alias).filter(pk=invoice.pk).fenced_update(first, status="refunded", amount=-1)
    assert info.value.fence == first.fence
    assert info.value.stored == second.fence
    assert info.value.name == "invoice:42"
    assert "invoice:42" in str(info.value)
    invoice.refresh_from_db()
    assert (invoice.status, invoice.amount, invoice.fence) == ("paid", 0, second.fence)
    assert first.lost  # the watchdog is off, but its lease is over
    second.release()


@BOTH
def test_several_rows_are_written_all_or_nothing(alias):
    for number in ("1", "2", "3"):
        invoices(alias).create(number=number)
    invoices(alias).filter(number="2").update(fence=10)
    all_three = invoices(alias).filter(number__in=["1", "2", "3"])

    with pytest.raises(StaleFence):
        all_three.fenced_update(5, status="stale")
    # Rows 1 and 3 stored an older fence but were not written either.
    assert sorted(invoices(alias).values_list("number", "status", "fence")) == [
        ("1", "new", 0),
        ("2", "new", 10),
        ("3", "new", 0),
    ]

    assert all_three.fenced_update(10, status="sent") == 3
    assert all_three.fenced_update(10, amount=5) == 3  # the same fence may write again
    assert all_three.fenced_update(11, amount=6) == 3
    assert sorted(invoices(alias).values_list("number", "status", "amount", "fence")) == [
        ("1", "sent", 6, 11),
        ("2", "sent", 6, 11),
        ("3", "sent", 6, 11),
    ]
    assert invoices(alias).filter(number="nope").fenced_update(12, status="x") == 0


@BOTH
def test_rows_outside_the_queryset_do_not_matter(alias):
    invoices(alias).create(number="1")
    invoices(alias).create(number="2", fence=99)

    assert invoices(alias).filter(number="1").fenced_update(7, status="ok") == 1
    assert invoices(alias).get(number="2").fence == 99


@BOTH
def test_fenced_update_inside_an_outer_transaction_rolls_back_only_itself(alias):
    invoices(alias).create(number="1", fence=10)
    invoices(alias).create(number="2")
    with transaction.atomic(using=alias):
        invoices(alias).filter(number="2").update(amount=1)
        with pytest.raises(StaleFence):
            invoices(alias).all().fenced_update(5, status="stale")
        assert invoices(alias).get(number="2").amount == 1  # the outer work survives
    assert not invoices(alias).filter(status="stale").exists()


@BOTH
def test_async_fenced_update(alias):
    invoice = invoices(alias).create(number="7")

    async def pay() -> tuple[int, int | None]:
        async with distlock("invoice:7") as lock:
            updated = (
                await invoices(alias).filter(pk=invoice.pk).afenced_update(lock, status="paid")
            )
            return updated, lock.fence

    updated, fence = async_to_sync(pay)()
    assert updated == 1
    invoice.refresh_from_db()
    assert (invoice.status, invoice.fence) == ("paid", fence)

    async def stale() -> None:
        await invoices(alias).filter(pk=invoice.pk).afenced_update(fence - 1, status="x")

    with pytest.raises(StaleFence):
        async_to_sync(stale)()


@pytest.mark.django_db
def test_a_lock_not_held_is_refused(redis_client):
    Invoice.objects.create(number="1")
    lock = distlock("invoice:1")
    with pytest.raises(LockNotOwned, match="invoice:1"):
        Invoice.objects.fenced_update(lock, status="x")
    with lock:
        pass
    with pytest.raises(LockNotOwned):
        Invoice.objects.fenced_update(lock, status="x")
    assert Invoice.objects.get().status == "new"


@pytest.mark.django_db
def test_bad_arguments():
    Invoice.objects.create(number="1")
    Note.objects.create(text="x")
    TwoFences.objects.create()
    for bad in (True, "5", 5.0, None):
        with pytest.raises(TypeError, match="held Lock or an int"):
            Invoice.objects.fenced_update(bad, status="x")
    with pytest.raises(TypeError, match=r"exactly one FenceField on fencing_app\.Note, found none"):
        Note.objects.fenced_update(1, text="y")
    with pytest.raises(TypeError, match="found first, second"):
        TwoFences.objects.fenced_update(1)
    with pytest.raises(TypeError, match="sets 'fence' itself"):
        Invoice.objects.fenced_update(1, fence=2)
    assert Note.objects.get().text == "x"
    assert Invoice.objects.get().fence == 0


def test_fence_field_defaults_and_forms():
    field = Invoice._meta.get_field("fence")
    assert isinstance(field, FenceField)
    assert field.default == 0
    assert field.editable is False
    assert FenceField.__doc__
    _, path, args, kwargs = field.deconstruct()
    assert (path, args, kwargs) == ("django_distlock.fencing.FenceField", [], {})
    _, _, _, kwargs = FenceField(default=5, editable=True, db_index=True).deconstruct()
    assert kwargs == {"default": 5, "editable": True, "db_index": True}
    assert FenceField(**kwargs).editable is True

    class InvoiceForm(forms.ModelForm):
        class Meta:
            model = Invoice
            fields = "__all__"  # noqa: DJ007

    assert "fence" not in InvoiceForm().fields
    assert Invoice(number="1").fence == 0


def _waiting_on_a_lock(alias: str) -> bool:
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        return cursor.fetchone()[0] > 0


@pytest.mark.django_db(transaction=True, databases=["default", "pg"])
def test_an_older_writer_blocked_by_a_newer_one_is_refused_on_postgresql():
    """The race a check-then-update would lose: the older holder's check runs while the
    newer holder's write is not committed yet. PostgreSQL row locks make it wait, and it
    must then refuse, not silently write nothing."""
    invoice = invoices("pg").create(number="42", fence=1)
    rows = invoices("pg").filter(pk=invoice.pk)
    newer_wrote = threading.Event()
    older_blocked = threading.Event()
    outcome: list[object] = []

    def newer_holder() -> None:
        try:
            with transaction.atomic(using="pg"):
                rows.fenced_update(20, status="paid")
                newer_wrote.set()
                older_blocked.wait(10)
        finally:
            connections.close_all()

    def older_holder() -> None:
        try:
            outcome.append(rows.fenced_update(10, status="refunded"))
        except StaleFence as exc:
            outcome.append(exc)
        finally:
            connections.close_all()

    newer = threading.Thread(target=newer_holder)
    newer.start()
    assert newer_wrote.wait(10)
    older = threading.Thread(target=older_holder)
    older.start()
    deadline = time.monotonic() + 10
    while not _waiting_on_a_lock("pg"):
        assert time.monotonic() < deadline, "the older writer never waited for the row"
        time.sleep(0.01)
    older_blocked.set()
    newer.join(10)
    older.join(10)

    assert len(outcome) == 1
    assert isinstance(outcome[0], StaleFence)
    invoice.refresh_from_db(using="pg")
    assert (invoice.status, invoice.fence) == ("paid", 20)


# -- kinds: limited and shared holds, several names at once -----------------------------


@BOTH
def test_a_limited_hold_fences_with_its_own_fence(alias):
    first, second = invoices(alias).create(number="1"), invoices(alias).create(number="2")
    with distlock("batch", limit=2) as one, distlock("batch", limit=2) as other:
        assert other.fence > one.fence
        # Each slot on its own rows: both writes pass.
        assert invoices(alias).filter(pk=first.pk).fenced_update(one, status="a") == 1
        assert invoices(alias).filter(pk=second.pk).fenced_update(other, status="b") == 1
        # A row the later slot wrote is refused to the earlier one, which still holds.
        with pytest.raises(StaleFence) as info:
            invoices(alias).filter(pk=second.pk).fenced_update(one, status="late")
        assert (info.value.fence, info.value.stored) == (one.fence, other.fence)
        assert one.owned()
    fenced = dict(invoices(alias).values_list("number", "fence"))
    assert 0 < fenced["1"] < fenced["2"]


@BOTH
def test_an_exclusive_writer_after_shared_readers_has_the_newer_fence(alias):
    invoice = invoices(alias).create(number="42")
    with distlock("invoice:42", shared=True) as reader:
        reader_fence = reader.fence
    with distlock("invoice:42") as writer:
        assert writer.fence > reader_fence
        assert invoices(alias).filter(pk=invoice.pk).fenced_update(writer, status="paid") == 1
    with pytest.raises(StaleFence):
        invoices(alias).filter(pk=invoice.pk).fenced_update(reader_fence, status="stale")


@BOTH
def test_a_group_fences_each_row_with_the_lock_of_its_name(alias):
    rows = [invoices(alias).create(number=str(n)) for n in (1, 2)]
    names = [f"invoice:{row.pk}" for row in rows]
    with distlock_many(names) as group:
        for row in rows:
            lock = group.locks[f"invoice:{row.pk}"]
            assert invoices(alias).filter(pk=row.pk).fenced_update(lock, status="merged") == 1
        fences = group.fences
    assert dict(invoices(alias).values_list("pk", "fence")) == {
        row.pk: fences[f"invoice:{row.pk}"] for row in rows
    }
    # A later holder of one of the names wins that row; the group's old fence loses it.
    with distlock(names[0]) as later:
        invoices(alias).filter(pk=rows[0].pk).fenced_update(later, status="later")
    with pytest.raises(StaleFence):
        invoices(alias).filter(pk=rows[0].pk).fenced_update(fences[names[0]], status="old")
