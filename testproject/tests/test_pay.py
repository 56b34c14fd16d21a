"""The pay views under lock: busy (423), lock server down (503), free (paid)."""

from __future__ import annotations

import pytest

from testproject.invoices import views
from testproject.invoices.models import Invoice

pytestmark = pytest.mark.django_db


@pytest.fixture
def invoice() -> Invoice:
    return Invoice.objects.order_by("number").first()


def test_a_payment_in_progress_makes_a_second_one_wait(client, distlock_locks, invoice):
    with distlock_locks.hold(f"pay:{invoice.pk}", timeout=10):
        response = client.post(f"/invoices/{invoice.pk}/pay/")
    assert response.status_code == 423
    assert 1 <= int(response["Retry-After"]) <= 10
    assert "423 Locked" in response.content.decode()
    invoice.refresh_from_db()
    assert invoice.status == "open"


def test_the_async_view_answers_the_same(client, distlock_locks, invoice):
    with distlock_locks.hold(f"pay:{invoice.pk}"):
        response = client.post(f"/invoices/{invoice.pk}/apay/")
    assert response.status_code == 423


def test_without_the_lock_server_nobody_pays(client, distlock_locks, invoice):
    with distlock_locks.unavailable():
        response = client.post(f"/invoices/{invoice.pk}/pay/")
    assert response.status_code == 503
    invoice.refresh_from_db()
    assert invoice.status == "open"


def test_a_free_invoice_is_paid_and_its_locks_given_back(
    client, distlock_locks, invoice, monkeypatch
):
    monkeypatch.setattr(views, "PAY_SECONDS", 0)
    response = client.post(f"/invoices/{invoice.pk}/pay/")
    assert response.status_code == 200
    invoice.refresh_from_db()
    assert invoice.status == "paid"
    assert invoice.fence > 0
    distlock_locks.assert_none_held()
