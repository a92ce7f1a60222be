"""Calls a dead process left `pending` become `failed/interrupted`, keeping the text they had (T3, F1).

A process killed mid-turn (kill -9, a crash, a lost machine) leaves its node pending, with the partial
text the runner saved as it streamed (`records.save_partial`), and its turn lock to run out (a short
lease, `locks`). Whoever takes the lock next finds such nodes here: the next turn on the conversation
(`recover`, before it reads the head) and the worker's sweep (`sweep`, for conversations nobody writes
in again). They are failed as a stopped answer is, so the page shows them with Retry: the head moves to
the last turn node among them, as it would have had the turn failed in its process, unless a person
moved the head after the lease ran out (`TurnLock.took_over` tells).

A title call runs outside the lock (in the worker); its pending node is swept once it is older than the
worker's lease, when its job has been handed to another worker.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Max, Q
from django.utils import timezone

from conversations import llm, locks, services
from conversations.errors import TurnInProgress
from conversations.locks import TurnLock, is_free
from conversations.models import Conversation, Node, TurnRun
from conversations.turns import records
from conversations.turns.events import EventType, TurnEvent
from conversations.turns.log import TurnLog

logger = logging.getLogger("arbor.recovery")

INTERRUPTED = "the process running this call stopped before it ended; what had arrived is kept"


def _interrupted(node: Node) -> llm.LLMError:
    return llm.LLMError(Node.FailureReason.INTERRUPTED, INTERRUPTED, partial=node.received)


def recover(conversation: Conversation, lock: TurnLock) -> list[int]:
    """With the lock held: fail every call left pending on `conversation` (none can be running) and end
    the runs nobody runs any more; return the nodes failed."""
    stale = list(Node.objects.filter(conversation=conversation, status=Node.Status.PENDING)
                 .exclude(kind=Node.Kind.TITLE).order_by("pk"))
    with transaction.atomic():
        failed = [node for node in stale if records.interrupt(node, _interrupted(node))]
        turn_nodes = [node for node in failed if node.kind == Node.Kind.TURN]
        for node in turn_nodes:
            records.error_bubble(node, _interrupted(node))
        if turn_nodes:
            if lock.took_over:
                services.head_move_held(conversation=conversation, to=turn_nodes[-1].pk, lock=lock)
            records.committed(conversation)  # R4: its question is searchable like a failed turn's
    _end_runs(TurnRun.objects.filter(conversation=conversation, ended_at__isnull=True).exclude(pk=lock.token),
              node=turn_nodes[-1].pk if turn_nodes else None, head=conversation.head_id)
    if failed:
        logger.warning("conversation %s: %d call(s) left pending by a stopped process marked interrupted: %s",
                       conversation.pk, len(failed), [node.pk for node in failed])
    return [node.pk for node in failed]


def _end_runs(runs, *, node: int | None = None, head: int | None = None) -> None:
    """Runs whose process is gone end with an `interrupted` error, so their readers stop following."""
    for run in runs:
        writer = TurnLog(run.pk, after=run.entries.aggregate(last=Max("seq"))["last"] or 0)
        writer.append(TurnEvent(EventType.ERROR, {"code": Node.FailureReason.INTERRUPTED, "message": INTERRUPTED,
                                                  "node": node, "head": head}))
        writer.close()


def sweep() -> list[int]:
    """Recover every conversation whose lock has run out with calls still pending; end runs whose turn
    never began or whose process is gone; fail stale title calls. One conversation's trouble is logged and
    the others go on (a database outage is raised: the worker waits it out)."""
    recovered: list[int] = []
    stranded = (Node.objects.filter(status=Node.Status.PENDING).exclude(kind=Node.Kind.TITLE)
                .filter(conversation__in=Conversation.objects.filter(is_free()))
                .values_list("conversation_id", flat=True).distinct())
    for conversation_id in list(stranded):
        conversation = Conversation.objects.filter(pk=conversation_id).first()
        if conversation is None:
            continue  # deleted meanwhile
        try:
            lock = TurnLock.acquire(conversation)
        except TurnInProgress:
            continue  # a new turn took it first and recovers them itself
        with lock:
            recovered += recover(conversation, lock)
    lease_ago = timezone.now() - timedelta(seconds=settings.ARBOR_TURN_LOCK_SECONDS)
    _end_runs(TurnRun.objects.filter(ended_at__isnull=True, started_at__lt=lease_ago).filter(
        Q(conversation__turn_token__isnull=True) | ~Q(conversation__turn_token=F("pk"))
        | Q(conversation__turn_expires_at__lt=locks.now())))
    cutoff = timezone.now() - timedelta(seconds=settings.ARBOR_WORKER_LEASE_SECONDS)
    for node in Node.objects.filter(status=Node.Status.PENDING, kind=Node.Kind.TITLE, created_at__lt=cutoff):
        if records.interrupt(node, _interrupted(node)):
            recovered.append(node.pk)
    return recovered
