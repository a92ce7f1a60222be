"""The post-commit worker (R4): runs the outbox jobs a turn committed, at least once, idempotently.

A job is claimed by pushing its `run_after` one lease into the future and counting the attempt, in one
conditional UPDATE, so two workers never run it at once and a worker that dies mid-job only delays it:
when the lease runs out another worker claims it again. Failures are retried with exponential backoff
until `ARBOR_WORKER_MAX_ATTEMPTS`, then the job is marked failed with its last error: never dropped.
Handlers must be idempotent, because "at least once" means a crash after the work and before the
`done` mark runs it again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection, connections, transaction
from django.db.models import F
from django.utils import timezone

from conversations import outbox
from conversations.models import OutboxJob
from conversations.turns import log, recovery

logger = logging.getLogger("arbor.worker")

BACKOFF_CAP_SECONDS = 3600
MAX_OUTAGE_WAIT_SECONDS = 30


@dataclass
class RunStats:
    done: int = 0
    retried: int = 0
    failed: int = 0

    @property
    def total(self) -> int:
        return self.done + self.retried + self.failed


def claim(*, limit: int) -> list[OutboxJob]:
    """Claim up to `limit` due jobs for one lease; a job another worker claimed first is skipped.

    A due job that has used up its attempts was claimed and never finished: its workers died with it
    (a job that kills its worker). It is marked failed instead of being run again for ever.
    """
    now = timezone.now()
    lease_until = now + timedelta(seconds=settings.ARBOR_WORKER_LEASE_SECONDS)
    pending = OutboxJob.objects.filter(status=OutboxJob.Status.PENDING, run_after__lte=now)
    pending.filter(attempts__gte=settings.ARBOR_WORKER_MAX_ATTEMPTS).update(
        status=OutboxJob.Status.FAILED, last_error="its lease ran out on every attempt: the worker died running it")
    due = pending.order_by("run_after", "id")
    with transaction.atomic():
        if connection.features.has_select_for_update_skip_locked:
            due = due.select_for_update(skip_locked=True)
        candidates = list(due.values_list("id", "attempts")[:limit])
        claimed = [
            job_id for job_id, attempts in candidates
            if OutboxJob.objects.filter(pk=job_id, attempts=attempts, status=OutboxJob.Status.PENDING)
            .update(attempts=F("attempts") + 1, run_after=lease_until)
        ]
    return list(OutboxJob.objects.filter(pk__in=claimed).order_by("id"))


def _backoff(attempts: int) -> timedelta:
    return timedelta(seconds=min(BACKOFF_CAP_SECONDS, 2 ** attempts))


def run_job(job: OutboxJob) -> str:
    """Run one claimed job; record done, a retry, or the final failure. Return which."""
    handler = outbox.handler_for(job.kind)
    try:
        if handler is None:
            raise LookupError(f"no handler for job kind {job.kind!r}")
        handler(job.payload)
    except Exception as error:  # a job's failure is recorded on the job, never raised into the loop
        final = handler is None or job.attempts >= settings.ARBOR_WORKER_MAX_ATTEMPTS
        logger.warning("job %s (%s) failed on attempt %s: %r", job.pk, job.kind, job.attempts, error)
        # Guarded by the attempt: a worker whose lease ran out must not overwrite a newer claim's record.
        OutboxJob.objects.filter(pk=job.pk, attempts=job.attempts).update(
            status=OutboxJob.Status.FAILED if final else OutboxJob.Status.PENDING,
            run_after=timezone.now() + _backoff(job.attempts), last_error=repr(error)[:2000],
        )
        return "failed" if final else "retried"
    OutboxJob.objects.filter(pk=job.pk, attempts=job.attempts).update(status=OutboxJob.Status.DONE, last_error="")
    return "done"


def run_due(*, batch: int = 50) -> RunStats:
    """Run due jobs until none is left; return what happened."""
    stats = RunStats()
    while jobs := claim(limit=batch):
        for job in jobs:
            outcome = run_job(job)
            setattr(stats, outcome, getattr(stats, outcome) + 1)
    return stats


class Sweeper:
    """Runs the registered sweeps when they are due. A failing sweep is logged and tried again when next due:
    it is background work, never the end of the worker."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.due: dict[str, float] = {}

    def run(self) -> bool:
        busy = False
        for name, (sweep, every) in outbox.sweeps().items():
            if self.clock() < self.due.get(name, 0.0):
                continue
            try:
                found = sweep()
            except (OperationalError, InterfaceError):
                raise  # the database is out of reach: the loop waits the outage out
            except Exception as error:  # the sweep's own failure (a refused query included) waits its turn
                logger.warning("sweep %s failed, next try in %.0f s: %r", name, every, error)
                found = False
            self.due[name] = 0.0 if found else self.clock() + every
            busy = busy or found
        return busy


def run_forever(*, batch: int = 50, idle_seconds: float = 1.0, stop: Callable[[], bool] = lambda: False,
                sleep: Callable[[float], None] = time.sleep) -> None:
    """Run jobs and the registered sweeps, sweep interrupted calls and forget old turn logs until `stop()`.
    A database error or outage is logged and waited out (backing off up to MAX_OUTAGE_WAIT_SECONDS), never the
    end of the worker: a claimed job whose run was cut by it is claimed again when its lease runs out."""
    failures = 0
    sweeper = Sweeper()
    while not stop():
        try:
            recovery.sweep()
            log.forget_old()
            busy = run_due(batch=batch).total > 0
            busy = sweeper.run() or busy
            failures = 0
        except DatabaseError as error:
            failures += 1
            wait = min(MAX_OUTAGE_WAIT_SECONDS, idle_seconds * 2 ** failures)
            logger.warning("database error (%d in a row), trying again in %.1f s: %r", failures, wait, error)
            connections.close_all()  # a broken connection is opened anew on the next query
            sleep(wait)
            continue
        if not busy:
            sleep(idle_seconds)
