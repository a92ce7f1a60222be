"""The `index` job (R4): put a committed turn's bubbles into the search index. Idempotent."""

from __future__ import annotations

import logging
from typing import Any

from django.utils import timezone

from conversations.models import OutboxJob
from conversations.outbox import payload_nodes
from search.index import index_conversation

logger = logging.getLogger("arbor.search")

GIVEN_UP_PER_SWEEP = 100


def run(payload: dict[str, Any]) -> None:
    index_conversation(int(payload["conversation"]), nodes=payload_nodes(payload))


def run_given_up() -> bool:
    """A worker sweep: run again the `index` jobs that ran out of attempts (a long outage, a worker that died on
    each), the longest-waiting first. A job after a turn looks at that turn's nodes only, so no later turn's job
    finds what one of them left. Each is marked done once it runs; one that fails again waits for the next sweep,
    behind the others. True if one ran."""
    ran = False
    given_up = OutboxJob.objects.filter(kind="index", status=OutboxJob.Status.FAILED)
    for job in given_up.order_by("run_after", "id")[:GIVEN_UP_PER_SWEEP]:
        try:
            run(job.payload)
        except Exception as error:  # recorded on the job, as the worker records a failure
            logger.warning("index job %s failed again in the sweep: %r", job.pk, error)
            given_up.filter(pk=job.pk).update(run_after=timezone.now(), last_error=repr(error)[:2000])
            continue
        ran = given_up.filter(pk=job.pk).update(status=OutboxJob.Status.DONE, last_error="") > 0 or ran
    return ran
