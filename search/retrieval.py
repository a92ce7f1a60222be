"""Full-text retrieval (R2): the hits the turn runner attaches to a question, from the owner's other
conversations. Registered with `conversations.retrieval` when the app is ready."""

from __future__ import annotations

import re

from conversations.models import Conversation
from conversations.retrieval import Hit
from search.query import MAX_QUERY_CHARS, search_bubbles

QUERY_WORDS = 30  # the question's first distinct words make the query: a long question stays one cheap search


def retrieval_query(question: str) -> str:
    """The question's first distinct words, as many as fit a search query."""
    words = list(dict.fromkeys(w for w in re.findall(r"\w+", question.lower()) if len(w) > 2))[:QUERY_WORDS]
    while len(" ".join(words)) > MAX_QUERY_CHARS:
        words.pop()
    return " ".join(words)


def find_hits(conversation: Conversation, question: str, limit: int) -> list[Hit]:
    query = retrieval_query(question)
    if not query:
        return []
    found = search_bubbles(user=conversation.owner, query=query, match_any=True, limit=limit,
                           exclude_conversation=conversation.pk)
    return [Hit(bubble=h.bubble, conversation=h.conversation, conversation_title=h.conversation_title, role=h.role)
            for h in found]
