"""Hybrid retrieval (R2, issue 18): the hits the turn runner attaches to a question, from the owner's other
conversations, every branch. Registered with `conversations.retrieval` when the app is ready.

Two rankings are fused: full-text (any of the question's words) and the embedding model's nearest chunks (at
least ARBOR_RETRIEVAL_MIN_SIMILARITY), by relative score fusion: each ranking's scores scaled to 0..1 between
its worst and best hit, weighted (vectors VECTOR_WEIGHT, words the rest) and added up per bubble. A bubble
found by both rises; one found by either still counts. Chosen by `manage.py bench_retrieval` over reciprocal
rank fusion, whose 1 / (60 + rank) barely tells a first hit from a twelfth (the README has the figures).
When the embedding call fails (the provider is down) the question goes with the full-text hits alone:
retrieval never stops a question.
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
# A question waits for its retrieval: an embedding provider that hangs costs it this much at most, then words.
EMBEDDING_TIMEOUT_SECONDS = 3.0
# Of the fused score; the words' is the rest. bench_retrieval's recall@5 is flat from 0.65 to 0.8 (three seeds).
VECTOR_WEIGHT = 0.7

logger = logging.getLogger("arbor.retrieval")


# English words that say nothing about a topic: a question's "how", "the" and "for" would match everything.
STOPWORDS = frozenset("""about all also and any are can could did does for from had has have her his how into its may
might must not our out she should that the their them then there these they this those too was were what when where
which who whom why will with would you your""".split())  # noqa: SIM905 - a list of 60 words reads better as text


def retrieval_query(question: str) -> str:
    """The question's first distinct words that say something, as many as fit a search query."""
    found = list(dict.fromkeys(w for w in re.findall(r"\w+", question.lower())
                               if len(w) > 2 and w not in STOPWORDS))[:QUERY_WORDS]
    while len(" ".join(found)) > words.MAX_QUERY_CHARS:
        found.pop()
    return " ".join(found)


def word_hits(*, user, question: str, limit: int, exclude_conversation: int | None) -> list[words.Hit]:
    query = retrieval_query(question)
    return words.search_bubbles(user=user, query=query, match_any=True, limit=limit,
                                exclude_conversation=exclude_conversation, shown=False) if query else []


def vector_hits(*, user, question: str, limit: int, exclude_conversation: int | None) -> list[words.Hit]:
    return nearest_bubbles(user=user, text=question, limit=limit, exclude_conversation=exclude_conversation,
                           shown=False, timeout=EMBEDDING_TIMEOUT_SECONDS)


def fuse(rankings: Sequence[tuple[Sequence[words.Hit], float]]) -> list[words.Hit]:
    """Relative score fusion of (hits, weight) rankings: a bubble's score is the sum over the rankings of weight
    times its score scaled to 0..1 between the ranking's lowest and highest (1 when they are equal)."""
    scores: dict[int, float] = {}
    first: dict[int, words.Hit] = {}
    for hits, weight in rankings:
        if not hits:
            continue
        low, high = min(h.rank for h in hits), max(h.rank for h in hits)
        for hit in hits:
            scaled = (hit.rank - low) / (high - low) if high > low else 1.0
            scores[hit.bubble] = scores.get(hit.bubble, 0.0) + weight * scaled
            first.setdefault(hit.bubble, hit)
    return [first[bubble] for bubble in sorted(scores, key=lambda b: (-scores[b], -b))]


def hybrid_hits(*, user, question: str, limit: int, exclude_conversation: int | None = None) -> list[words.Hit]:
    """Full-text and vector hits fused; the full-text ones alone when the embedding call fails."""
    found = [(word_hits(user=user, question=question, limit=CANDIDATES, exclude_conversation=exclude_conversation),
              1.0 - VECTOR_WEIGHT)]
    try:
        found.append((vector_hits(user=user, question=question, limit=CANDIDATES,
                                  exclude_conversation=exclude_conversation), VECTOR_WEIGHT))
    except Exception as error:  # the embedding provider is down or refused: words still find something
        logger.warning("vector retrieval failed, full-text only: %r", error)
    return fuse(found)[:limit]


def find_hits(conversation: Conversation, question: str, limit: int) -> list[Hit]:
    found = hybrid_hits(user=conversation.owner, question=question, limit=limit,
                        exclude_conversation=conversation.pk)
    return [Hit(bubble=h.bubble, conversation=h.conversation, conversation_title=h.conversation_title, role=h.role,
                start=h.start) for h in found]
