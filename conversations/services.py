"""Writes. `head_move` is the one function that moves a conversation's head."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from conversations.errors import BadInput, TurnInProgress
from conversations.models import Bubble, Conversation, Node, OutboxJob, ToolApproval

_NODE = Node._meta.db_table


def _lock_is_free() -> Q:
    return Q(turn_token__isnull=True) | Q(turn_expires_at__lt=timezone.now())


def head_move(*, conversation: Conversation, to: int | None, turn_token: uuid.UUID | None = None) -> None:
    """Move the head (T2, T9, R3): refused while another turn holds the conversation.

    The check and the move are one UPDATE, so a stale or concurrent caller cannot slip in between.
    """
    guard = Q(turn_token=turn_token) if turn_token else _lock_is_free()
    moved = (
        Conversation.objects.filter(guard, pk=conversation.pk)
        .update(head_id=to, version=F("version") + 1, updated_at=timezone.now())
    )
    if not moved:
        raise TurnInProgress()
    conversation.head_id = to
    conversation.version += 1


def turn_lock_acquire(*, conversation: Conversation) -> uuid.UUID:
    """Take the conversation's turn lock in the database (R3); it expires if its holder dies."""
    token = uuid.uuid4()
    expires = timezone.now() + timedelta(seconds=settings.ARBOR_TURN_LOCK_SECONDS)
    taken = Conversation.objects.filter(_lock_is_free(), pk=conversation.pk).update(
        turn_token=token, turn_expires_at=expires
    )
    if not taken:
        raise TurnInProgress()
    conversation.turn_token, conversation.turn_expires_at = token, expires
    return token


def turn_lock_renew(*, conversation: Conversation, token: uuid.UUID) -> None:
    expires = timezone.now() + timedelta(seconds=settings.ARBOR_TURN_LOCK_SECONDS)
    Conversation.objects.filter(pk=conversation.pk, turn_token=token).update(turn_expires_at=expires)


def turn_lock_release(*, conversation: Conversation, token: uuid.UUID) -> None:
    Conversation.objects.filter(pk=conversation.pk, turn_token=token).update(turn_token=None, turn_expires_at=None)
    conversation.turn_token = conversation.turn_expires_at = None


def conversation_create(*, owner, title: str = "", model: str = "", instructions: str = "") -> Conversation:
    return Conversation.objects.create(
        owner=owner, title=title, model=model or settings.ARBOR_MODEL, instructions=instructions
    )


def conversation_update(*, conversation: Conversation, **fields: Any) -> Conversation:
    allowed = {"title", "model", "instructions"}
    unknown = set(fields) - allowed
    if unknown:
        raise BadInput(f"Unknown fields: {', '.join(sorted(unknown))}.")
    for name, value in fields.items():
        setattr(conversation, name, value)
    conversation.save(update_fields=[*fields, "updated_at"])
    return conversation


@transaction.atomic
def conversation_clear(*, conversation: Conversation) -> None:
    """T11: the head and the bubbles go together, so nothing 'deleted' is still remembered."""
    head_move(conversation=conversation, to=None)
    Bubble.objects.filter(conversation=conversation).delete()


def _nodes_others_need(conversation: Conversation) -> set[int]:
    """Nodes of this conversation that another conversation's tree still passes through (T11, P3).

    Start where another conversation touches this one's nodes (its head on one, a node of its own hung
    below one, a compaction of its own made from one), then walk up parents and compaction originals
    (C3). Every step is an indexed look-up: the cost follows this conversation, not the table.
    """
    sql = f"""
    WITH RECURSIVE seeds(id) AS (
        SELECT c.head_id FROM {Conversation._meta.db_table} c JOIN {_NODE} h ON h.id = c.head_id
        WHERE h.conversation_id = %s AND c.id != %s
        UNION
        SELECT n.parent_id FROM {_NODE} n JOIN {_NODE} p ON p.id = n.parent_id
        WHERE p.conversation_id = %s AND (n.conversation_id IS NULL OR n.conversation_id != %s)
        UNION
        SELECT n.compacted_from_id FROM {_NODE} n JOIN {_NODE} o ON o.id = n.compacted_from_id
        WHERE o.conversation_id = %s AND (n.conversation_id IS NULL OR n.conversation_id != %s)
    ),
    edge(which) AS (SELECT 0 UNION ALL SELECT 1),
    needed(id) AS (
        SELECT id FROM seeds
        UNION
        SELECT CASE edge.which WHEN 0 THEN x.parent_id ELSE x.compacted_from_id END
        FROM needed JOIN {_NODE} x ON x.id = needed.id CROSS JOIN edge
        WHERE CASE edge.which WHEN 0 THEN x.parent_id ELSE x.compacted_from_id END IS NOT NULL
    )
    SELECT n.id FROM {_NODE} n JOIN needed ON n.id = needed.id WHERE n.conversation_id = %s
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [conversation.pk] * 7)
        return {row[0] for row in cursor.fetchall()}


@transaction.atomic
def conversation_delete(*, conversation: Conversation) -> None:
    """T11: delete the conversation, its bubbles and its nodes, except nodes another path needs."""
    locked = Conversation.objects.select_for_update().filter(_lock_is_free(), pk=conversation.pk)
    if not locked.exists():
        raise TurnInProgress()
    keep = _nodes_others_need(conversation)
    doomed = list(Node.objects.filter(conversation=conversation).exclude(id__in=keep).values_list("id", flat=True))
    conversation.delete()  # bubbles cascade; kept nodes lose their creator (SET_NULL)
    # The database's deferred foreign keys check at commit that no surviving node lost its parent.
    Node.objects.filter(id__in=doomed).delete()


def approval_record(*, node: Node, call_id: str, approved: bool, user) -> ToolApproval:
    return ToolApproval.objects.create(node=node, call_id=call_id, approved=approved, decided_by=user)


def outbox_add(*, kind: str, payload: dict[str, Any]) -> OutboxJob:
    """Queue post-commit work (R4); called inside the turn's transaction so it commits with it."""
    return OutboxJob.objects.create(kind=kind, payload=payload)
