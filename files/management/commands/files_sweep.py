"""`manage.py files_sweep`: delete stored bytes that no file refers to any more (files/services.py
`orphan_blobs_sweep`). Run it from cron, say hourly; it never touches bytes younger than `--older-than` seconds."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from files.services import orphan_blobs_sweep


class Command(BaseCommand):
    help = "Delete stored file bytes no file refers to (older than --older-than seconds, default an hour)."

    def add_arguments(self, parser):
        parser.add_argument("--older-than", type=float, default=3600.0)

    def handle(self, *args, **options):
        swept = orphan_blobs_sweep(older_than_seconds=options["older_than"])
        for path in swept:
            self.stdout.write(f"deleted {path}")
        self.stdout.write(f"files_sweep: {len(swept)} unreferenced blob{'s' if len(swept) != 1 else ''} deleted")
