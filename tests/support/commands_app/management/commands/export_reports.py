"""A ``LockedCommand`` of which two runs may hold the lock at once (``lock_limit``)."""

from django_distlock.commands.locked import LockedCommand


class Command(LockedCommand):
    help = "Pretend to export reports, two runs at most at once."
    lock_limit = 2

    def handle(self, *args, **options):
        self.stdout.write(f"slot of {self.lock.name} fence={self.lock.fence} mode={self.lock.mode}")
