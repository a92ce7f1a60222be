"""Run the post-commit worker (R4). Start as many as you like: jobs are claimed, never shared."""

from __future__ import annotations

import signal

from django.core.management.base import BaseCommand
from django.db import close_old_connections

from conversations.jobs import worker


class Command(BaseCommand):
    help = ("Run outbox jobs (search indexing, embedding, titles) after turns commit, and the background sweeps; "
            "--once runs what is due and each sweep once, then stops.")

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="run what is due and each sweep once, then exit")
        parser.add_argument("--batch", type=int, default=50, help="jobs claimed per transaction")
        parser.add_argument("--idle", type=float, default=1.0, help="seconds to sleep when nothing is due")

    def handle(self, *args, once: bool, batch: int, idle: float, **options):
        if once:  # for cron: the jobs due, then one share of each sweep (the next run does the next share)
            stats = worker.run_due(batch=batch)
            worker.Sweeper().run()
            self.stdout.write(f"done {stats.done}, retried {stats.retried}, failed {stats.failed}")
            return
        stopping = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stopping.append(True))
        self.stdout.write("worker running; Ctrl+C stops it after the current job")

        def stop() -> bool:
            close_old_connections()
            return bool(stopping)

        worker.run_forever(batch=batch, idle_seconds=idle, stop=stop)
