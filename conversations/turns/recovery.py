"""Calls a dead process left `pending` become `failed/interrupted`, keeping the text they had (T3, F1); tool
calls it left open get results that say they were not run (C4, T4, issue 12).

A process killed mid-turn (kill -9, a crash, a lost machine) leaves its node pending, with the partial
text the runner saved as it streamed (`records.save_partial`), and its turn lock to run out (a short
lease, `locks`). Whoever takes the lock next finds such nodes here: the next turn on the conversation
(`recover`, before it reads the head) and the worker's sweep (`sweep`, for conversations nobody writes
in again). They are failed as a stopped answer is, so the page shows them with Retry: the head moves to
the last turn node among them, as it would have had the turn failed in its process, unless a person
moved the head after the lease ran out (`TurnLock.took_over` tells).

A process killed between rounds leaves no pending node: its last node succeeded with tool calls, and the
results were never written (a tool's result lives in memory until the next round's node is written,
except an approved action's, stored with its decision the moment it ran: `calls.resolve`). The head has
not moved yet (it moves at the turn's end, T3): the question and its calls are off the path, or, when the
turn went on after a person's approval, the head is still the approved calls' node. Such calls are closed
as a turn stopped between rounds closes them (`Turn._fail`): a failed node of their own below the calls'
node, whose sent items are `calls.resolve` without running anything: a stored result is kept, every other
call gets an error result that says it was not run (C4). Nothing is run again, so an outward action whose
run was cut short never runs twice. A call that waits for a person's decision is not open in
this sense: its node is left as it is, decisions and all (F3, D4).

A title call runs outside the lock (in the worker); its pending node is swept once it is older than the
worker's lease, when its job has been handed to another worker.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from conversations import llm, locks, services
from conversations.errors import TurnInProgress
from conversations.locks import TurnLock, is_free
from conversations.models import Conversation, Node, TurnRun
from conversations.selectors import path_node
from conversations.turns import calls, log_stores, records
from conversations.turns.events import EventType, TurnEvent
from conversations.turns.log import TurnLog

logger = logging.getLogger("arbor.recovery")

INTERRUPTED = "the process running this call stopped before it ended; what had arrived is kept"
ROUND_INTERRUPTED = ("the process running this turn stopped before its tools' results were recorded; "
                     "they were not run again")
NOT_RUN = ("not run: the process running this turn stopped before this tool's result was recorded "
           "(if it had started, whether it finished is not known)")


def _interrupted(node: Node) -> llm.LLMError:
    return llm.LLMError(Node.FailureReason.INTERRUPTED, INTERRUPTED, partial=node.received)


def recover(conversation: Conversation, lock: TurnLock) -> list[int]:
    """With the lock held: fail every call left pending on `conversation` (none can be running), close the
    tool calls a dead round left open, and end the runs nobody runs any more; return the nodes failed."""
    stale = list(Node.objects.of(conversation).filter(status=Node.Status.PENDING)
                 .exclude(kind=Node.Kind.TITLE).order_by("pk"))
    with transaction.atomic():
        failed = [node for node in stale if records.interrupt(node, _interrupted(node))]
        turn_nodes = [node for node in failed if node.kind == Node.Kind.TURN]
        for node in turn_nodes:
            records.error_bubble(node, _interrupted(node))
        closing = _close_open_calls(conversation)
        if closing is not None:
            failed.append(closing)
            turn_nodes.append(closing)
        if turn_nodes:
            if lock.took_over:
                services.head_move_held(conversation=conversation, to=turn_nodes[-1].pk, lock=lock)
            records.committed(conversation)  # R4: its question is searchable like a failed turn's
    _end_runs(TurnRun.objects.filter(owner_id=conversation.owner_id, conversation=conversation,
                                     ended_at__isnull=True).exclude(pk=lock.token),
              node=turn_nodes[-1].pk if turn_nodes else None, head=conversation.head_id)
    if failed:
        logger.warning("conversation %s: %d node(s) failed as interrupted (calls left pending, or tool calls "
                       "left open, by a stopped process): %s", conversation.pk, len(failed),
                       [node.pk for node in failed])
    return [node.pk for node in failed]


def _close_open_calls(conversation: Conversation) -> Node | None:
    """If the conversation's last turn node succeeded with tool calls that have no results and wait for no
    person (its process died between rounds), record their results in a failed node below it, as
    `Turn._fail` does for a turn stopped between rounds; return that node.

    Only the last turn node can be left so: each round's node is newer than the one whose calls it
    answers, and a node is written only under the lock, which the dead process held till now.
    """
    last = Node.objects.of(conversation).filter(kind=Node.Kind.TURN).order_by("-pk").first()
    if last is None or last.status != Node.Status.SUCCEEDED:
        return None
    tip = path_node(last)
    if not calls.open_calls(tip) or calls.undecided(tip, owner=conversation.owner_id):
        return None  # answered with text, or waiting for a person: a state of its own, left alone (F3)
    error = llm.LLMError(Node.FailureReason.INTERRUPTED, ROUND_INTERRUPTED)
    # Runs nothing; a stored result is kept.
    results = calls.resolve(tip, run=False, owner_id=conversation.owner_id, note=NOT_RUN)
    node = records.start(conversation=conversation, parent=tip, kind=Node.Kind.TURN, sent=results,
                         model=last.model, instructions=last.instructions, keep_ephemeral=last.keep_ephemeral)
    records.result_bubbles(last.pk, results, owner=conversation.owner_id)
    records.fail(node, error)
    records.error_bubble(node, error)
    return node


def _end_runs(runs, *, node: int | None = None, head: int | None = None) -> None:
    """Runs whose process is gone end with an `interrupted` error, so their readers stop following."""
    for run in runs:
        # Numbered after the run's last event wherever the log is kept: on Redis the database holds none of them,
        # and an ending numbered 1 was refused by Redis and never reached a reader (issue 34).
        kept = log_stores.store().read(run.pk, 0, owner=run.owner_id)
        writer = TurnLog(run.pk, owner=run.owner_id, after=max(kept[-1][0] if kept else 0,
                                           run.entries.aggregate(last=Max("seq"))["last"] or 0))
        writer.append(TurnEvent(EventType.ERROR, {"code": Node.FailureReason.INTERRUPTED, "message": INTERRUPTED,
                                                  "node": node, "head": head}))
        writer.close()


def sweep() -> list[int]:
    """Recover every conversation whose lock has run out with calls still pending, or that a holder left
    without giving its lock back (it may have died between rounds, leaving tool calls open and nothing
    pending); end runs whose turn never began or whose process is gone; fail stale title calls. One
    conversation's trouble is logged and the others go on (a database outage is raised: the worker waits
    it out)."""
    recovered: list[int] = []
    stranded = set(Node.objects.filter(status=Node.Status.PENDING).exclude(kind=Node.Kind.TITLE)
                   .filter(conversation__in=Conversation.objects.filter(is_free()))
                   .values_list("conversation_id", flat=True).distinct())
    stranded |= set(Conversation.objects.filter(locks.left_unreleased()).values_list("pk", flat=True))
    for conversation_id in sorted(stranded):
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
    _end_runs(TurnRun.objects.filter(locks.run_lock_gone(), ended_at__isnull=True, started_at__lt=lease_ago))
    cutoff = timezone.now() - timedelta(seconds=settings.ARBOR_WORKER_LEASE_SECONDS)
    for node in Node.objects.filter(status=Node.Status.PENDING, kind=Node.Kind.TITLE, created_at__lt=cutoff):
        if records.interrupt(node, _interrupted(node)):
            recovered.append(node.pk)
    return recovered
