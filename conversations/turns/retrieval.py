"""Retrieval (R2): before a question goes out, the owner's other conversations are searched for it and the
best hits go along as items marked ephemeral. The call that sends them reads them; later assemblies drop
them unless the conversation keeps them (`keep_retrieved`). They are stored in the node's sent items like
everything a call was sent, so "what the model saw" shows them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple

from django.conf import settings

from conversations import items as it
from conversations.models import Bubble, Conversation

RETRIEVED_CHARS = 800  # per hit: enough for the gist, never a whole other conversation

logger = logging.getLogger("arbor.retrieval")


class Hit(NamedTuple):
    """One earlier utterance found for a question: which bubble, of which conversation, said by whom."""

    bubble: int
    conversation: int
    conversation_title: str
    role: str
    start: int = 0  # where in the bubble's text the found part starts (a long bubble's chunk)


Retriever = Callable[[Conversation, str, int], list[Hit]]
_retrievers: list[Retriever] = []


def register_retriever(retriever: Retriever) -> None:
    """Let another app find hits: `retriever(conversation, question, limit)`. The search app registers one."""
    if retriever not in _retrievers:
        _retrievers.append(retriever)


def retrieved_items(conversation: Conversation, question: str) -> list[it.Item]:
    """The best hits for `question` in the owner's other conversations, as ephemeral items.

    Retrieval helps a call; it never stops one: if a retriever fails, the question goes without it.
    """
    hits: list[Hit] = []
    for retriever in _retrievers:
        try:
            hits += retriever(conversation, question, settings.ARBOR_RETRIEVAL_RESULTS)
        except Exception:
            logger.exception("retrieval failed for conversation %s; the question goes without it", conversation.pk)
    if not hits:
        return []
    contents = dict(Bubble.objects.filter(pk__in=[h.bubble for h in hits]).values_list("pk", "content"))
    items, sent = [], set()
    for hit in hits:
        text = contents.get(hit.bubble, "")[hit.start:hit.start + RETRIEVED_CHARS]
        if not text.strip() or " ".join(text.split()) in sent:  # the same words once a call (issue 26)
            continue
        sent.add(" ".join(text.split()))
        who = "the person asked" if hit.role == "user" else "the answer was"
        item = it.system(f"From the person's conversation “{hit.conversation_title}”, {who}: {text}")
        items.append({**item, "ephemeral": True, "source": {"conversation": hit.conversation, "bubble": hit.bubble}})
    return items
