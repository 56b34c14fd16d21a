from decimal import Decimal

from django.db import migrations

DEMO_INVOICES = [("INV-001", "120.00"), ("INV-002", "75.50"), ("INV-003", "990.00")]


def create_invoices(apps, schema_editor):
    Invoice = apps.get_model("invoices", "Invoice")
    for number, amount in DEMO_INVOICES:
        Invoice.objects.get_or_create(number=number, defaults={"amount": Decimal(amount)})


class Migration(migrations.Migration):
    dependencies = [("invoices", "0001_initial")]
    operations = [migrations.RunPython(create_invoices, migrations.RunPython.noop)]
