"""`manage.py usage_check`: the usage ledger against the tree (issue 31); exits non-zero on any difference."""

from django.core.management.base import BaseCommand, CommandError

from conversations.usage import disagreements


class Command(BaseCommand):
    help = "Compare the usage ledger with the nodes: every call that reached a provider has its one row, alike."

    def handle(self, *args, **options):
        found = disagreements()
        for line in found[:100]:
            self.stdout.write(line)
        if found:
            raise CommandError(f"{len(found)} difference(s) between the usage ledger and the nodes.")
        self.stdout.write("usage_check: the ledger and the nodes agree.")
