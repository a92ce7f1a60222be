"""Retrieval (R2): before a question goes out, the owner's other conversations are searched for it and the
best hits go along as items marked ephemeral. The call that sends them reads them; later assemblies drop
them unless the conversation keeps them (`keep_retrieved`). They are stored in the node's sent items like
everything a call was sent, so "what the model saw" shows them.
"""

from __future__ import annotations

import logging
import re

from django.conf import settings

from conversations import items as it
from conversations.models import Bubble, Conversation

RETRIEVED_CHARS = 800  # per hit: enough for the gist, never a whole other conversation
QUERY_WORDS = 30  # the question's first distinct words make the query: a long question stays one cheap search

logger = logging.getLogger("arbor.retrieval")


def retrieval_query(question: str) -> str:
    """The question's first distinct words, as many as fit a search query."""
    from search.query import MAX_QUERY_CHARS

    words = list(dict.fromkeys(w for w in re.findall(r"\w+", question.lower()) if len(w) > 2))[:QUERY_WORDS]
    while len(" ".join(words)) > MAX_QUERY_CHARS:
        words.pop()
    return " ".join(words)


def retrieved_items(conversation: Conversation, question: str) -> list[it.Item]:
    """The best hits for `question` in the owner's other conversations, as ephemeral items.

    Retrieval helps a call; it never stops one: if the search fails, the question goes without it.
    """
    from search.query import search_bubbles  # the search app builds on this one

    query = retrieval_query(question)
    if not query:
        return []
    try:
        hits = search_bubbles(user=conversation.owner, query=query, match_any=True,
                              limit=settings.ARBOR_RETRIEVAL_RESULTS, exclude_conversation=conversation.pk)
    except Exception:
        logger.exception("retrieval failed for conversation %s; the question goes without it", conversation.pk)
        return []
    if not hits:
        return []
    contents = dict(Bubble.objects.filter(pk__in=[h.bubble for h in hits]).values_list("pk", "content"))
    items = []
    for hit in hits:
        text = contents.get(hit.bubble, "")[:RETRIEVED_CHARS]
        who = "the person asked" if hit.role == "user" else "the answer was"
        item = it.system(f"From the person's conversation “{hit.conversation_title}”, {who}: {text}")
        items.append({**item, "ephemeral": True, "source": {"conversation": hit.conversation, "bubble": hit.bubble}})
    return items
