"""`manage.py import_check FILE…`: see `conversations.transfer.check`."""

from collections import Counter
from pathlib import Path

from django.core.management.base import BaseCommand

from conversations.transfer.check import ImportRefused, check


class Command(BaseCommand):
    help = ("Import each file for a throwaway account, report what it keeps and how it survives a round trip "
            "through Arbor's tree JSON and ChatGPT's format, and roll everything back.")

    def add_arguments(self, parser):
        parser.add_argument("files", nargs="+", type=Path)

    def handle(self, *, files, **options):
        self.stdout.write("| file | conversations | nodes | bubbles | branches | tokens | skipped "
                          "| Arbor JSON round trip | ChatGPT round trip |\n|---|---|---|---|---|---|---|---|---|")
        for path in files:
            try:
                report, skipped = check(path)
            except ImportRefused as refused:
                self.stdout.write(f"| {path.name} | refused: {refused.message} |")
                continue
            bubbles = Counter()
            for kept in report:
                bubbles.update(kept.bubbles)
            self.stdout.write(" | ".join([
                f"| {path.name}", str(len(report)), str(sum(k.nodes for k in report)),
                ", ".join(f"{n} {role}" for role, n in sorted(bubbles.items())),
                str(sum(k.branches for k in report)), str(sum(k.tokens for k in report)), str(len(skipped)),
                _joined(k.arbor_differences for k in report), _joined(k.chatgpt_differences for k in report) + " |",
            ]))


def _joined(notes) -> str:
    notes = [n for n in notes if n != "none"]
    return "; ".join(notes) or "none"
