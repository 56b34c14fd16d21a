"""A ``LockedCommand`` whose lock name is a template filled from its options."""

from django_distlock.commands.locked import LockedCommand


class Command(LockedCommand):
    help = "Pretend to import one source under the 'import:<source>' lock."
    lock_name = "import:{source}"
    lock_timeout = 7

    def add_arguments(self, parser):
        parser.add_argument("source")

    def handle(self, *args, **options):
        self.stdout.write(f"locked {self.lock.name} fence={self.lock.fence}")
