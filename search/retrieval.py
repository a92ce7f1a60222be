"""Hybrid retrieval (R2, issue 18): the hits the turn runner attaches to a question, from the owner's other
conversations, every branch. Registered with `conversations.retrieval` when the app is ready.

Two rankings are fused by reciprocal rank fusion: full-text (any of the question's words) and the embedding
model's nearest chunks (at least ARBOR_RETRIEVAL_MIN_SIMILARITY). A bubble found by both rises; one found by
either still counts. When the embedding call fails (the provider is down) the question goes with the
full-text hits alone: retrieval never stops a question.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from conversations.models import Conversation
from conversations.retrieval import Hit
from search import query as words
from search.similar import nearest_bubbles

QUERY_WORDS = 30  # the question's first distinct words make the query: a long question stays one cheap search
CANDIDATES = 20  # from each ranking, before fusion
RRF_K = 60  # reciprocal rank fusion's constant (Cormack et al. 2009): 1 / (RRF_K + rank)

logger = logging.getLogger("arbor.retrieval")


def retrieval_query(question: str) -> str:
    """The question's first distinct words, as many as fit a search query."""
    found = list(dict.fromkeys(w for w in re.findall(r"\w+", question.lower()) if len(w) > 2))[:QUERY_WORDS]
    while len(" ".join(found)) > words.MAX_QUERY_CHARS:
        found.pop()
    return " ".join(found)


def word_hits(*, user, question: str, limit: int, exclude_conversation: int | None) -> list[words.Hit]:
    query = retrieval_query(question)
    return words.search_bubbles(user=user, query=query, match_any=True, limit=limit,
                                exclude_conversation=exclude_conversation) if query else []


def vector_hits(*, user, question: str, limit: int, exclude_conversation: int | None) -> list[words.Hit]:
    return nearest_bubbles(user=user, text=question, limit=limit, exclude_conversation=exclude_conversation)


def fuse(rankings: Sequence[Sequence[words.Hit]]) -> list[words.Hit]:
    """Reciprocal rank fusion: each bubble scores the sum of 1 / (RRF_K + its rank) over the rankings."""
    scores: dict[int, float] = {}
    first: dict[int, words.Hit] = {}
    for ranking in rankings:
        for rank, hit in enumerate(ranking, start=1):
            scores[hit.bubble] = scores.get(hit.bubble, 0.0) + 1.0 / (RRF_K + rank)
            first.setdefault(hit.bubble, hit)
    return [first[bubble] for bubble in sorted(scores, key=lambda b: (-scores[b], -b))]


def hybrid_hits(*, user, question: str, limit: int, exclude_conversation: int | None = None) -> list[words.Hit]:
    """Full-text and vector hits fused; the full-text ones alone when the embedding call fails."""
    found = [word_hits(user=user, question=question, limit=CANDIDATES, exclude_conversation=exclude_conversation)]
    try:
        found.append(vector_hits(user=user, question=question, limit=CANDIDATES,
                                 exclude_conversation=exclude_conversation))
    except Exception as error:  # the embedding provider is down or refused: words still find something
        logger.warning("vector retrieval failed, full-text only: %r", error)
    return fuse(found)[:limit]


def find_hits(conversation: Conversation, question: str, limit: int) -> list[Hit]:
    found = hybrid_hits(user=conversation.owner, question=question, limit=limit,
                        exclude_conversation=conversation.pk)
    return [Hit(bubble=h.bubble, conversation=h.conversation, conversation_title=h.conversation_title, role=h.role,
                start=h.start) for h in found]
