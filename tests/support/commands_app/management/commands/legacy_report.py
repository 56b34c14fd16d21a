"""An existing ``BaseCommand`` made exclusive with the mixin; its ``add_arguments`` does
not call ``super()``."""

from django.core.management.base import BaseCommand

from django_distlock.commands.locked import LockedCommandMixin


class Command(LockedCommandMixin, BaseCommand):
    help = "Pretend to build a report for one day."

    def add_arguments(self, parser):
        parser.add_argument("--day", default="today")

    def handle(self, *args, **options):
        lock = self.lock
        self.stdout.write(f"report for {options['day']} under {lock.name if lock else None}")
