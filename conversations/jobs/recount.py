"""Recount a conversation's tokens for its model (C1), after a model switch: a worker job.

Every node keeps its own count and its path's (`Node.tokens`, `Node.path_tokens`), counted when it was written
for the model of that moment. Tokenizers differ (a conversation switched from a local model to Claude may
count a fifth more), so once the model changes, every node of the conversation is counted again for it, parents
first, and its path's count rebuilt. Idempotent; a job for a model the conversation no longer has does nothing
(the job of the later switch does the work).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from conversations import budget
from conversations.models import Conversation, Node

_BATCH = 1000


def run(payload: dict[str, Any]) -> None:
    conversation = Conversation.objects.filter(pk=payload["conversation"], model=payload["model"]).first()
    if conversation is None:  # gone, or its model changed again: that change queued its own recount
        return
    recount(conversation, model=conversation.effective_model)


def recount(conversation: Conversation, *, model: str) -> int:
    """Count every node of the conversation for `model`; return how many counts changed."""
    rows = list(Node.objects.of(conversation).order_by("id")
                .values_list("id", "parent_id", "sent", "received", "tokens", "path_tokens"))
    own = {pk: budget.node_tokens(sent or [], received or [], model=model) for pk, _, sent, received, _, _ in rows}
    parents = {pk: parent for pk, parent, *_ in rows}
    path: dict[int, int] = {}
    for start in parents:  # each chain walked up to a node already done, then filled in downwards
        chain, pk = [], start
        while pk not in path:
            parent = parents[pk]
            if parent is None or parent not in parents:
                # A root, or a parent outside this conversation (a node another one shares): its stored count.
                outside = Node.objects.values_list("path_tokens", flat=True).get(pk=parent) if parent else 0
                path[pk] = own[pk] + outside
                break
            chain.append(pk)
            pk = parent
        for child in reversed(chain):
            path[child] = own[child] + path[parents[child]]
    changed = [Node(pk=pk, tokens=own[pk], path_tokens=path[pk])
               for pk, _, _, _, tokens, path_tokens in rows if (own[pk], path[pk]) != (tokens, path_tokens)]
    with transaction.atomic():
        Node.objects.bulk_update(changed, ["tokens", "path_tokens"], batch_size=_BATCH)
    return len(changed)
