"""A ``LockedCommand`` as users write one: the lock is named after the command."""

import sys

from django_distlock.commands.locked import LockedCommand


class Command(LockedCommand):
    help = "Pretend to sync a catalog under the 'sync_catalog' lock."

    def add_arguments(self, parser):
        parser.add_argument(
            "--hold",
            action="store_true",
            help="print 'ready' and keep the lock until a line arrives on stdin",
        )

    def handle(self, *args, **options):
        if self.lock is None:
            self.stdout.write("ran without a lock")
        else:
            self.stdout.write(f"locked {self.lock.name} fence={self.lock.fence}")
        if options["hold"]:
            self.stdout.write("ready")
            self.stdout.flush()
            sys.stdin.readline()
